"""The LSTM with projection and clipping (TF `LSTMCell`, docs/MODEL.md section 1), both
directions at once.

Layer params hold both directions stacked on axis 0 (0 forward, 1 backward), in bilm-tf's
layout: `W_0` (2, I + P, 4C) with rows [input; h_prev] and gate blocks i, j, f, o; `B` (2, 4C)
without the +1 forget bias; `W_P_0` (2, C, P). The input half of the gate matmul runs for all
T steps in one matmul before the time loop; the loop body holds the recurrent matmul and the
projection of both directions (batched matmuls), and its gradient is written by hand
(`_recurrence`)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.model.matmul import einsum

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


def _clip_grad(g: jax.Array, x: jax.Array, value: float | None) -> jax.Array:
    return g if value is None else jnp.where(jnp.abs(x) < value, g, 0.0)


class _Clips(NamedTuple):
    cell: float | None
    proj: float | None


def _gate_constants(C: int) -> tuple[np.ndarray, ...]:
    """Per gate column (4C,): the four activations [sigmoid(i), tanh(j), sigmoid(f + 1),
    sigmoid(o)] as one tanh, act = scale * tanh(slope * z + offset) + shift
    (sigmoid(x) = tanh(x / 2) / 2 + 1 / 2)."""
    is_tanh = np.arange(4 * C) // C == 1
    slope = np.where(is_tanh, 1.0, 0.5).astype(np.float32)
    offset = np.where(np.arange(4 * C) // C == 2, 0.5, 0.0).astype(np.float32)  # the forget bias +1
    scale = slope  # 1/2 for the sigmoids (tanh(x / 2) / 2 + 1 / 2), 1 for tanh(j)
    shift = np.where(is_tanh, 0.0, 0.5).astype(np.float32)
    return slope, offset, scale, shift


def _cell(h_DBP, c_DBC, gates_x_DBG, W_h, W_proj, clips: _Clips, dtype: str):
    """One step of both directions (axis 0) -> new h, new c, the gate activations (D, B, 4C)
    and the unclipped cell (D, B, C) and projection (D, B, P)."""
    slope, offset, scale, shift = _gate_constants(c_DBC.shape[-1])
    z = gates_x_DBG + einsum("dbp,dpg->dbg", h_DBP, W_h, dtype)
    acts = scale * jnp.tanh(slope * z + offset) + shift
    si, tj, sf, so = jnp.split(acts, 4, axis=-1)
    c_raw = sf * c_DBC + si * tj
    c_new = _clip(c_raw, clips.cell)
    h_raw = einsum("dbc,dcp->dbp", so * jnp.tanh(c_new), W_proj, dtype)
    return _clip(h_raw, clips.proj), c_new, acts, c_raw, h_raw


def _at(x_DBTX: jax.Array, t) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(x_DBTX, t, axis=2, keepdims=False)


def _put(buffer_DBTX: jax.Array, t, value_DBX: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(buffer_DBTX, value_DBX, t, axis=2)


def _step_mask(mask_BT: jax.Array, t) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(mask_BT, t, axis=1, keepdims=False)[None, :, None]


def _scan(W_h, W_proj, gates_x_DBTG, mask_BT, h_DBP, c_DBC, clips, unroll, dtype, residuals):
    """The recurrence over T steps -> unclipped projections (D, B, T, P), final h and c, and
    with `residuals` the gate activations (D, B, T, 4C) and unclipped cells (D, B, T, C).
    The loop reads and writes time step t of batch-major arrays in place (no transposes)."""
    D, B, T, G = gates_x_DBTG.shape
    widths = (W_proj.shape[-1], G, G // 4) if residuals else (W_proj.shape[-1],)
    buffers = tuple(jnp.zeros_like(gates_x_DBTG, shape=(D, B, T, n)) for n in widths)  # as varying as the inputs

    def step(t, carry):
        h, c, buffers = carry
        h_new, c_new, acts, c_raw, h_raw = _cell(h, c, _at(gates_x_DBTG, t), W_h, W_proj, clips, dtype)
        buffers = tuple(_put(buffer, t, x) for buffer, x in zip(buffers, (h_raw, acts, c_raw)))
        m = _step_mask(mask_BT, t)
        return jnp.where(m, h_new, h), jnp.where(m, c_new, c), buffers

    h, c, buffers = jax.lax.fori_loop(0, T, step, (h_DBP, c_DBC, buffers), unroll=unroll)
    return buffers, h, c


def _outputs(h_raw_DBTP, mask_BT, clips):
    return jnp.where(mask_BT[None, :, :, None], _clip(h_raw_DBTP, clips.proj), 0.0)


def _state_before_each_step(new_DBTX, initial_DBX, mask_BT):
    """The state each step read (D, B, T, X): the last earlier step's where it ran, else the
    initial state."""
    T = mask_BT.shape[1]
    ran = jnp.where(mask_BT, jnp.arange(1, T + 1), 0)
    last_ran = jnp.concatenate([jnp.zeros_like(ran[:, :1]), jax.lax.cummax(ran, axis=1)[:, :-1]], axis=1)  # 0: none
    states = jnp.concatenate([initial_DBX[:, :, None], new_DBTX], axis=2)
    return jnp.take_along_axis(states, last_ran[None, :, :, None], axis=2)


def _forward(W_0, b, W_proj, x_DBTI, mask_BT, h_DBP, c_DBC, clips, unroll, dtype, residuals):
    """-> (outputs (D, B, T, P), final h, final c) and what _scan saved. The input half of the
    gate matmul runs for all T steps in one matmul before the loop."""
    n_in = x_DBTI.shape[-1]
    gates_x_DBTG = einsum("dbti,dig->dbtg", x_DBTI, W_0[:, :n_in], dtype) + b[:, None, None]
    saved, h, c = _scan(W_0[:, n_in:], W_proj, gates_x_DBTG, mask_BT, h_DBP, c_DBC, clips, unroll, dtype, residuals)
    return (_outputs(saved[0], mask_BT, clips), h, c), saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _recurrence(W_0, b, W_proj, x_DBTI, mask_BT, h_DBP, c_DBC, clips, unroll, dtype):
    """One layer: outputs (D, B, T, P), final h (D, B, P) and c (D, B, C).

    Differentiated by hand: the backward loop holds only the two matmuls that carry the
    gradient back in time; the gradient of W_0 (input and recurrent rows together) is one
    matmul over all T steps afterwards, and so is W_proj's (JAX's scan transpose would add a
    small outer product into them at every step).
    """
    return _forward(W_0, b, W_proj, x_DBTI, mask_BT, h_DBP, c_DBC, clips, unroll, dtype, residuals=False)[0]


def _recurrence_fwd(W_0, b, W_proj, x_DBTI, mask_BT, h_DBP, c_DBC, clips, unroll, dtype):
    outputs, saved = _forward(W_0, b, W_proj, x_DBTI, mask_BT, h_DBP, c_DBC, clips, unroll, dtype, residuals=True)
    return outputs, (W_0, W_proj, x_DBTI, mask_BT, h_DBP, c_DBC, *saved)


def _recurrence_bwd(clips, unroll, dtype, residuals, cotangents):
    W_0, W_proj, x_DBTI, mask_BT, h0, c0, h_raw_DBTP, acts_DBTG, c_raw_DBTC = residuals
    d_out_DBTP, d_h, d_c = cotangents
    slope, _, scale, shift = _gate_constants(c0.shape[-1])
    n_in = x_DBTI.shape[-1]
    W_0_t, W_proj_t = jnp.swapaxes(W_0, 1, 2), jnp.swapaxes(W_proj, 1, 2)
    W_x_t, W_h_t = W_0_t[:, :, :n_in], W_0_t[:, :, n_in:]
    c_new_DBTC = _clip(c_raw_DBTC, clips.cell)
    c_prev_DBTC = _state_before_each_step(c_new_DBTC, c0, mask_BT)
    tanh_c_DBTC = jnp.tanh(c_new_DBTC)  # read by the loop and by W_proj's gradient
    T = mask_BT.shape[1]

    def step(i, carry):
        t = T - 1 - i
        d_h, d_c, d_gates_DBTG, d_h_raw_DBTP = carry  # d_h, d_c: with respect to the state after step t
        acts, c_raw, h_raw = _at(acts_DBTG, t), _at(c_raw_DBTC, t), _at(h_raw_DBTP, t)
        m = _step_mask(mask_BT, t)
        si, tj, sf, so = jnp.split(acts, 4, axis=-1)
        d_h_raw = _clip_grad(jnp.where(m, _at(d_out_DBTP, t) + d_h, 0.0), h_raw, clips.proj)
        tc = _at(tanh_c_DBTC, t)
        d_a = einsum("dbp,dpc->dbc", d_h_raw, W_proj_t, dtype)
        d_c_raw = _clip_grad(jnp.where(m, d_c, 0.0) + d_a * so * (1.0 - tc * tc), c_raw, clips.cell)
        d_acts = jnp.concatenate([d_c_raw * tj, d_c_raw * si, d_c_raw * _at(c_prev_DBTC, t), d_a * tc], axis=-1)
        tanh_of_acts = (acts - shift) / scale
        d_gates = d_acts * scale * slope * (1.0 - tanh_of_acts * tanh_of_acts)
        d_h_prev = einsum("dbg,dgp->dbp", d_gates, W_h_t, dtype) + jnp.where(m, 0.0, d_h)
        d_c_prev = d_c_raw * sf + jnp.where(m, 0.0, d_c)
        return d_h_prev, d_c_prev, _put(d_gates_DBTG, t, d_gates), _put(d_h_raw_DBTP, t, d_h_raw)

    buffers = (jnp.zeros_like(acts_DBTG), jnp.zeros_like(h_raw_DBTP))
    d_h0, d_c0, d_gates_DBTG, d_h_raw_DBTP = jax.lax.fori_loop(0, T, step, (d_h, d_c, *buffers), unroll=unroll)
    h_prev_DBTP = _state_before_each_step(_clip(h_raw_DBTP, clips.proj), h0, mask_BT)
    a_DBTC = jnp.split(acts_DBTG, 4, axis=-1)[3] * tanh_c_DBTC
    d_W_0 = einsum("dbtk,dbtg->dkg", jnp.concatenate([x_DBTI, h_prev_DBTP], axis=-1), d_gates_DBTG, dtype)
    # Transposed, so that XLA lays out the narrow d_h_raw (P wide) for the matmul, not a (C wide).
    d_W_proj = jnp.swapaxes(einsum("dbtp,dbtc->dpc", d_h_raw_DBTP, a_DBTC, dtype), 1, 2)
    d_x = einsum("dbtg,dgi->dbti", d_gates_DBTG, W_x_t, dtype)
    return d_W_0, d_gates_DBTG.sum(axis=(1, 2)), d_W_proj, d_x, None, d_h0, d_c0


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def lstm_layer(
    params: Params,
    x_DBTI: jax.Array,
    mask_BT: jax.Array,
    h_DBP: jax.Array,
    c_DBC: jax.Array,
    cell_clip: float | None,
    proj_clip: float | None,
    unroll: int = 1,
    dtype: str = "float32",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer of D directions (params stacked on axis 0, inputs (D, B, T, I)); matmuls in
    `dtype`.

    Returns outputs (D, B, T, P) (0 where mask is False), final h (D, B, P) and c (D, B, C);
    masked positions leave the state unchanged.
    """
    clips = _Clips(cell_clip, proj_clip)
    return _recurrence(params["W_0"], params["B"], params["W_P_0"], x_DBTI, mask_BT, h_DBP, c_DBC, clips, unroll, dtype)


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
    keep = mask_BT[None, :, :, None]
    outputs, hs, cs = [], [], []
    layer_in = x_2BTP
    for layer in range(cfg.n_layers):
        if keep_masks is not None:
            layer_in = apply_dropout(keep_masks[layer], layer_in, dropout)
        out, h, c = lstm_layer(
            params[f"layer_{layer}"], layer_in, mask_BT, state.h[:, layer], state.c[:, layer],
            cfg.cell_clip, cfg.proj_clip, unroll, config.compute_dtype,
        )
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
