"""The LSTM with projection and clipping (TF `LSTMCell`, ELMO_SPEC.md section 1), both
directions at once.

Layer params hold both directions stacked on axis 0 (0 forward, 1 backward), in bilm-tf's
layout: `W_0` (2, I + P, 4C) with rows [input; h_prev] and gate blocks i, j, f, o; `B` (2, 4C)
without the +1 forget bias; `W_P_0` (2, C, P). The input half of the gate matmul runs for all
T steps in one matmul before the scan; the scan body holds the recurrent matmul and the
projection only.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.model.matmul import einsum, matmul

Params = dict


class LSTMState(NamedTuple):
    """Carried state of every LSTM: h (2, L, B, P) and c (2, L, B, C); axis 0 = direction."""

    h: jax.Array
    c: jax.Array

    @classmethod
    def zeros(cls, config: ModelConfig, batch_size: int) -> LSTMState:
        L, C, P = config.lstm.n_layers, config.lstm.dim, config.lstm.projection_dim
        return cls(jnp.zeros((2, L, batch_size, P)), jnp.zeros((2, L, batch_size, C)))


def _glorot_uniform(rng: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    fan_in, fan_out = shape[-2], shape[-1]
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(rng, shape, minval=-limit, maxval=limit)


def init_lstm(rng: jax.Array, config: ModelConfig) -> Params:
    """Glorot-uniform kernels and zero biases (bilm-tf), both directions, every layer."""
    C, P = config.lstm.dim, config.lstm.projection_dim
    params = {}
    for layer, key in enumerate(jax.random.split(rng, config.lstm.n_layers)):
        k_w, k_p = jax.random.split(key)
        params[f"layer_{layer}"] = {
            "W_0": _glorot_uniform(k_w, (2, P + P, 4 * C)),
            "B": jnp.zeros((2, 4 * C)),
            "W_P_0": _glorot_uniform(k_p, (2, C, P)),
        }
    return params


def _clip(x: jax.Array, value: float | None) -> jax.Array:
    return x if value is None else jnp.clip(x, -value, value)


def lstm_layer(
    params: Params,
    x_BTI: jax.Array,
    mask_BT: jax.Array,
    h_BP: jax.Array,
    c_BC: jax.Array,
    cell_clip: float | None,
    proj_clip: float | None,
    unroll: int = 1,
    dtype: str = "float32",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One direction of one layer (params without the direction axis); matmuls in `dtype`.

    Returns outputs (B, T, P) (0 where mask is False), final h (B, P) and c (B, C); masked
    positions leave the state unchanged.
    """
    W, b = params["W_0"], params["B"]
    n_in = x_BTI.shape[-1]
    W_x, W_h, W_proj = W[:n_in], W[n_in:].astype(dtype), params["W_P_0"].astype(dtype)
    gates_x_TBG = einsum("bti,ig->tbg", x_BTI, W_x, dtype) + b
    mask_TB1 = jnp.swapaxes(mask_BT, 0, 1)[:, :, None]

    def step(carry, inputs):
        h, c = carry
        gates_x, m = inputs
        i, j, f, o = jnp.split(gates_x + matmul(h, W_h, dtype), 4, axis=-1)
        c_new = _clip(jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(j), cell_clip)
        h_new = _clip(matmul(jax.nn.sigmoid(o) * jnp.tanh(c_new), W_proj, dtype), proj_clip)
        return (jnp.where(m, h_new, h), jnp.where(m, c_new, c)), jnp.where(m, h_new, 0.0)

    (h, c), out_TBP = jax.lax.scan(step, (h_BP, c_BC), (gates_x_TBG, mask_TB1), unroll=unroll)
    return jnp.swapaxes(out_TBP, 0, 1), h, c


def lstm_stacks(
    params: Params,
    x_2BTP: jax.Array,
    mask_BT: jax.Array,
    state: LSTMState,
    config: ModelConfig,
    keep_masks: jax.Array | None = None,
    dropout: float = 0.0,
    unroll: int = 1,
) -> tuple[jax.Array, LSTMState]:
    """Both directions' L layers over inputs (2, B, T, P) -> outputs (L, 2, B, T, P), new state.

    With `keep_masks` (at least L, 2, B, T, P; bool), layer l's input is dropped out where
    keep_masks[l] is False and scaled by 1 / (1 - dropout) elsewhere, as bilm-tf's
    DropoutWrapper does, and the residual (layers >= 1 with skip connections) adds the
    dropped-out input. Outputs are 0 where mask is False.
    """
    cfg = config.lstm
    layer_fn = jax.vmap(
        lambda p, x, h, c: lstm_layer(p, x, mask_BT, h, c, cfg.cell_clip, cfg.proj_clip, unroll, config.compute_dtype)
    )
    keep = mask_BT[None, :, :, None]
    outputs, hs, cs = [], [], []
    layer_in = x_2BTP
    for layer in range(cfg.n_layers):
        if keep_masks is not None:
            layer_in = apply_dropout(keep_masks[layer], layer_in, dropout)
        out, h, c = layer_fn(params[f"layer_{layer}"], layer_in, state.h[:, layer], state.c[:, layer])
        if cfg.use_skip_connections and layer > 0:
            out = jnp.where(keep, out + layer_in, 0.0)
        outputs.append(out)
        hs.append(h)
        cs.append(c)
        layer_in = out
    return jnp.stack(outputs), LSTMState(jnp.stack(hs, axis=1), jnp.stack(cs, axis=1))


def dropout_keep_masks(rng: jax.Array, rate: float, n: int, shape: tuple[int, ...]) -> jax.Array:
    """n independent keep masks (n, *shape), each element True with probability 1 - rate."""
    return jnp.stack([jax.random.bernoulli(jax.random.fold_in(rng, i), 1.0 - rate, shape) for i in range(n)])


def apply_dropout(keep: jax.Array, x: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout: zero where `keep` is False, scale the rest by 1 / (1 - rate)."""
    return jnp.where(keep, x / (1.0 - rate), 0.0)
