"""elmo_jax: ELMo (Peters et al. 2018) in JAX."""

__version__ = "0.1.0"
