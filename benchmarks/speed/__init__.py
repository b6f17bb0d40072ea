"""Speed and memory: train-step and embedding throughput, where a step's time goes, the compiled
program's loops and collectives, the input pipeline, and embedding against AllenNLP."""
