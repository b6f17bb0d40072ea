"""The character-CNN token encoder shared by both LMs (docs/MODEL.md section 1).

char ids (..., C) -> char embedding (..., C, D) -> per filter (w, n): VALID conv1d with bias,
max over positions, activation -> concat (..., F) -> highway layers -> projection (..., P).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.config import N_CHARACTERS, ModelConfig
from elmo_jax.model import Params
from elmo_jax.model.matmul import conv_result_type, matmul

_ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh}


def init_token_encoder(rng: jax.Array, config: ModelConfig) -> Params:
    """Initialisation of bilm-tf (spec section 5). Row 0 of the embedding (padding) is zero."""
    cnn, P = config.char_cnn, config.lstm.projection_dim
    F, D = cnn.n_filters, cnn.embedding_dim
    keys = iter(jax.random.split(rng, 3 + len(cnn.filters) + 2 * cnn.n_highway))
    embed = jax.random.uniform(next(keys), (cnn.n_characters, D), minval=-1.0, maxval=1.0)
    params: Params = {"char_embed": embed.at[0].set(0.0), "cnn": {}, "highway": {}}
    for i, (width, count) in enumerate(cnn.filters):
        if cnn.activation == "relu":
            w = jax.random.uniform(next(keys), (width, D, count), minval=-0.05, maxval=0.05)
        else:
            w = jax.random.normal(next(keys), (width, D, count)) * np.sqrt(1.0 / (width * D))
        params["cnn"][f"filter_{i}"] = {"W": w, "b": jnp.zeros((count,))}
    for k in range(cnn.n_highway):
        params["highway"][f"layer_{k}"] = {
            "W_carry": jax.random.normal(next(keys), (F, F)) * np.sqrt(1.0 / F),
            "b_carry": jnp.full((F,), -2.0, jnp.float32),
            "W_transform": jax.random.normal(next(keys), (F, F)) * np.sqrt(1.0 / F),
            "b_transform": jnp.zeros((F,)),
        }
    params["proj"] = {"W": jax.random.normal(next(keys), (F, P)) * np.sqrt(1.0 / F), "b": jnp.zeros((P,))}
    return params


def _conv_in(x_NCD: jax.Array, w_wDn: jax.Array, dtype: str) -> jax.Array:
    """VALID 1-D convolution (N, C, D) x (w, D, n) -> (N, C - w + 1, n) of `dtype` operands."""
    return jax.lax.conv_general_dilated(
        x_NCD.astype(dtype),
        w_wDn.astype(dtype),
        window_strides=(1,),
        padding="VALID",
        dimension_numbers=("NWC", "WIO", "NWC"),
        preferred_element_type=conv_result_type(dtype),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv(x_NCD: jax.Array, w_wDn: jax.Array, dtype: str) -> jax.Array:
    """`_conv_in` in `dtype`, whose filter gradient is computed and returned in float32: its
    sum over the words (and over devices, when the words are split) is never rounded to a
    narrower compute dtype (a bfloat16 convolution's result is bfloat16 on CPU and GPU)."""
    return _conv_in(x_NCD, w_wDn, dtype)


def _conv_forward(x_NCD, w_wDn, dtype):
    return _conv_in(x_NCD, w_wDn, dtype), (x_NCD, w_wDn)


def _conv_backward(dtype, residuals, g_NWn):
    x_NCD, w_wDn = residuals
    _, input_vjp = jax.vjp(lambda x: _conv_in(x, w_wDn, dtype), x_NCD)
    _, filter_vjp = jax.vjp(lambda w: _conv_in(x_NCD, w, "float32"), w_wDn.astype(jnp.float32))
    (dx,) = input_vjp(g_NWn)
    (dw,) = filter_vjp(g_NWn.astype(jnp.float32))
    return dx, dw.astype(w_wDn.dtype)


_conv.defvjp(_conv_forward, _conv_backward)


def encode_tokens(params: Params, chars_NC: jax.Array, config: ModelConfig) -> jax.Array:
    """Char ids (N, C) (+1 shifted, 0 = padded slot) -> token vectors (N, P) float32; matmuls
    and convolutions in config.compute_dtype. The embedding must have a row for every id
    (JAX's gather would silently clamp a larger id onto the last row)."""
    rows = params["char_embed"].shape[0]
    if rows != N_CHARACTERS:
        raise ValueError(
            f"char_embed has {rows} rows; the char ids need {N_CHARACTERS} (a zero padding row 0, then "
            f"bilm-tf's {N_CHARACTERS - 1} rows: prepend a zero row to a {N_CHARACTERS - 1}-row table)"
        )
    activation, dtype = _ACTIVATIONS[config.char_cnn.activation], config.compute_dtype
    x_NCD = params["char_embed"][chars_NC].astype(dtype)
    pooled = []
    for i in range(len(config.char_cnn.filters)):
        f = params["cnn"][f"filter_{i}"]
        y_NWn = _conv_in(x_NCD, f["W"], dtype) if dtype == "float32" else _conv(x_NCD, f["W"], dtype)
        # The max of values rounded to bfloat16 is the rounded max: pooling first is exact.
        pooled.append(activation(jnp.max(y_NWn, axis=1).astype(jnp.float32) + f["b"]))
    h_NF = jnp.concatenate(pooled, axis=-1)
    for k in range(config.char_cnn.n_highway):
        hw = params["highway"][f"layer_{k}"]
        gate = jax.nn.sigmoid(matmul(h_NF, hw["W_carry"], dtype) + hw["b_carry"])
        h_NF = gate * jax.nn.relu(matmul(h_NF, hw["W_transform"], dtype) + hw["b_transform"]) + (1.0 - gate) * h_NF
    return matmul(h_NF, params["proj"]["W"], dtype) + params["proj"]["b"]
