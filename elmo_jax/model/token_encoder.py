"""The character-CNN token encoder shared by both LMs (docs/MODEL.md section 1).

char ids (..., C) -> char embedding (..., C, D) -> per filter (w, n): VALID conv1d with bias,
max over positions, activation -> concat (..., F) -> highway layers -> projection (..., P).
"""

from __future__ import annotations

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
        y_NWn = jax.lax.conv_general_dilated(
            x_NCD,
            f["W"].astype(dtype),
            window_strides=(1,),
            padding="VALID",
            dimension_numbers=("NWC", "WIO", "NWC"),
            preferred_element_type=conv_result_type(dtype),
        )  # the max of values rounded to bfloat16 is the rounded max: pooling first is exact
        pooled.append(activation(jnp.max(y_NWn, axis=1).astype(jnp.float32) + f["b"]))
    h_NF = jnp.concatenate(pooled, axis=-1)
    for k in range(config.char_cnn.n_highway):
        hw = params["highway"][f"layer_{k}"]
        gate = jax.nn.sigmoid(matmul(h_NF, hw["W_carry"], dtype) + hw["b_carry"])
        h_NF = gate * jax.nn.relu(matmul(h_NF, hw["W_transform"], dtype) + hw["b_transform"]) + (1.0 - gate) * h_NF
    return matmul(h_NF, params["proj"]["W"], dtype) + params["proj"]["b"]
