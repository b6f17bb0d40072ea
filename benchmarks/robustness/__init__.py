"""Robustness: kills and damaged checkpoints injected into training runs, and long soak runs."""
