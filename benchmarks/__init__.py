"""Measurements of elmo_jax, run from the repository root as modules (README.md here)."""
