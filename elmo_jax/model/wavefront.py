"""The LSTM layers' time loop as a wavefront (`lstm` says when it runs): both directions and
L layers of the biLM in one loop, loop step s running layer l at time s - l for every l (a
single layer is a wavefront of one), and its gradient written by hand, running the same diagonal
backwards; the training step's cell as XLA's fusions or as our Pallas kernels (`cell_kernels`).
The arithmetic of the cell is `cell_math`'s.

Letters: L layers, D directions, B rows, T times, S = T + L - 1 slots, P projection, C cell,
G = 4C gates, Q = 2P the rows of [inputs; h] (the gates' matmul in the loop), K = 2P + 1 the
rows of W_0 with the bias's (`with_bias`), U = L - 1 the layers above the first (the dropout on
their inputs), J the parts of the cell's columns that our kernels' matmuls run in, N the layers
whose outputs the wavefront returns (L, or 1: the top's, `Stack.top_only`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.model.backend import backend
from elmo_jax.model.cell_kernels import (
    backward_cell,
    backward_cell_and_gates_product,
    backward_output,
    forward_cell,
    gates_and_forward_cell,
    parts,
    projection_and_output,
)
from elmo_jax.model.cell_math import (
    GATES,
    activation,
    activation_gradient,
    cell_gradients,
    cell_update,
    clipped,
    clipped_gradient,
    gate_constants,
)
from elmo_jax.model.dropout import apply_dropout
from elmo_jax.model.matmul import einsum, narrow, rounded_einsum, rounds_results, widened


class Clips(NamedTuple):
    cell: float | None
    proj: float | None


class Stack(NamedTuple):
    """What the wavefront needs besides arrays (hashable: a custom_vjp static argument)."""

    clips: Clips
    skip: bool  # residual around layers >= 1
    dropout: float  # the rate of `keep`, the dropout on layers >= 1's inputs
    unroll: int
    dtype: str
    # "xla", "pallas" or "fused": the training step's cell as kernels of our own (`cell_kernels`);
    # "fused": the cells' kernels with the gates' matmul (forward) and its transpose (backward) in them
    cell: str
    # Outputs of the top layer alone (1, D, B, T, P), not every layer's: where only the top feeds
    # the loss (training), its backward reads no output gradient of the layers below (0)
    top_only: bool = False


class _Wave(NamedTuple):
    """A time loop's inputs by slot: S = T + L - 1 slots, slot s holds layer l's time s - l."""

    x_DBSP: jax.Array  # layer 0's inputs, padded to S slots
    mask_LBS: jax.Array  # where each layer's step ran (False outside its 0..T-1)
    keep_UDBSP: jax.Array | None  # the dropout's keep masks on layers >= 1's inputs, by slot
    skip_L: np.ndarray  # (L, 1, 1, 1): the residual around layer l
    T: int


class _Slots(NamedTuple):
    """The training forward's save buffers (L, D, B, S, .), written at each step's slot: the
    state h and c each step leaves (slot s - 1's is what step s read), its gate activations (in
    the compute dtype: with bfloat16 matmuls, half the bytes of the loops' largest arrays), the
    layers' outputs (several layers: layers >= 1 read the layer below's of the step before from
    its slot, not carried) and the projection's operand o tanh(c) (compute dtype: W_proj's
    gradient reads it, as the projection does)."""

    h: jax.Array
    acts: jax.Array
    c: jax.Array
    out: jax.Array | None
    a: jax.Array


class _Saved(NamedTuple):
    """What the training forward leaves its backward pass; by slot (L, D, B, S, .) where named so."""

    W_0: jax.Array  # (L, D, 2P, G), without the bias's row
    h0: jax.Array  # the initial state (L, D, B, P) and (L, D, B, C)
    c0: jax.Array
    W_loop: jax.Array  # the weights as the loop read them (cast; with our kernels, in J parts)
    W_proj_loop: jax.Array
    mask_LBS: jax.Array
    keep_UDBSP: jax.Array | None
    in_LDBSP: jax.Array  # each layer's inputs
    h_LDBSP: jax.Array  # _Slots' h, acts and c
    acts_LDBSG: jax.Array
    c_LDBSC: jax.Array
    a_LDBSC: jax.Array  # the projection's operand


class _GradientSlots(NamedTuple):
    """The backward pass's save buffers (L, D, B, S, .): the gates' gradient and the unclipped
    projection's (compute dtype: the weight gradients' matmuls read them) and, with several
    layers, the input gradients: layer 0's (1, D, B, S, P), the stack's, or (our kernels) every
    layer's, as the next step reads what each passes down."""

    d_gates: jax.Array
    d_h_raw: jax.Array
    d_in: jax.Array | None


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


def _unskew(x: jax.Array, T: int, axis: int, first: int = 0) -> jax.Array:
    """`_skew` undone: axis 0 holds layers first, first + 1, ..."""
    return jnp.stack(
        [
            jax.lax.slice_in_dim(x[i], layer, layer + T, axis=axis - 1)
            for i, layer in enumerate(range(first, first + x.shape[0]))
        ]
    )


