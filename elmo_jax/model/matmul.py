"""Matmuls in the compute dtype with float32 accumulation and float32 results (mixed precision:
bfloat16 operands run on the accelerators' fast units; everything around them stays float32).

XLA on CPU has no bfloat16 x bfloat16 -> float32 dot: there the product is computed in
bfloat16 (XLA accumulates it in float32 internally) and rounded to bfloat16 before widening.

XLA on CPU computes bfloat16 arithmetic in float32 and, allowed excess precision (its default),
may drop the roundings in between (jaxlib 0.10 drops a convert to bfloat16 and back; 0.12 does
not): there these products and the LSTM's loops round with an op that XLA keeps (`narrow`,
`widened`), so that the program computes the same on every jaxlib. On accelerators they are
plain casts: the H200's program is the same either way, and a TPU's would move 0.65 GB more a
step (elmo-jax plan, 1 x 512 rows in bfloat16).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from elmo_jax.model.backend import backend


def _kept(x: jax.Array, dtype) -> jax.Array:
    """x rounded to `dtype`'s precision, in x's dtype, by an op that XLA keeps (on CPU, above)."""
    if backend() != "cpu":
        return x
    info = jnp.finfo(dtype)
    return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def narrow(x: jax.Array, dtype) -> jax.Array:
    """x (float32 or bfloat16) in `dtype` (either), its rounding to bfloat16 kept (above)."""
    dtype = jnp.dtype(dtype)
    if jnp.finfo(dtype).bits >= jnp.finfo(x.dtype).bits:
        return x.astype(dtype)
    return _kept(x, dtype).astype(dtype)


def widened(x: jax.Array) -> jax.Array:
    """x (float32 or bfloat16) as float32, its rounding to x's dtype kept (above)."""
    return x if x.dtype == jnp.float32 else _kept(x.astype(jnp.float32), x.dtype)


def result_type(dtype: str):
    """The preferred_element_type of a dot or convolution with `dtype` operands."""
    return jnp.float32 if dtype == "float32" or backend() != "cpu" else None


def rounds_results(dtype: str) -> bool:
    """Whether a product in `dtype` comes back rounded to it (narrow dtypes on CPU, above)."""
    return result_type(dtype) is None


def einsum(spec: str, x: jax.Array, w: jax.Array, dtype: str = "float32", rounded: bool = False) -> jax.Array:
    """The product in `dtype`, float32 out. `rounded`: its result rounded to `dtype` first, as
    XLA on CPU always rounds it (half the bytes written and read where the result is large)."""
    if rounded:
        return widened(rounded_einsum(spec, x, w, dtype))
    return widened(jnp.einsum(spec, narrow(x, dtype), narrow(w, dtype), preferred_element_type=result_type(dtype)))


def rounded_einsum(spec: str, x: jax.Array, w: jax.Array, dtype: str) -> jax.Array:
    """The product in `dtype` (float32 accumulation), its result in `dtype`."""
    return jnp.einsum(spec, narrow(x, dtype), narrow(w, dtype), preferred_element_type=dtype)


def matmul(x: jax.Array, w: jax.Array, dtype: str = "float32", rounded: bool = False) -> jax.Array:
    """x (..., K) @ w (K, N) -> (..., N) float32. In a narrower dtype its gradients are products
    in that dtype too, with float32 results (`_narrow_matmul`). `rounded`: the result and x's
    gradient come rounded to `dtype` (as XLA on CPU always rounds them: the same numbers there),
    half the bytes written and read where they are large; w's gradient stays float32."""
    if dtype == "float32":
        return _product(x, w, dtype)
    return _narrow_matmul(x, w, dtype, x.dtype.name, w.dtype.name, rounded)


def _product(x: jax.Array, w: jax.Array, dtype: str, rounded: bool = False) -> jax.Array:
    out_type = dtype if rounded else result_type(dtype)
    return widened(jnp.matmul(narrow(x, dtype), narrow(w, dtype), preferred_element_type=out_type))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _narrow_matmul(x: jax.Array, w: jax.Array, dtype: str, x_dtype: str, w_dtype: str, rounded: bool) -> jax.Array:
    """`_product` in `dtype`, differentiated by hand: autodiff's gradients are float32 x `dtype`
    products (TF32 on GPUs, not the bfloat16 tensor cores) rounded to `dtype`, so that a weight's
    gradient was rounded before its sum over devices. Here the output gradient is rounded to
    `dtype` once, and both gradients are `dtype` products with float32 results (XLA on CPU:
    rounded to `dtype`, see above; x's with `rounded` too)."""
    return _product(x, w, dtype, rounded)


def _narrow_matmul_forward(x, w, dtype, x_dtype, w_dtype, rounded):
    return _product(x, w, dtype, rounded), (narrow(x, dtype), narrow(w, dtype))


def _narrow_matmul_backward(dtype, x_dtype, w_dtype, rounded, residuals, g):
    x, w = residuals
    g = narrow(g, dtype)
    dx = jnp.matmul(g, w.T, preferred_element_type=dtype if rounded else result_type(dtype))
    batch = tuple(range(x.ndim - 1))
    dw = jnp.tensordot(x, g, axes=(batch, batch), preferred_element_type=result_type(dtype))
    return widened(dx).astype(x_dtype), widened(dw).astype(w_dtype)


_narrow_matmul.defvjp(_narrow_matmul_forward, _narrow_matmul_backward)
