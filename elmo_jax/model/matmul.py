"""Matmuls in the compute dtype with float32 accumulation and float32 results (mixed precision:
bfloat16 operands run on the accelerators' fast units; everything around them stays float32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def einsum(spec: str, x: jax.Array, w: jax.Array, dtype: str = "float32") -> jax.Array:
    return jnp.einsum(spec, x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def matmul(x: jax.Array, w: jax.Array, dtype: str = "float32") -> jax.Array:
    return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)
