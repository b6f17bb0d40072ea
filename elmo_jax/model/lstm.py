"""The LSTM with projection and clipping (TF `LSTMCell`, docs/MODEL.md section 1): both
directions of a biLM in each time loop, its layers in one loop (wavefront) or one each (layers).

Layer params hold both directions stacked on axis 0 (0 forward, 1 backward), in bilm-tf's
layout: `W_0` (2, 2P, 4C) with rows [input; h_prev] and gate blocks i, j, f, o; `B` (2, 4C)
without the +1 forget bias; `W_P_0` (2, C, P). For inference in loops of one layer, W_0 may be
split once into its input and recurrent halves `W_x`, `W_h` (`split_input_weights`).

Two schedules of the layers, the same numbers (`ModelConfig.lstm_schedule`):

- wavefront: layer l at time t needs only layer l - 1 at time t, so loop step s runs layer l at
  time s - l for every l at once, and a train step's forward and backward passes are T + L - 1
  dependent steps each instead of L x T: fewer, wider steps where each step's latency bounds
  the loop (accelerators). Layers >= 1 then read their input weights inside the loop.
- layers: one loop of T steps per layer, whose input half of the gate matmul runs for all T
  steps in one matmul before the loop: each step reads only the recurrent weights, the faster
  schedule where reading weights bounds the loop (this CPU at the published sizes).

Both run `_wavefront` (a single layer is a wavefront of one); its gradient is written by hand
and runs the same diagonal backwards. With several layers, the training step's cell can run as
Pallas kernels of our own, two a step each way (`ModelConfig.lstm_cell`, `cell_kernels`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.model import Params
from elmo_jax.model.backend import backend
from elmo_jax.model.cell_kernels import (
    GATES,
    backward_cell,
    backward_output,
    clipped,
    clipped_gradient,
    forward_cell,
    forward_output,
    parts,
)
from elmo_jax.model.matmul import einsum, rounded_einsum, rounds_results


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


class _Clips(NamedTuple):
    cell: float | None
    proj: float | None


def _gate_constants(C: int) -> tuple[np.ndarray, ...]:
    """Per gate column (4C,): slope, offset, scale and shift of the activations as one tanh,
    act = scale * tanh(slope * z + offset) + shift, scale = slope (`cell_kernels.GATES`)."""
    slope, offset, shift = np.repeat(np.array(GATES, np.float32), C, axis=0).T
    return slope, offset, slope, shift


class _Stack(NamedTuple):
    """What the wavefront needs besides arrays (hashable: a custom_vjp static argument)."""

    clips: _Clips
    skip: bool  # residual around layers >= 1
    dropout: float  # the rate of `keep`, the dropout on layers >= 1's inputs
    unroll: int
    dtype: str
    cell: str  # "xla" or "pallas": the training step's cell as kernels of our own (`cell_kernels`)


def _slots_like(x: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """A buffer whose every slot a loop writes before anything reads it: left uninitialised on
    accelerators (zeros on CPU), not filled with zeros first. Adding a zero of `x` makes it as
    device-varying as `x` under shard_map; XLA drops the addition."""
    return jax.lax.empty(shape, dtype) + jnp.zeros_like(x, dtype, shape=())


def _skew(x: jax.Array, S: int, axis: int, fill=0, first: int = 0) -> jax.Array:
    """Layer l (axis 0 holds layers first, first + 1, ...) shifted l slots later along the time
    `axis` (T -> S = T + L - 1 slots): slot s holds layer l's time s - l, so that one loop step
    s serves every layer at once."""
    T = x.shape[axis]
    pads = [[(0, 0)] * (x.ndim - 1) for _ in range(x.shape[0])]
    for shift, pad in enumerate(pads, start=first):
        pad[axis - 1] = (shift, S - T - shift)
    return jnp.stack([jnp.pad(x[i], pad, constant_values=fill) for i, pad in enumerate(pads)])


def _unskew(x: jax.Array, T: int, axis: int) -> jax.Array:
    return jnp.stack([jax.lax.slice_in_dim(x[layer], layer, layer + T, axis=axis - 1) for layer in range(x.shape[0])])


def _at_slot(x: jax.Array, s, axis: int = 3) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(x, s, axis=axis, keepdims=False)


def _put_slot(buffer: jax.Array, s, value: jax.Array, axis: int = 3) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(buffer, value, s, axis=axis)


def input_gates(W_0: jax.Array, b: jax.Array, x_DNP: jax.Array, dtype: str = "float32") -> jax.Array:
    """One layer's input half of the gates of each direction, x @ W_0[:P] + b: W_0 (D, 2P, 4C)
    (or its input half W_x, (D, P, 4C)), b (D, 4C), inputs (D, ..., P) -> (D, ..., 4C)."""
    P = x_DNP.shape[-1]
    return einsum("d...p,dpg->d...g", x_DNP, W_0[:, :P], dtype) + jnp.expand_dims(b, range(1, x_DNP.ndim - 1))


def split_input_weights(lstm_params: Params) -> Params:
    """The LSTM params with each layer's W_0 (D, 2P, 4C) as its input half `W_x` (D, P, 4C) and
    recurrent half `W_h` (D, P, 4C): for inference in loops of one layer (the layers schedule,
    `lstm_stacks` with reset_BT), split once instead of at every call (XLA copies the slices of a
    weight each time its program runs)."""
    out = {}
    for name, layer in lstm_params.items():
        P = layer["W_0"].shape[1] // 2
        rest = {k: v for k, v in layer.items() if k != "W_0"}
        out[name] = {**rest, "W_x": layer["W_0"][:, :P], "W_h": layer["W_0"][:, P:]}
    return out


def _wave_forward(
    W_0, b, W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st: _Stack, residuals: bool, reset_BT=None, gates_DBTG=None
):
    """-> (outputs (L, D, B, T, P), final h (L, D, B, P), final c (L, D, B, C)) and what the
    backward pass reads. Loop step s runs layer l at time s - l for every l (a slot outside
    0..T-1 is masked, so it changes nothing), batched over layers and directions; layer l + 1
    reads what layer l wrote one step earlier. With several layers each step is one batched
    matmul [input; h] @ W_0; one layer (L = 1) runs its input half for all T steps in one matmul
    before the loop, so that each step reads only the recurrent weights. Where `reset_BT` is
    True the state restarts from zero (another sentence in the row; inference only, without
    residuals). `gates_DBTG`: one layer's `input_gates` of x, already computed. One layer's W_0
    may come as its halves (W_x, W_h), each (1, D, P, 4C) (`split_input_weights`)."""
    split = isinstance(W_0, tuple)
    L, D, B, T, P = (W_0[1] if split else W_0).shape[0], *x_DBTP.shape
    C = W_proj.shape[2]
    S = T + L - 1
    x_DBSP = jnp.pad(x_DBTP, ((0, 0), (0, 0), (0, S - T), (0, 0)))
    if L == 1:
        W_x, W_h = W_0 if split else (W_0[:, :, :P], W_0[:, :, P:])
        gates_x_1DBSG = (input_gates(W_x[0], b[0], x_DBSP, st.dtype) if gates_DBTG is None else gates_DBTG)[None]
    # The training step's cell as kernels of our own (`cell_kernels`): loops of several layers.
    # They also save the projection's operand, which the projection's weight gradient reads.
    own_cell = residuals and L > 1 and st.cell == "pallas"
    # The weights the loop reads (one layer: h's half), sliced and cast here, once: XLA would
    # slice and convert a loop-invariant weight again at every step. With our kernels, the cell's
    # columns in J parts (L, D, J, K, 4, C / J), so that the gates' transposed product is J
    # products whose parts the kernel after it adds (`cell_kernels.parts`: its result is small).
    W_loop = W_h if L == 1 else W_0
    if own_cell:
        J = parts(C, L * D * B * 2 * P)
        W_loop = jnp.moveaxis(W_loop.reshape(L, D, 2 * P, 4, J, C // J), 4, 2)
    W_loop = W_loop.astype(st.dtype)
    W_proj_loop = W_proj.astype(st.dtype)
    mask_LBS = _skew(jnp.broadcast_to(mask_BT, (L, B, T)), S, axis=2, fill=False)
    if reset_BT is not None:  # applied to the state a step leaves for the next (slot 0's: before the loop)
        reset_LBS = _skew(jnp.broadcast_to(reset_BT, (L, B, T)), S, axis=2, fill=False)
        first = reset_LBS[:, None, :, 0, None]
        h_LDBP, c_LDBC = jnp.where(first, 0.0, h_LDBP), jnp.where(first, 0.0, c_LDBC)
        reset_after_LBS = jnp.pad(reset_LBS[:, :, 1:], ((0, 0), (0, 0), (0, 1)))
    keep_KDBSP = None if keep is None else _skew(keep, S, axis=3, fill=False, first=1)  # K = L - 1: layers >= 1
    skip_L = np.array([st.skip and layer > 0 for layer in range(L)])[:, None, None, None]
    # Saved for the backward pass: the state h and c each step leaves (its clipped projection and
    # cell where it ran), its gate activations (in the compute dtype: with bfloat16 matmuls, half
    # the bytes of the loops' largest arrays) and (when layers feed layers) its outputs; slot
    # s - 1's state is what step s read. Else only the outputs. Layers >= 1 read the layer
    # below's output of the step before from its slot (it is not carried: no copy a step).
    widths = (P, 4 * C, C) + ((P,) if L > 1 else ()) if residuals else (P,)
    dtypes = (x_DBTP.dtype, st.dtype, x_DBTP.dtype, x_DBTP.dtype) if residuals else (x_DBTP.dtype,)
    widths, dtypes = (widths + (C,), dtypes + (st.dtype,)) if own_cell else (widths, dtypes)
    buffers = tuple(_slots_like(x_DBTP, (L, D, B, S, n), dtype) for n, dtype in zip(widths, dtypes))
    slope, offset, scale, shift = _gate_constants(C)
    ran_LBS, keep_8, rate = _kernel_masks(mask_LBS, keep_KDBSP, st.dropout) if own_cell else (None, None, None)

    def step(s, carry):
        h, c, buffers = carry
        # The gates' matmul result, the loop's largest array, rounded to the compute dtype (half
        # its bytes written and read; XLA on CPU rounds it anyway, which the tests check).
        if L == 1:
            inputs = _at_slot(x_DBSP, s, axis=2)[None]
            z = _at_slot(gates_x_1DBSG, s) + einsum("ldbp,ldpg->ldbg", h, W_loop, st.dtype, rounded=True)
        else:
            # Layer l >= 1 reads layer l - 1's output of the last step (none before slot 0: the
            # uninitialised slot is not read, as layers >= 1 start at slot l).
            upper = jnp.where(s == 0, 0.0, _at_slot(buffers[-1], jnp.maximum(s - 1, 0))[:-1])  # the outputs
            if keep_KDBSP is not None:
                upper = apply_dropout(_at_slot(keep_KDBSP, s), upper, st.dropout)
            inputs = jnp.concatenate([_at_slot(x_DBSP, s, axis=2)[None], upper])
            rows = jnp.concatenate([inputs, h], axis=-1)
            z = einsum("ldbk,ldkg->ldbg", rows, W_loop, st.dtype, rounded=True) + b[:, :, None]
        acts = scale * jnp.tanh(slope * z + offset) + shift
        if residuals:  # saved first and read back: the pass that computes them writes them there once,
            # and the cell uses the values the backward pass reads (with bfloat16 matmuls, rounded:
            # the training forward differs from inference's by that rounding)
            buffers = (buffers[0], _put_slot(buffers[1], s, acts.astype(buffers[1].dtype)), *buffers[2:])
            acts = _at_slot(buffers[1], s).astype(jnp.float32)
        si, tj, sf, so = jnp.split(acts, 4, axis=-1)
        c_raw = sf * c + si * tj
        c_new = clipped(c_raw, st.clips.cell)
        h_raw = einsum("ldbc,ldcp->ldbp", so * jnp.tanh(c_new), W_proj_loop, st.dtype)
        h_new = clipped(h_raw, st.clips.proj)
        m = mask_LBS[:, None, :, s, None]
        out = _layer_outputs(h_new, inputs, m, skip_L)
        h, c = jnp.where(m, h_new, h), jnp.where(m, c_new, c)
        saved = (h, None, c) + ((out,) if L > 1 else ()) if residuals else (out,)
        buffers = tuple(buf if v is None else _put_slot(buf, s, v) for buf, v in zip(buffers, saved))
        if reset_BT is not None:
            restart = reset_after_LBS[:, None, :, s, None]
            h, c = jnp.where(restart, 0.0, h), jnp.where(restart, 0.0, c)
        return h, c, buffers

    def own_step(s, carry):  # the cell and the outputs as our kernels, the next step's operand carried
        h, rows, (h_slots, acts, cells, outs, a_slots) = carry
        # The gates' product in the weights' parts of the cell's columns, the rows broadcast to each.
        rows_J = jnp.broadcast_to(rows[:, :, None], (L, D, J, B, 2 * P))
        z = rounded_einsum("ldjbk,ldjkn->ldjbn", rows_J, W_loop.reshape(L, D, J, 2 * P, -1), st.dtype)
        z = z.reshape(L, D, J, B, 4, C // J)
        acts, cells, a_slots, a = forward_cell(s, z, b, c_LDBC, ran_LBS, acts, cells, a_slots, J_proj, st.clips.cell)
        if rounds_results(st.dtype):  # one product, rounded once, as the XLA cell's (XLA on CPU)
            h_raw = einsum("ldbc,ldcp->ldbp", _joined(a), W_proj_loop, st.dtype)[:, :, None]
        else:  # J_proj partial products, which forward_output adds
            h_raw = einsum("ldjbc,ldjcp->ldjbp", a, W_proj_loop.reshape(L, D, J_proj, -1, P), st.dtype)
        h_slots, outs, h, rows = forward_output(
            s, h_raw, h, ran_LBS, x_DBSP, keep_8, h_slots, outs, st.clips.proj, st.skip, rate, st.dtype
        )
        return h, rows, (h_slots, acts, cells, outs, a_slots)

    if own_cell:
        J_proj = parts(C, L * D * B * P)  # the projection's operand's parts
        inputs = jnp.concatenate([x_DBSP[None, :, :, 0], jnp.zeros_like(h_LDBP[1:])])  # slot 0: nothing from below
        rows = jnp.concatenate([inputs, h_LDBP], axis=-1).astype(st.dtype)
        h, _, buffers = jax.lax.fori_loop(0, S, own_step, (h_LDBP, rows, buffers), unroll=st.unroll)
        c = buffers[2][:, :, :, -1]  # the cell each layer kept last (not carried: read from its slot)
    else:
        h, c, buffers = jax.lax.fori_loop(0, S, step, (h_LDBP, c_LDBC, buffers), unroll=st.unroll)
    if not residuals:
        return (_unskew(buffers[0], T, axis=3), h, c), None
    if L == 1:
        in_LDBSP = x_DBSP[None]
        out_LDBSP = _layer_outputs(buffers[0], in_LDBSP, mask_LBS[:, None, :, :, None], skip_L[..., None])
    else:  # each layer's inputs: x, and the outputs of the layer below a slot earlier
        out_LDBSP = buffers[3]
        upper_KDBSP = jnp.pad(out_LDBSP[:-1, :, :, :-1], ((0, 0),) * 3 + ((1, 0), (0, 0)))
        if keep_KDBSP is not None:
            upper_KDBSP = apply_dropout(keep_KDBSP, upper_KDBSP, st.dropout)
        in_LDBSP = jnp.concatenate([x_DBSP[None], upper_KDBSP])
    a_LDBSC = buffers[4] if own_cell else None
    return (_unskew(out_LDBSP, T, axis=3), h, c), (
        W_loop,
        W_proj_loop,
        mask_LBS,
        keep_KDBSP,
        in_LDBSP,
        *buffers[:3],
        a_LDBSC,
    )


def _joined(x: jax.Array) -> jax.Array:
    """(L, D, J, N, ..., c) -> (L, D, N, ... * J * c): the J parts of the cell's columns (axis
    2) put back side by side, as the XLA cell has them (the gates' (4, C) as 4C)."""
    x = jnp.moveaxis(x, 2, -2)
    return x.reshape(*x.shape[:3], -1)


def _kernel_masks(mask_LBS, keep_KDBSP, rate: float):
    """The mask and keep masks as `cell_kernels` reads them: int32 (L, B, S), int8 (L - 1, D, B,
    S, P) or None, with the dropout rate (None without keep masks)."""
    keep = (None, None) if keep_KDBSP is None else (keep_KDBSP.astype(jnp.int8), rate)
    return mask_LBS.astype(jnp.int32), *keep


def _layer_outputs(h_new, inputs, mask, skip_L):
    """What a layer passes on: its projection, plus its input where it has a residual; 0 where
    masked."""
    return jnp.where(mask, jnp.where(skip_L, h_new + inputs, h_new), 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _wavefront(W_0b, W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st: _Stack):
    """L layers of D directions (params stacked on axes 0 and 1: W_0b (L, D, 2P + 1, 4C), W_0's
    rows with the bias as one more (`with_bias`), W_proj (L, D, C, P)) over inputs (D, B, T, P)
    -> outputs (L, D, B, T, P) with the residual added (layers >= 1 with `st.skip`), final h
    (L, D, B, P) and c (L, D, B, C). `keep` (L - 1, D, B, T, P) or None: the dropout on the
    inputs of layers >= 1.

    Differentiated by hand, running the same diagonal backwards: the loop holds the matmuls
    that carry the gradient back in time and down the layers; the weight gradients are one
    matmul each over all steps afterwards (W_0b's, the bias's row with it, is that matmul's
    result as it is: summed over devices without a copy)."""
    return _wave_forward(W_0b[:, :, :-1], W_0b[:, :, -1], W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st, False)[0]


def with_bias(W_0: jax.Array, b: jax.Array) -> jax.Array:
    """W_0 (..., 2P, 4C) and its bias (..., 4C) -> (..., 2P + 1, 4C), the bias the last row."""
    return jnp.concatenate([W_0, b[..., None, :]], axis=-2)


def _wavefront_fwd(W_0b, W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st):
    W_0, b = W_0b[:, :, :-1], W_0b[:, :, -1]
    outputs, saved = _wave_forward(W_0, b, W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st, residuals=True)
    return outputs, (W_0, h_LDBP, c_LDBC, *saved)


def _wavefront_bwd(st: _Stack, residuals, cotangents):
    W_0, h0, c0, W_loop, W_proj_loop, mask_LBS, keep_KDBSP, in_LDBSP, h_LDBSP, acts_LDBSG, c_LDBSC, a_LDBSC = residuals
    d_out_LDBTP, d_h, d_c = cotangents
    L, D, B, S, P = in_LDBSP.shape
    T = S - L + 1
    slope, _, scale, shift = _gate_constants(c0.shape[-1])
    skip_L = np.array([st.skip and layer > 0 for layer in range(L)])[:, None, None, None]
    d_out_LDBSP = _skew(d_out_LDBTP, S, axis=3)
    own_cell = a_LDBSC is not None  # the forward ran our kernels, which saved the projection's operand
    J = W_loop.shape[2] if own_cell else None  # the weights' parts of the cell's columns
    ran_LBS, keep_8, rate = _kernel_masks(mask_LBS, keep_KDBSP, st.dropout) if own_cell else (None, None, None)

    def output_gradients(s, d_h, d_above):
        """Slot s's gradient of the layers' outputs and of their unclipped projections. Where
        the step ran, the state it left is its clipped cell and projection: |x| < clip exactly
        where the unclipped value was. Where it did not, every gradient of the step is 0."""
        m = mask_LBS[:, None, :, s, None]
        d_out = jnp.where(m, _at_slot(d_out_LDBSP, s) if L == 1 else _at_slot(d_out_LDBSP, s) + d_above, 0.0)
        return d_out, clipped_gradient(d_out + jnp.where(m, d_h, 0.0), _at_slot(h_LDBSP, s), st.clips.proj)

    def step(i, carry):
        s = S - 1 - i
        # d_above[l]: layer l's output gradient from layer l + 1 (None for one layer); d_h_raw:
        # this step's, computed by the step before (in the pass that computes d_h), in the
        # compute dtype that its matmul and its save slot take.
        d_h, d_c, d_above, d_h_raw, buffers = carry
        acts = _at_slot(acts_LDBSG, s).astype(jnp.float32)
        c_new = _at_slot(c_LDBSC, s)
        c_prev = jnp.where(s == 0, c0, _at_slot(c_LDBSC, jnp.maximum(s - 1, 0)))
        m = mask_LBS[:, None, :, s, None]
        si, tj, sf, so = jnp.split(acts, 4, axis=-1)
        tc = jnp.tanh(c_new)
        d_a = einsum("ldbp,ldcp->ldbc", d_h_raw, W_proj_loop, st.dtype, rounded=True)  # as the forward's gates
        d_c_raw = clipped_gradient(jnp.where(m, d_c, 0.0) + d_a * so * (1.0 - tc * tc), c_new, st.clips.cell)
        d_acts = jnp.concatenate([d_c_raw * tj, d_c_raw * si, d_c_raw * c_prev, d_a * tc], axis=-1)
        tanh_of_acts = (acts - shift) / scale
        d_gates = d_acts * scale * slope * (1.0 - tanh_of_acts * tanh_of_acts)
        d_c_prev = d_c_raw * sf + jnp.where(m, 0.0, d_c)
        saved = (d_gates, d_h_raw)
        if L == 1:  # the input gradient is one matmul after the loop
            d_h_prev = einsum("ldbg,ldpg->ldbp", d_gates, W_loop, st.dtype) + jnp.where(m, 0.0, d_h)
        else:  # the input gradient of layers >= 1 goes down a layer, layer 0's out of the stack
            d_in_h = einsum("ldbg,ldkg->ldbk", d_gates, W_loop, st.dtype)
            d_h_prev = d_in_h[..., P:] + jnp.where(m, 0.0, d_h)
            d_in = d_in_h[..., :P] + jnp.where(skip_L, output_gradients(s, d_h, d_above)[0], 0.0)
            d_upper = d_in[1:] if keep_KDBSP is None else apply_dropout(_at_slot(keep_KDBSP, s), d_in[1:], st.dropout)
            d_above = jnp.concatenate([d_upper, jnp.zeros_like(d_in[:1])])
            saved += (d_in[:1],)
        buffers = tuple(_put_slot(buf, s, v.astype(buf.dtype)) for buf, v in zip(buffers, saved))
        d_h_raw = output_gradients(jnp.maximum(s - 1, 0), d_h_prev, d_above)[1].astype(st.dtype)  # unused after slot 0
        return d_h_prev, d_c_prev, d_above, d_h_raw, buffers

    def own_step(i, carry):  # the cell's and the outputs' gradients as our kernels
        d_h, d_c, d_h_raw, (d_gates_slots, d_h_raw_slots, d_in_slots) = carry
        d_a = rounded_einsum("ldbp,ldcp->ldbc", d_h_raw, W_proj_loop, st.dtype)  # as the forward's gates
        d_gates_slots, d_gates, d_c = backward_cell(
            i, d_a, d_c, c0, ran_LBS, acts_LDBSG, c_LDBSC, d_gates_slots, J, st.clips.cell
        )
        if rounds_results(st.dtype):  # one product, rounded once, as the XLA cell's (XLA on CPU)
            d_in_h = einsum("ldbg,ldkg->ldbk", _joined(d_gates), _joined(W_loop), st.dtype)[:, :, None]
        else:  # J partial products (the weights' parts), which backward_output adds
            d_gates, W_parts = d_gates.reshape(L, D, J, B, -1), W_loop.reshape(L, D, J, 2 * P, -1)
            d_in_h = einsum("ldjbn,ldjkn->ldjbk", d_gates, W_parts, st.dtype)
        d_in_slots, d_h_raw_slots, d_h, d_h_raw = backward_output(
            i, d_in_h, d_h, d_h_raw, ran_LBS, d_out_LDBSP, h_LDBSP, keep_8, d_in_slots, d_h_raw_slots,
            st.clips.proj, st.skip, rate,
        )  # fmt: skip
        return d_h, d_c, d_h_raw, (d_gates_slots, d_h_raw_slots, d_in_slots)

    # After the loop, d_gates and d_h_raw are read only by the weight gradients' matmuls, which
    # take them in the compute dtype: kept in it. The bias gradient, their sum, is one more row of
    # W_0's (a column of ones beside its inputs): d_gates are read once.
    buffers = (
        _slots_like(acts_LDBSG, acts_LDBSG.shape, st.dtype),
        _slots_like(h_LDBSP, h_LDBSP.shape, st.dtype),
    )
    # The input gradients: layer 0's, out of the stack (our kernels keep every layer's: the next
    # step reads what each passes down).
    buffers += (_slots_like(in_LDBSP, in_LDBSP[: L if own_cell else 1].shape, in_LDBSP.dtype),) if L > 1 else ()
    d_above = jnp.zeros_like(d_h) if L > 1 else None
    d_h_raw = output_gradients(S - 1, d_h, d_above)[1].astype(st.dtype)
    if own_cell:
        d_h0, d_c0, _, buffers = jax.lax.fori_loop(0, S, own_step, (d_h, d_c, d_h_raw, buffers), unroll=st.unroll)
    else:
        carry = (d_h, d_c, d_above, d_h_raw, buffers)
        d_h0, d_c0, _, _, buffers = jax.lax.fori_loop(0, S, step, carry, unroll=st.unroll)
    d_gates_LDBSG, d_h_raw_LDBSP = buffers[:2]
    # Slots outside a layer's 0..T-1 are masked: their d_gates and d_h_raw are 0, so the weight
    # gradients can sum over all slots.
    h_prev_LDBSP = jnp.concatenate([h0[:, :, :, None], h_LDBSP[:, :, :, :-1]], axis=3)
    if a_LDBSC is None:  # the projection's operand, unless the forward's kernel saved it
        a_LDBSC = jnp.split(acts_LDBSG, 4, axis=-1)[3].astype(jnp.float32) * jnp.tanh(c_LDBSC)
    rows_LDBSK = jnp.concatenate([in_LDBSP, h_prev_LDBSP, jnp.ones_like(h_prev_LDBSP[..., :1])], axis=-1)
    d_W_0_b = einsum("ldbsk,ldbsg->ldkg", rows_LDBSK, d_gates_LDBSG, st.dtype)
    d_W_proj = jnp.swapaxes(einsum("ldbsp,ldbsc->ldpc", d_h_raw_LDBSP, a_LDBSC, st.dtype), 2, 3)
    if L == 1:
        d_x_DBSP = einsum("dbsg,dpg->dbsp", d_gates_LDBSG[0], W_0[0, :, :P], st.dtype)
    else:
        d_x_DBSP = buffers[2][0]
    return (
        d_W_0_b,
        d_W_proj,
        d_x_DBSP[:, :, :T],
        None,
        None,
        d_h0,
        d_c0,
    )


_wavefront.defvjp(_wavefront_fwd, _wavefront_bwd)


def _stacked(layers: list[Params], name: str) -> jax.Array:
    """One param of several layers, stacked on a new axis 0."""
    return jnp.stack([layer[name] for layer in layers])


def lstm_stacks(
    params: Params,
    x_2BTP: jax.Array,
    mask_BT: jax.Array,
    state: LSTMState,
    config: ModelConfig,
    keep_masks: jax.Array | None = None,
    dropout: float = 0.0,
    reset_BT: jax.Array | None = None,
    gates_2BTG: jax.Array | None = None,
    mark: Callable[[jax.Array], jax.Array] | None = None,
) -> tuple[jax.Array, LSTMState]:
    """Both directions' L layers over inputs (2, B, T, P) -> outputs (L, 2, B, T, P), new state.

    With `keep_masks` (at least L, 2, B, T, P; bool), layer l's input is dropped out where
    keep_masks[l] is False and scaled by 1 / (1 - dropout) elsewhere, as bilm-tf's
    DropoutWrapper does, and the residual (layers >= 1 with skip connections) adds the
    dropped-out input. Outputs are 0 where mask is False, and masked positions leave the state
    unchanged. Matmuls run in `config.compute_dtype`; `config.scan_unroll` unrolls the time loop; the layers
    run as `schedule(config)` says, to the same numbers. `reset_BT` (B, T; bool) restarts the
    state from zero where True, so that a row can hold several sentences back to back; it is
    for inference: with it, gradients come from JAX's own differentiation of the loop, not the
    hand-written one. `gates_2BTG` (2, B, T, 4C): layer 0's `input_gates` of x_2BTP, already
    computed (gathered from a table of distinct tokens), for the layers schedule and with `reset_BT`;
    so are params whose W_0 is split (`split_input_weights`). `mark` is applied to the weights a
    time loop reads once stacked (under shard_map: marking them device-varying, so that their
    gradients are summed over devices as the loop's backward makes them, a stack at a time).
    """
    cfg = config.lstm
    st = _Stack(
        _Clips(cfg.cell_clip, cfg.proj_clip),
        cfg.use_skip_connections,
        dropout,
        config.scan_unroll,
        config.compute_dtype,
        cell(config),
    )
    groups = (
        [range(cfg.n_layers)]
        if schedule(config) == "wavefront"
        else [range(layer, layer + 1) for layer in range(cfg.n_layers)]
    )
    split = "W_h" in params["layer_0"]
    if (gates_2BTG is not None or split) and (len(groups[0]) > 1 or reset_BT is None):
        raise ValueError(
            "precomputed input gates and split weights need layers in loops of their own (the layers schedule) "
            "and reset_BT"
        )
    mark = mark or (lambda x: x)
    outputs, hs, cs, layer_in = [], [], [], x_2BTP
    for layers in groups:  # one time loop each
        first, L = layers[0], len(layers)
        each = [params[f"layer_{layer}"] for layer in layers]
        if keep_masks is not None:
            layer_in = apply_dropout(keep_masks[first], layer_in, dropout)
        keep = None if keep_masks is None or L == 1 else keep_masks[first + 1 : first + L]
        h0, c0 = jnp.swapaxes(state.h[:, first : first + L], 0, 1), jnp.swapaxes(state.c[:, first : first + L], 0, 1)
        if reset_BT is None:
            W_0b, W_proj = mark(with_bias(_stacked(each, "W_0"), _stacked(each, "B"))), mark(_stacked(each, "W_P_0"))
            out, h, c = _wavefront(W_0b, W_proj, layer_in, mask_BT, keep, h0, c0, st)
        else:
            W_0 = (_stacked(each, "W_x"), _stacked(each, "W_h")) if split else _stacked(each, "W_0")
            stacked = [W_0, _stacked(each, "B"), _stacked(each, "W_P_0")]
            gates = gates_2BTG if first == 0 else None
            (out, h, c), _ = _wave_forward(*stacked, layer_in, mask_BT, keep, h0, c0, st, False, reset_BT, gates)
        if cfg.use_skip_connections and first > 0:  # the wavefront adds the residual of its layers >= 1 itself
            out = out.at[0].set(jnp.where(mask_BT[None, :, :, None], out[0] + layer_in, 0.0))
        outputs.append(out)
        hs.append(h)
        cs.append(c)
        layer_in = out[-1]
    return jnp.concatenate(outputs), LSTMState(
        jnp.swapaxes(jnp.concatenate(hs), 0, 1), jnp.swapaxes(jnp.concatenate(cs), 0, 1)
    )


def schedule(config: ModelConfig) -> str:
    """ "wavefront" or "layers": config.lstm_schedule, with "auto" resolved for the default
    backend (layers on CPU, where weight traffic bounds the loops of the published sizes)."""
    if config.lstm_schedule != "auto":
        return config.lstm_schedule
    return "layers" if backend() == "cpu" else "wavefront"


def cell(config: ModelConfig) -> str:
    """ "xla" or "pallas": config.lstm_cell, with "auto" resolved for the default backend (our
    kernels on GPUs, where they measured 1.05-1.10x XLA's cell a train step on an H200, for the
    wavefront of 2+ layers that they are written for; XLA's cell elsewhere)."""
    if config.lstm_cell != "auto":
        return config.lstm_cell
    ours = backend() == "gpu" and schedule(config) == "wavefront" and config.lstm.n_layers >= 2
    return "pallas" if ours else "xla"


def dropout_keep_masks(rng: jax.Array, rate: float, n: int, shape: tuple[int, ...]) -> jax.Array:
    """n independent keep masks (n, *shape), each element True with probability 1 - rate."""
    return jnp.stack([jax.random.bernoulli(jax.random.fold_in(rng, i), 1.0 - rate, shape) for i in range(n)])


def apply_dropout(keep: jax.Array, x: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout: zero where `keep` is False, scale the rest by 1 / (1 - rate)."""
    return jnp.where(keep, x / (1.0 - rate), 0.0)