def _outputs(outs_LDBSP: jax.Array, T: int, st: Stack) -> jax.Array:
    """The layers' outputs by slot -> by time: every layer's (L, D, B, T, P), or the top layer's
    alone (1, D, B, T, P) with `st.top_only`."""
    L = outs_LDBSP.shape[0]
    first = L - 1 if st.top_only else 0
    return _unskew(outs_LDBSP[first:], T, axis=3, first=first)


def _at_slot(x: jax.Array, s, axis: int = 3) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(x, s, axis=axis, keepdims=False)


def _put_slot(buffer: jax.Array, s, value: jax.Array, axis: int = 3) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(buffer, value, s, axis=axis)


def _saved_operand(buffer: jax.Array, s, value: jax.Array) -> jax.Array:
    """A matmul's operand `value`, just saved to slot s of `buffer`, in the buffer's dtype: read
    back from the slot on TPUs, whose matmuls read a slot in place (so the pass computing it
    writes it once); elsewhere the value, which a GPU's library matmul would copy out of the slot."""
    return _at_slot(buffer, s) if backend() == "tpu" else narrow(value, buffer.dtype)


def input_gates(W_0: jax.Array, b: jax.Array, x_DNP: jax.Array, dtype: str = "float32") -> jax.Array:
    """One layer's input half of the gates of each direction, x @ W_0[:P] + b: W_0 (D, 2P, 4C)
    (or its input half W_x, (D, P, 4C)), b (D, 4C), inputs (D, ..., P) -> (D, ..., 4C)."""
    P = x_DNP.shape[-1]
    return einsum("d...p,dpg->d...g", x_DNP, W_0[:, :P], dtype) + jnp.expand_dims(b, range(1, x_DNP.ndim - 1))


def _skip_L(L: int, st: Stack) -> np.ndarray:
    """(L, 1, 1, 1): whether layer l has the residual around it (layers >= 1 with `st.skip`)."""
    return np.array([st.skip and layer > 0 for layer in range(L)])[:, None, None, None]


def _wave(x_DBTP: jax.Array, mask_BT: jax.Array, keep: jax.Array | None, L: int, st: Stack) -> _Wave:
    """The inputs (D, B, T, P), mask (B, T) and keep masks (L - 1, D, B, T, P) of L layers by slot."""
    T = x_DBTP.shape[2]
    S = T + L - 1
    x_DBSP = jnp.pad(x_DBTP, ((0, 0), (0, 0), (0, S - T), (0, 0)))
    mask_LBS = _skew(jnp.broadcast_to(mask_BT, (L, *mask_BT.shape)), S, axis=2, fill=False)
    keep_UDBSP = None if keep is None else _skew(keep, S, axis=3, fill=False, first=1)
    return _Wave(x_DBSP, mask_LBS, keep_UDBSP, _skip_L(L, st), T)


def _gate_inputs(wave: _Wave, W_loop, b, gates_x_1DBSG, st: Stack):
    """-> gates(s, h, outs): step s's layers' inputs (L, D, B, P) and gate pre-activations
    (L, D, B, G), from the state h it reads and (several layers) the layers' outputs by slot.
    One layer adds its input half, computed for all slots before the loop (`gates_x_1DBSG`), to
    h's; several run one batched matmul [inputs; h] @ W_0 a step. The matmul's result, the loop's
    largest array, is rounded to the compute dtype (half its bytes written and read; XLA on CPU
    rounds it anyway, which the tests check)."""

    def one_layer(s, h, outs):
        inputs = _at_slot(wave.x_DBSP, s, axis=2)[None]
        return inputs, _at_slot(gates_x_1DBSG, s) + einsum("ldbp,ldpg->ldbg", h, W_loop, st.dtype, rounded=True)

    def layers(s, h, outs_LDBSP):
        # Layer l >= 1 reads layer l - 1's output of the last step (none before slot 0: the
        # uninitialised slot is not read, as layers >= 1 start at slot l).
        upper = jnp.where(s == 0, 0.0, _at_slot(outs_LDBSP, jnp.maximum(s - 1, 0))[:-1])
        if wave.keep_UDBSP is not None:
            upper = apply_dropout(_at_slot(wave.keep_UDBSP, s), upper, st.dropout)
        inputs = jnp.concatenate([_at_slot(wave.x_DBSP, s, axis=2)[None], upper])
        rows = jnp.concatenate([inputs, h], axis=-1)
        return inputs, einsum("ldbq,ldqg->ldbg", rows, W_loop, st.dtype, rounded=True) + b[:, :, None]

    return one_layer if gates_x_1DBSG is not None else layers


def _cell(acts, c, st: Stack):
    """XLA's cell after the gates: the four gates' activations (each L, D, B, C) and the cell c
    it read -> (the new cell, the projection's operand a = o tanh(c), each L, D, B, C)."""
    si, tj, sf, so = acts
    c_new = cell_update(si, tj, sf, c, st.clips.cell)
    return c_new, so * jnp.tanh(c_new)


