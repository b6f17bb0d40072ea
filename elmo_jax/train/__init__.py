"""Training: the train state and step, the loop, data parallelism, checkpoints, evaluation, fine-tuning."""
