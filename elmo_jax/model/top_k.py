"""`lax.top_k`'s indices of a long vector without sorting it. On GPUs XLA's top_k of k = 8192
out of LM1B's 793k words falls back from CUB to a sort of the whole vector; here the k-th
largest value is found 4 bits at a time (8 counting passes of 16 candidates, each one fused
reduction; why 4 bits: docs/archive/PERFORMANCE_LOG.md, "Where the measured H200 step goes"), the k
above it are gathered in index order, and only those k are sorted. The same indices as
`lax.top_k`, ties by lower index."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from elmo_jax.model.backend import backend

# Bits of the k-th largest key set per counting pass: each pass compares every key with 2 **
# DIGIT_BITS candidates, and 32 / DIGIT_BITS passes run one after another.
DIGIT_BITS = 4


def top_k_indices(x: jax.Array, k: int) -> jax.Array:
    """Indices (k,) int32 of the k largest of x (n,) float32, largest first, equal values by
    lower index: `lax.top_k(x, k)[1]`, which the CPU keeps (it selects without a full sort)."""
    if not 0 < k <= x.shape[0]:
        raise ValueError(f"top {k} of {x.shape[0]} values")
    if backend() == "cpu":
        return jax.lax.top_k(x, k)[1]
    keys = _ordered_keys(x)
    threshold = _kth_largest(keys, k)
    above, tied = keys > threshold, keys == threshold
    before = jnp.cumsum(jnp.stack([above, tied]), axis=1, dtype=jnp.int32)  # (2, n): both in one scan
    room = k - before[0, -1]  # for the values equal to the threshold: the first `room` of them
    take = above | (tied & (before[1] <= room))
    slots = jnp.where(take, before[0] + jnp.minimum(before[1], room) - 1, k)
    ids = jnp.zeros(k, jnp.int32).at[slots].set(jnp.arange(x.shape[0], dtype=jnp.int32), mode="drop")
    _, ids = jax.lax.sort((~keys[ids], ids), num_keys=1, is_stable=True)  # largest first; ids ascend
    return ids


def _ordered_keys(x: jax.Array) -> jax.Array:
    """float32 -> uint32 in the same order (negatives: all bits flipped; others: sign bit set)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


def _kth_largest(keys: jax.Array, k: int) -> jax.Array:
    """The k-th largest of `keys` (uint32): the largest t with at least k keys >= t, set a digit
    of DIGIT_BITS at a time from the top (each digit: how many keys reach each of its values)."""
    t = jnp.uint32(0)
    for shift in range(32 - DIGIT_BITS, -1, -DIGIT_BITS):
        candidates = t | (jnp.arange(1 << DIGIT_BITS, dtype=jnp.uint32) << shift)
        reach = jnp.sum(keys[None, :] >= candidates[:, None], axis=1)  # (2 ** DIGIT_BITS,), falling
        t = candidates[jnp.sum(reach >= k) - 1]
    return t
