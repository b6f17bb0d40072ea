"""Inverted dropout as bilm-tf's `DropoutWrapper` applies it: masks drawn per element, kept
elements scaled by 1 / (1 - rate)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dropout_keep_masks(rng: jax.Array, rate: float, n: int, shape: tuple[int, ...]) -> jax.Array:
    """n independent keep masks (n, *shape), each element True with probability 1 - rate."""
    return jnp.stack([jax.random.bernoulli(jax.random.fold_in(rng, i), 1.0 - rate, shape) for i in range(n)])


def apply_dropout(keep: jax.Array, x: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout: zero where `keep` is False, scale the rest by 1 / (1 - rate)."""
    return jnp.where(keep, x / (1.0 - rate), 0.0)
