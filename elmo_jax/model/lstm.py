"""The LSTM with projection and clipping (TF `LSTMCell`, ELMO_SPEC.md section 1), both
directions at once.

Layer params hold both directions stacked on axis 0 (0 forward, 1 backward), in bilm-tf's
layout: `W_0` (2, I + P, 4C) with rows [input; h_prev] and gate blocks i, j, f, o; `B` (2, 4C)
without the +1 forget bias; `W_P_0` (2, C, P). The input half of the gate matmul runs for all
T steps in one matmul before the scan; the scan body holds the recurrent matmul and the
projection only.
"""

from __future__ import annotations

import functools
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


class _Clips(NamedTuple):
    cell: float | None
    proj: float | None


def _cell(h_BP, c_BC, gates_x_BG, W_h, W_proj, clips: _Clips, dtype: str):
    """One LSTM step -> new h (B, P), new c (B, C) and what the backward pass needs: the gate
    activations [sigmoid(i), tanh(j), sigmoid(f + 1), sigmoid(o)] (B, 4C), the unclipped cell
    (B, C) and the unclipped projection (B, P)."""
    i, j, f, o = jnp.split(gates_x_BG + matmul(h_BP, W_h, dtype), 4, axis=-1)
    si, tj, sf, so = jax.nn.sigmoid(i), jnp.tanh(j), jax.nn.sigmoid(f + 1.0), jax.nn.sigmoid(o)
    c_raw = sf * c_BC + si * tj
    c_new = _clip(c_raw, clips.cell)
    h_raw = matmul(so * jnp.tanh(c_new), W_proj, dtype)
    return _clip(h_raw, clips.proj), c_new, (jnp.concatenate([si, tj, sf, so], axis=-1), c_raw, h_raw)


def _scan(W_h, W_proj, gates_x_TBG, mask_TB1, h_BP, c_BC, clips, unroll, dtype, residuals):
    """The recurrence over T steps -> outputs (T, B, P), final h, c and, with `residuals`, per
    step: gate activations, unclipped cell and projection, and the h and c each step read."""

    def step(carry, inputs):
        h, c = carry
        gates_x, m = inputs
        h_new, c_new, saved = _cell(h, c, gates_x, W_h, W_proj, clips, dtype)
        out = jnp.where(m, h_new, 0.0)
        return (jnp.where(m, h_new, h), jnp.where(m, c_new, c)), ((out, saved, h, c) if residuals else out)

    (h, c), ys = jax.lax.scan(step, (h_BP, c_BC), (gates_x_TBG, mask_TB1), unroll=unroll)
    if residuals:
        return (ys[0], h, c), ys[1:]
    return ys, h, c


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _recurrence(W_h, W_proj, gates_x_TBG, mask_TB1, h_BP, c_BC, clips, unroll, dtype):
    """Outputs (T, B, P), final h (B, P) and c (B, C) of the recurrence over the precomputed
    input half of the gates (T, B, 4C) (bias included).

    Differentiated by hand: the backward scan holds only the two matmuls that carry the
    gradient back in time; the weight gradients are summed over all T steps afterwards in one
    matmul each (JAX's scan transpose would add a small outer product into them at every step).
    """
    return _scan(W_h, W_proj, gates_x_TBG, mask_TB1, h_BP, c_BC, clips, unroll, dtype, residuals=False)


def _recurrence_fwd(W_h, W_proj, gates_x_TBG, mask_TB1, h_BP, c_BC, clips, unroll, dtype):
    outputs, saved = _scan(W_h, W_proj, gates_x_TBG, mask_TB1, h_BP, c_BC, clips, unroll, dtype, residuals=True)
    return outputs, (W_h, W_proj, mask_TB1, saved)


def _clip_grad(g, x, value):
    return g if value is None else jnp.where(jnp.abs(x) < value, g, 0.0)


def _recurrence_bwd(clips, unroll, dtype, residuals, cotangents):
    W_h, W_proj, mask_TB1, ((acts_TBG, c_raw_TBC, h_raw_TBP), h_prev_TBP, c_prev_TBC) = residuals
    d_out_TBP, d_h, d_c = cotangents
    W_h_t, W_proj_t = W_h.T, W_proj.T

    def step(carry, inputs):
        d_h, d_c = carry  # with respect to the state after this step
        d_out, m, acts, c_raw, h_raw, c_prev = inputs
        si, tj, sf, so = jnp.split(acts, 4, axis=-1)
        d_h_raw = _clip_grad(jnp.where(m, d_out + d_h, 0.0), h_raw, clips.proj)
        tc = jnp.tanh(_clip(c_raw, clips.cell))
        d_a = matmul(d_h_raw, W_proj_t, dtype)
        d_c_raw = _clip_grad(jnp.where(m, d_c, 0.0) + d_a * so * (1.0 - tc * tc), c_raw, clips.cell)
        d_gates = jnp.concatenate(
            [
                d_c_raw * tj * si * (1.0 - si),
                d_c_raw * si * (1.0 - tj * tj),
                d_c_raw * c_prev * sf * (1.0 - sf),
                d_a * tc * so * (1.0 - so),
            ],
            axis=-1,
        )
        d_h_prev = matmul(d_gates, W_h_t, dtype) + jnp.where(m, 0.0, d_h)
        d_c_prev = d_c_raw * sf + jnp.where(m, 0.0, d_c)
        return (d_h_prev, d_c_prev), (d_gates, d_h_raw)

    inputs = (d_out_TBP, mask_TB1, acts_TBG, c_raw_TBC, h_raw_TBP, c_prev_TBC)
    (d_h0, d_c0), (d_gates_TBG, d_h_raw_TBP) = jax.lax.scan(step, (d_h, d_c), inputs, reverse=True, unroll=unroll)
    so_TBC = jnp.split(acts_TBG, 4, axis=-1)[3]
    a_TBC = so_TBC * jnp.tanh(_clip(c_raw_TBC, clips.cell))
    d_W_h = einsum("tbp,tbg->pg", h_prev_TBP, d_gates_TBG, dtype)
    d_W_proj = einsum("tbc,tbp->cp", a_TBC, d_h_raw_TBP, dtype)
    return d_W_h, d_W_proj, d_gates_TBG, None, d_h0, d_c0


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


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
    gates_x_TBG = einsum("bti,ig->tbg", x_BTI, W[:n_in], dtype) + b
    mask_TB1 = jnp.swapaxes(mask_BT, 0, 1)[:, :, None]
    clips = _Clips(cell_clip, proj_clip)
    out_TBP, h, c = _recurrence(W[n_in:], params["W_P_0"], gates_x_TBG, mask_TB1, h_BP, c_BC, clips, unroll, dtype)
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
