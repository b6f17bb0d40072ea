"""Matmuls in the compute dtype with float32 accumulation and float32 results (mixed precision:
bfloat16 operands run on the accelerators' fast units; everything around them stays float32).

XLA on CPU has no bfloat16 x bfloat16 -> float32 dot: there the product is computed in
bfloat16 (XLA accumulates it in float32 internally) and rounded to bfloat16 before widening.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from elmo_jax.model.backend import backend


def result_type(dtype: str):
    """The preferred_element_type of a dot or convolution with `dtype` operands."""
    return jnp.float32 if dtype == "float32" or backend() != "cpu" else None


def einsum(spec: str, x: jax.Array, w: jax.Array, dtype: str = "float32") -> jax.Array:
    return jnp.einsum(spec, x.astype(dtype), w.astype(dtype), preferred_element_type=result_type(dtype)).astype(
        jnp.float32
    )


def matmul(x: jax.Array, w: jax.Array, dtype: str = "float32") -> jax.Array:
    return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=result_type(dtype)).astype(jnp.float32)
