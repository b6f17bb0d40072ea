"""Runnable examples: `python -m elmo_jax.examples.NAME`."""