def _project(a, c_new, h, c, inputs, m, W_proj_loop, skip_L, st: Stack):
    """XLA's cell's output: the projection's operand a and the new cell (`_cell`), the state h,
    c it read, the layers' inputs, where it ran (L, D, B, 1) -> (the state it leaves h, c, the
    layers' outputs)."""
    h_new = clipped(einsum("ldbc,ldcp->ldbp", a, W_proj_loop, st.dtype), st.clips.proj)
    out = _layer_outputs(h_new, inputs, m, skip_L)
    return jnp.where(m, h_new, h), jnp.where(m, c_new, c), out


def _read_gates(acts_LDBSG: jax.Array, s) -> list[jax.Array]:
    """Slot s's four gates' activations, each (L, D, B, C) float32: each gate sliced from the
    slots on its own and widened after (widening is exact), so that each fusion that reads one
    reads it in the slots' dtype, and no copy of the slot is written."""
    L, D, B, S, G = acts_LDBSG.shape
    C = G // 4
    return [
        widened(jax.lax.dynamic_slice(acts_LDBSG, (0, 0, 0, s, gate * C), (L, D, B, 1, C))[:, :, :, 0])
        for gate in range(4)
    ]


def _loop_weights(W_0, W_proj, x_DBSP, b, st: Stack, gates_DBTG=None, J: int | None = None):
    """The weights a loop reads, sliced and cast here, once (XLA would slice and convert a
    loop-invariant weight again at every step): one layer's recurrent half W_h (L, D, P, G) and
    its input half's product for all slots (1, D, B, S, G: `gates_DBTG` where given), several
    layers' W_0 (L, D, 2P, G), in J parts of the cell's columns (L, D, J, 2P, 4, C / J) for our
    kernels (`cell_kernels.parts`); and W_proj (L, D, C, P). W_0 may come as its halves (W_x,
    W_h) (`split_input_weights`). -> (W_loop, W_proj_loop, the input half's gates or None)."""
    split = isinstance(W_0, tuple)
    L, P = (W_0[1] if split else W_0).shape[0], x_DBSP.shape[-1]
    gates_x_1DBSG = None
    if L == 1:
        W_x, W_loop = W_0 if split else (W_0[:, :, :P], W_0[:, :, P:])
        gates_x_1DBSG = (input_gates(W_x[0], b[0], x_DBSP, st.dtype) if gates_DBTG is None else gates_DBTG)[None]
    else:
        W_loop = W_0
    if J is not None:
        C = W_proj.shape[2]
        W_loop = jnp.moveaxis(W_loop.reshape(L, -1, 2 * P, 4, J, C // J), 4, 2)
    return W_loop.astype(st.dtype), W_proj.astype(st.dtype), gates_x_1DBSG


def wave_infer(W_0, b, W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st: Stack, *, reset_BT=None, gates_DBTG=None):
    """L layers without saving anything for a backward pass -> outputs (L, D, B, T, P), or the top
    layer's alone (1, D, B, T, P) with `st.top_only`, final h (L, D, B, P) and c (L, D, B, C).
    Arrays as `wavefront`'s, W_0 (L, D, 2P, G) and b (L, D, G) apart or W_0 as one layer's halves
    (W_x, W_h) each (1, D, P, G) (`split_input_weights`). Where `reset_BT` is True the state
    restarts from zero (another sentence in the row). `gates_DBTG`: one layer's `input_gates` of
    x, already computed."""
    L = W_proj.shape[0]
    wave = _wave(x_DBTP, mask_BT, keep, L, st)
    S = wave.mask_LBS.shape[2]
    W_loop, W_proj_loop, gates_x_1DBSG = _loop_weights(W_0, W_proj, wave.x_DBSP, b, st, gates_DBTG)
    gates = _gate_inputs(wave, W_loop, b, gates_x_1DBSG, st)
    slope, offset, shift = gate_constants(W_proj.shape[2])
    if reset_BT is not None:  # applied to the state a step leaves for the next (slot 0's: before the loop)
        reset_LBS = _skew(jnp.broadcast_to(reset_BT, wave.mask_LBS.shape[:2] + (wave.T,)), S, axis=2, fill=False)
        first = reset_LBS[:, None, :, 0, None]
        h_LDBP, c_LDBC = jnp.where(first, 0.0, h_LDBP), jnp.where(first, 0.0, c_LDBC)
        reset_after_LBS = jnp.pad(reset_LBS[:, :, 1:], ((0, 0), (0, 0), (0, 1)))

    def step(s, carry):
        h, c, outs = carry
        inputs, z = gates(s, h, outs)
        m = wave.mask_LBS[:, None, :, s, None]
        c_new, a = _cell(jnp.split(activation(z, slope, offset, shift), 4, axis=-1), c, st)
        h, c, out = _project(a, c_new, h, c, inputs, m, W_proj_loop, wave.skip_L, st)
        outs = _put_slot(outs, s, out)
        if reset_BT is not None:
            restart = reset_after_LBS[:, None, :, s, None]
            h, c = jnp.where(restart, 0.0, h), jnp.where(restart, 0.0, c)
        return h, c, outs

    outs = _slots_like(x_DBTP, (*h_LDBP.shape[:3], S, h_LDBP.shape[-1]), x_DBTP.dtype)
    h, c, outs = jax.lax.fori_loop(0, S, step, (h_LDBP, c_LDBC, outs), unroll=st.unroll)
    return _outputs(outs, wave.T, st), h, c


def _train_slots(x_DBTP: jax.Array, L: int, D: int, B: int, S: int, C: int, st: Stack) -> _Slots:
    """Empty save buffers of the training forward (`_Slots`)."""
    P, f32 = x_DBTP.shape[-1], x_DBTP.dtype

    def slots(width, dtype):
        return _slots_like(x_DBTP, (L, D, B, S, width), dtype)

    h, acts, c = slots(P, f32), slots(4 * C, st.dtype), slots(C, f32)
    out = slots(P, f32) if L > 1 else None
    return _Slots(h, acts, c, out, slots(C, st.dtype))


def _xla_train_loop(wave: _Wave, W_loop, b, W_proj_loop, gates_x_1DBSG, h_LDBP, c_LDBC, slots: _Slots, st: Stack):
    """The training forward with XLA's cell -> (final h, final c, the save buffers written)."""
    gates = _gate_inputs(wave, W_loop, b, gates_x_1DBSG, st)
    slope, offset, shift = gate_constants(W_proj_loop.shape[2])
    L = W_proj_loop.shape[0]

    def step(s, carry):
        h, c, slots = carry
        inputs, z = gates(s, h, slots.out)
        # The activations are saved first and read back: the pass that computes them writes them
        # there once, and the cell uses the values the backward pass reads (with bfloat16
        # matmuls, rounded: the training forward differs from inference's by that rounding).
        slots = slots._replace(
            acts=_put_slot(slots.acts, s, narrow(activation(z, slope, offset, shift), slots.acts.dtype))
        )
        c_new, a = _cell(_read_gates(slots.acts, s), c, st)
        # So is the projection's operand, in the dtype the projection and W_proj's gradient read.
        slots = slots._replace(a=_put_slot(slots.a, s, narrow(a, slots.a.dtype)))
        a = _saved_operand(slots.a, s, a)
        m = wave.mask_LBS[:, None, :, s, None]
        h, c, out = _project(a, c_new, h, c, inputs, m, W_proj_loop, wave.skip_L, st)
        slots = slots._replace(h=_put_slot(slots.h, s, h), c=_put_slot(slots.c, s, c))
        if L > 1:
            slots = slots._replace(out=_put_slot(slots.out, s, out))
        return h, c, slots

    return jax.lax.fori_loop(0, wave.mask_LBS.shape[2], step, (h_LDBP, c_LDBC, slots), unroll=st.unroll)


def _own_train_loop(wave: _Wave, W_loop, b, W_proj_loop, h_LDBP, c_LDBC, slots: _Slots, st: Stack):
    """The training forward with the cell and the outputs as our kernels (several layers), the
    next step's operand [inputs; h] carried -> (final h, final c, the save buffers written).
    W_loop (L, D, J, 2P, 4, C / J): the gates' weights in J parts of the cell's columns. The
    projection runs in the outputs' kernel, from the operand's save slot."""
    L, D, B, P = h_LDBP.shape
    J = W_loop.shape[2]
    C = W_proj_loop.shape[2]
    ran_LBS, keep_8, rate = _kernel_masks(wave.mask_LBS, wave.keep_UDBSP, st.dropout)

    def cell(s, rows, slots):
        """-> acts, cells and a slots: the gates' product in the weights' parts of the cell's
        columns, the rows broadcast to each, then the cell; or both in one kernel (`st.cell`
        "fused")."""
        kept = dict(b_LDG=b, c0_LDBC=c_LDBC, mask_LBS=ran_LBS, acts_LDBSG=slots.acts, c_LDBSC=slots.c, a_LDBSC=slots.a)
        if st.cell == "fused":
            return gates_and_forward_cell(s, rows, W_loop, **kept, clip=st.clips.cell)
        rows_J = jnp.broadcast_to(rows[:, :, None], (L, D, J, B, 2 * P))
        z = rounded_einsum("ldjbq,ldjqn->ldjbn", rows_J, W_loop.reshape(L, D, J, 2 * P, -1), st.dtype)
        return forward_cell(s, z.reshape(L, D, J, B, 4, C // J), **kept, clip=st.clips.cell)

    def step(s, carry):
        h, rows, slots = carry
        acts, cells, a_slots = cell(s, rows, slots)
        h_slots, outs, h, rows = projection_and_output(
            s, a_slots, W_proj_loop, h, mask_LBS=ran_LBS, x_DBSP=wave.x_DBSP, keep_UDBSP=keep_8, h_LDBSP=slots.h,
            out_LDBSP=slots.out, clip=st.clips.proj, skip=st.skip, rate=rate,
        )  # fmt: skip
        return h, rows, _Slots(h_slots, acts, cells, outs, a_slots)

    inputs = jnp.concatenate([wave.x_DBSP[None, :, :, 0], jnp.zeros_like(h_LDBP[1:])])  # slot 0: nothing from below
    rows = narrow(jnp.concatenate([inputs, h_LDBP], axis=-1), st.dtype)
    h, _, slots = jax.lax.fori_loop(0, wave.mask_LBS.shape[2], step, (h_LDBP, rows, slots), unroll=st.unroll)
    return h, slots.c[:, :, :, -1], slots  # the cell each layer kept last (not carried: read from its slot)


def _wave_train(W_0: jax.Array, b, W_proj: jax.Array, x_DBTP: jax.Array, mask_BT, keep, h_LDBP, c_LDBC, st: Stack):
    """The training forward: `wave_infer`'s outputs, final h and c, and what the backward pass
    reads (`_Saved`). Loop step s runs layer l at time s - l for every l (a slot outside 0..T-1
    is masked, so it changes nothing), batched over layers and directions; layer l + 1 reads what
    layer l wrote one step earlier. One layer (L = 1) runs its input half of the gates for all T
    steps in one matmul before the loop, so that each step reads only the recurrent weights.
    With several layers and `st.cell` "pallas" or "fused", the cell runs as our kernels
    (`cell_kernels`)."""
    L, D, B, T, P = W_0.shape[0], *x_DBTP.shape
    C = W_proj.shape[2]
    own_cell = _own_cell(L, st)
    wave = _wave(x_DBTP, mask_BT, keep, L, st)
    S = wave.mask_LBS.shape[2]
    # With our kernels, the cell's columns in J parts, so that the gates' transposed product is J
    # products whose parts the kernel after it adds (`cell_kernels.parts`: its result is small).
    J = parts(C, L * D * B * 2 * P) if own_cell else None
    W_loop, W_proj_loop, gates_x_1DBSG = _loop_weights(W_0, W_proj, wave.x_DBSP, b, st, J=J)
    slots = _train_slots(x_DBTP, L, D, B, S, C, st)
    if own_cell:
        h, c, slots = _own_train_loop(wave, W_loop, b, W_proj_loop, h_LDBP, c_LDBC, slots, st)
    else:
        h, c, slots = _xla_train_loop(wave, W_loop, b, W_proj_loop, gates_x_1DBSG, h_LDBP, c_LDBC, slots, st)
    if L == 1:
        in_LDBSP = wave.x_DBSP[None]
        out_LDBSP = _layer_outputs(slots.h, in_LDBSP, wave.mask_LBS[:, None, :, :, None], wave.skip_L[..., None])
    else:  # each layer's inputs: x, and the outputs of the layer below a slot earlier
        out_LDBSP = slots.out
        upper_UDBSP = jnp.pad(out_LDBSP[:-1, :, :, :-1], ((0, 0),) * 3 + ((1, 0), (0, 0)))
        if wave.keep_UDBSP is not None:
            upper_UDBSP = apply_dropout(wave.keep_UDBSP, upper_UDBSP, st.dropout)
        in_LDBSP = jnp.concatenate([wave.x_DBSP[None], upper_UDBSP])
    saved = _Saved(
        W_0, h_LDBP, c_LDBC, W_loop, W_proj_loop, wave.mask_LBS, wave.keep_UDBSP, in_LDBSP, slots.h, slots.acts,
        slots.c, slots.a,
    )  # fmt: skip
    return (_outputs(out_LDBSP, T, st), h, c), saved


def _own_cell(L: int, st: Stack) -> bool:
    """Whether the training step's cell runs as our kernels: several layers and `st.cell`
    "pallas" or "fused" (both passes decide by this)."""
    return L > 1 and st.cell in ("pallas", "fused")


def _joined(x: jax.Array) -> jax.Array:
    """(L, D, J, N, ..., c) -> (L, D, N, ... * J * c): the J parts of the cell's columns (axis
    2) put back side by side, as the XLA cell has them (the gates' (4, C) as 4C)."""
    x = jnp.moveaxis(x, 2, -2)
    return x.reshape(*x.shape[:3], -1)


def _kernel_masks(mask_LBS, keep_UDBSP, rate: float):
    """The mask and keep masks as `cell_kernels` reads them: int32 (L, B, S), int8 (L - 1, D, B,
    S, P) or None, with the dropout rate (None without keep masks)."""
    keep = (None, None) if keep_UDBSP is None else (keep_UDBSP.astype(jnp.int8), rate)
    return mask_LBS.astype(jnp.int32), *keep


def _layer_outputs(h_new, inputs, mask, skip_L):
    """What a layer passes on: its projection, plus its input where it has a residual; 0 where
    masked."""
    return jnp.where(mask, jnp.where(skip_L, h_new + inputs, h_new), 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def wavefront(W_0b, W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st: Stack):
    """L layers of D directions (params stacked on axes 0 and 1: W_0b (L, D, K, G), W_0's rows
    with the bias as one more (`with_bias`), W_proj (L, D, C, P)) over inputs (D, B, T, P)
    -> outputs (L, D, B, T, P) with the residual added (layers >= 1 with `st.skip`), or the top
    layer's alone (1, D, B, T, P) with `st.top_only` (its backward then takes that layer's output
    gradient alone: the others' are 0, and never in memory), final h (L, D, B, P) and c
    (L, D, B, C). `keep` (L - 1, D, B, T, P) or None: the dropout on the
    inputs of layers >= 1.

    Differentiated by hand, running the same diagonal backwards: the loop holds the matmuls
    that carry the gradient back in time and down the layers; the weight gradients are one
    matmul each over all steps afterwards (W_0b's, the bias's row with it, is that matmul's
    result as it is: summed over devices without a copy)."""
    return wave_infer(W_0b[:, :, :-1], W_0b[:, :, -1], W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st)


def with_bias(W_0: jax.Array, b: jax.Array) -> jax.Array:
    """W_0 (..., 2P, G) and its bias (..., G) -> (..., K, G), the bias the last row."""
    return jnp.concatenate([W_0, b[..., None, :]], axis=-2)


def _wavefront_fwd(W_0b, W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st):
    return _wave_train(W_0b[:, :, :-1], W_0b[:, :, -1], W_proj, x_DBTP, mask_BT, keep, h_LDBP, c_LDBC, st)


def _output_gradient_at(d_out_NDBSP, s, L: int) -> jax.Array:
    """Slot s's gradient of the L layers' outputs (L, D, B, P), from every layer's by slot
    (N = L) or the top layer's alone (N = 1, `Stack.top_only`): the layers' below it 0, a value
    that XLA fuses, not read from memory."""
    d_out = _at_slot(d_out_NDBSP, s)
    if d_out.shape[0] == L:
        return d_out
    return jnp.concatenate([jnp.zeros((L - 1, *d_out.shape[1:]), d_out.dtype), d_out])


def _output_gradients(saved: _Saved, d_out_NDBSP, s, d_h, d_above, st: Stack):
    """Slot s's gradient of the layers' outputs and of their unclipped projections, from the
    outputs' gradients by slot (`_output_gradient_at`). Where the step ran, the state it left is
    its clipped cell and projection: |x| < clip exactly where the unclipped value was. Where it
    did not, every gradient of the step is 0."""
    m = saved.mask_LBS[:, None, :, s, None]
    d_out = _output_gradient_at(d_out_NDBSP, s, m.shape[0])
    d_out = d_out if d_above is None else d_out + d_above
    d_out = jnp.where(m, d_out, 0.0)
    return d_out, clipped_gradient(d_out + jnp.where(m, d_h, 0.0), _at_slot(saved.h_LDBSP, s), st.clips.proj)


def _xla_backward_loop(saved: _Saved, d_out_NDBSP, d_h, d_c, slots: _GradientSlots, st: Stack):
    """The backward pass with XLA's cell -> (the initial state's gradients, the slots written)."""
    L, D, B, S, P = saved.in_LDBSP.shape
    skip_L = _skip_L(L, st)

    def step(i, carry):
        s = S - 1 - i
        # d_above[l]: layer l's output gradient from layer l + 1 (None for one layer); d_h_raw:
        # this step's, computed by the step before (in the pass that computes d_h), in the
        # compute dtype that its matmul and its save slot take.
        d_h, d_c, d_above, d_h_raw, slots = carry
        acts = _read_gates(saved.acts_LDBSG, s)
        # Read, where our kernels compute it again (`cell_math.cell_left`): XLA would compute it in
        # two fusions, each reading the activations and c_prev (v5p at 512 rows: +3.2 GB a step).
        c_new = _at_slot(saved.c_LDBSC, s)
        c_prev = jnp.where(s == 0, saved.c0, _at_slot(saved.c_LDBSC, jnp.maximum(s - 1, 0)))
        m = saved.mask_LBS[:, None, :, s, None]
        d_a = einsum("ldbp,ldcp->ldbc", d_h_raw, saved.W_proj_loop, st.dtype, rounded=True)  # as the forward's gates
        d_acts, d_c_prev = cell_gradients(acts, c_new, c_prev, d_a, d_c, m, st.clips.cell)
        d_gates = [
            activation_gradient(d_act, act, slope, shift) for d_act, act, (slope, _, shift) in zip(d_acts, acts, GATES)
        ]
        # Saved first and read back (as the forward's activations): written once, in the dtype
        # that the transposed matmul below reads (on a GPU too, whose library matmul then copies
        # it out of the slot: still fewer bytes than its fusions computing the gates twice).
        slots = slots._replace(
            d_gates=_put_slot(slots.d_gates, s, narrow(jnp.concatenate(d_gates, axis=-1), slots.d_gates.dtype)),
            d_h_raw=_put_slot(slots.d_h_raw, s, narrow(d_h_raw, slots.d_h_raw.dtype)),
        )
        d_gates = _at_slot(slots.d_gates, s)
        if L == 1:  # the input gradient is one matmul after the loop
            d_h_prev = einsum("ldbg,ldpg->ldbp", d_gates, saved.W_loop, st.dtype) + jnp.where(m, 0.0, d_h)
        else:  # the input gradient of layers >= 1 goes down a layer, layer 0's out of the stack
            d_in_h = einsum("ldbg,ldqg->ldbq", d_gates, saved.W_loop, st.dtype)
            d_h_prev = d_in_h[..., P:] + jnp.where(m, 0.0, d_h)
            d_out = _output_gradients(saved, d_out_NDBSP, s, d_h, d_above, st)[0]
            d_in = d_in_h[..., :P] + jnp.where(skip_L, d_out, 0.0)
            d_upper = d_in[1:]
            if saved.keep_UDBSP is not None:
                d_upper = apply_dropout(_at_slot(saved.keep_UDBSP, s), d_upper, st.dropout)
            d_above = jnp.concatenate([d_upper, jnp.zeros_like(d_in[:1])])
            slots = slots._replace(d_in=_put_slot(slots.d_in, s, narrow(d_in[:1], slots.d_in.dtype)))
        # Slot s - 1's d_h_raw (unused after slot 0)
        d_h_raw = _output_gradients(saved, d_out_NDBSP, jnp.maximum(s - 1, 0), d_h_prev, d_above, st)[1]
        return d_h_prev, d_c_prev, d_above, narrow(d_h_raw, st.dtype), slots

    d_above = jnp.zeros_like(d_h) if L > 1 else None
    d_h_raw = narrow(_output_gradients(saved, d_out_NDBSP, S - 1, d_h, d_above, st)[1], st.dtype)
    d_h0, d_c0, _, _, slots = jax.lax.fori_loop(0, S, step, (d_h, d_c, d_above, d_h_raw, slots), unroll=st.unroll)
    return d_h0, d_c0, slots


def _own_backward_loop(saved: _Saved, d_out_NDBSP, d_h, d_c, slots: _GradientSlots, st: Stack):
    """The backward pass with the cell's and the outputs' gradients as our kernels -> (the
    initial state's gradients, the slots written)."""
    L, D, B, S, P = saved.in_LDBSP.shape
    J = saved.W_loop.shape[2]  # the weights' parts of the cell's columns
    ran_LBS, keep_8, rate = _kernel_masks(saved.mask_LBS, saved.keep_UDBSP, st.dropout)

    def cell(i, d_h_raw, d_c, slots):
        """-> the gates' gradient's slots, the gradient of [inputs; h] (L, D, J or 1, B, 2P) and
        the carried cell gradient: the cell's kernel, then the gates' transposed product; or
        both in one kernel (`st.cell` "fused"; the cell gradient in 2 buffers, `d_c`)."""
        kept = dict(c0_LDBC=saved.c0, mask_LBS=ran_LBS, acts_LDBSG=saved.acts_LDBSG, c_LDBSC=saved.c_LDBSC)
        if st.cell == "fused":
            d_a = rounded_einsum("ldbp,ldcp->ldbc", d_h_raw, saved.W_proj_loop, st.dtype)  # as the forward's gates
            d_gate_slots, d_in_h, d_c = backward_cell_and_gates_product(
                i, d_a, d_c, saved.W_loop, **kept, d_gates_LDBSG=slots.d_gates, clip=st.clips.cell
            )
            if rounds_results(st.dtype):  # the J parts added, rounded once, as the XLA cell's product (XLA on CPU)
                d_in_h = widened(narrow(jnp.sum(d_in_h, axis=2, keepdims=True), st.dtype))
            return d_gate_slots, d_in_h, d_c
        d_gate_slots, d_gates, d_c = backward_cell(
            i, d_h_raw, saved.W_proj_loop, d_c, **kept, d_gates_LDBSG=slots.d_gates, J=J, clip=st.clips.cell
        )
        if rounds_results(st.dtype):  # one product, rounded once, as the XLA cell's (XLA on CPU)
            d_in_h = einsum("ldbg,ldqg->ldbq", _joined(d_gates), _joined(saved.W_loop), st.dtype)[:, :, None]
        else:  # J partial products (the weights' parts), which backward_output adds
            d_gates, W_parts = d_gates.reshape(L, D, J, B, -1), saved.W_loop.reshape(L, D, J, 2 * P, -1)
            d_in_h = einsum("ldjbn,ldjqn->ldjbq", d_gates, W_parts, st.dtype)
        return d_gate_slots, d_in_h, d_c

    def step(i, carry):
        d_h, d_c, d_h_raw, slots = carry
        d_gate_slots, d_in_h, d_c = cell(i, d_h_raw, d_c, slots)
        d_ins, d_h_raws, d_h, d_h_raw = backward_output(
            i, d_in_h, d_h, d_h_raw, mask_LBS=ran_LBS, d_out_NDBSP=d_out_NDBSP, h_LDBSP=saved.h_LDBSP,
            keep_UDBSP=keep_8, d_in_LDBSP=slots.d_in, d_h_raw_LDBSP=slots.d_h_raw, clip=st.clips.proj, skip=st.skip,
            rate=rate,
        )  # fmt: skip
        return d_h, d_c, d_h_raw, _GradientSlots(d_gate_slots, d_h_raws, d_ins)

    d_h_raw = narrow(_output_gradients(saved, d_out_NDBSP, S - 1, d_h, jnp.zeros_like(d_h), st)[1], st.dtype)
    if st.cell == "fused":  # step i reads d_c at i % 2 and writes it at the other
        d_c = jnp.stack([d_c, jnp.zeros_like(d_c)])
    d_h0, d_c0, _, slots = jax.lax.fori_loop(0, S, step, (d_h, d_c, d_h_raw, slots), unroll=st.unroll)
    return d_h0, d_c0[S % 2] if st.cell == "fused" else d_c0, slots


def _wavefront_bwd(st: Stack, saved: _Saved, cotangents):
    d_out_NDBTP, d_h, d_c = cotangents
    L, D, B, S, P = saved.in_LDBSP.shape
    T = S - L + 1
    own_cell = _own_cell(L, st)
    # Every layer's output gradients, or (`st.top_only`) the top layer's alone (1, D, B, S, P).
    # Our kernels read it whole: written once, before anything reads it (the top layer's skew is
    # a pad, which XLA on GPUs fuses into the fusion that reads its last slot before the loop,
    # computing the gradient's producers, the softmax's gradient and the dropout, there again,
    # all of whose operands `elmo_jax plan` counts: +126 MB at the original size and 512 rows).
    # Not for XLA's loop: on TPUs that fusion reads it better (v5p at 128 rows: 43 MB fewer).
    d_out_NDBSP = _skew(d_out_NDBTP, S, axis=3, first=L - d_out_NDBTP.shape[0])
    if own_cell:
        d_out_NDBSP = jax.lax.optimization_barrier(d_out_NDBSP)
    # After the loop, d_gates and d_h_raw are read only by the weight gradients' matmuls, which
    # take them in the compute dtype: kept in it. The bias gradient, their sum, is one more row of
    # W_0's (a column of ones beside its inputs): d_gates are read once.
    d_in = _slots_like(saved.in_LDBSP, saved.in_LDBSP[: L if own_cell else 1].shape, saved.in_LDBSP.dtype)
    slots = _GradientSlots(
        _slots_like(saved.acts_LDBSG, saved.acts_LDBSG.shape, st.dtype),
        _slots_like(saved.h_LDBSP, saved.h_LDBSP.shape, st.dtype),
        d_in if L > 1 else None,
    )
    if own_cell:
        d_h0, d_c0, slots = _own_backward_loop(saved, d_out_NDBSP, d_h, d_c, slots, st)
    else:
        d_h0, d_c0, slots = _xla_backward_loop(saved, d_out_NDBSP, d_h, d_c, slots, st)
    d_W_0_b, d_W_proj = _weight_gradients(saved, slots, st)
    if L == 1:
        d_x_DBSP = einsum("dbsg,dpg->dbsp", slots.d_gates[0], saved.W_0[0, :, :P], st.dtype)
    else:
        d_x_DBSP = slots.d_in[0]
    return d_W_0_b, d_W_proj, d_x_DBSP[:, :, :T], None, None, d_h0, d_c0


def _weight_gradients(saved: _Saved, slots: _GradientSlots, st: Stack):
    """W_0b's gradient (L, D, K, G), the bias's row with it, and W_proj's (L, D, C, P): one matmul
    each over all slots (those outside a layer's 0..T-1 are masked: their d_gates and d_h_raw are
    0)."""
    h_prev_LDBSP = jnp.concatenate([saved.h0[:, :, :, None], saved.h_LDBSP[:, :, :, :-1]], axis=3)
    rows_LDBSK = jnp.concatenate([saved.in_LDBSP, h_prev_LDBSP, jnp.ones_like(h_prev_LDBSP[..., :1])], axis=-1)
    d_W_0_b = einsum("ldbsk,ldbsg->ldkg", rows_LDBSK, slots.d_gates, st.dtype)
    d_W_proj = jnp.swapaxes(einsum("ldbsp,ldbsc->ldpc", slots.d_h_raw, saved.a_LDBSC, st.dtype), 2, 3)
    return d_W_0_b, d_W_proj


wavefront.defvjp(_wavefront_fwd, _wavefront_bwd)
