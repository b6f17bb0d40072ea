"""Parity with the original code: AllenNLP's ELMo outputs, bilm-tf's dropout law, training steps
and learning curves, side by side with ours."""
