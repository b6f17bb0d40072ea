"""The LSTM cell of the wavefront's training step as Pallas kernels of our own
(`lstm_cell="pallas"`), two a step each way around the step's matmuls, where XLA's fusions of
the same arithmetic take 8 and 7 and write each save slot with a kernel of its own:

- forward, after the gates' matmul (`forward_cell`): the gate activations, written to their save
  slot, the cell update, the carried and saved cell, and the projection's operand o * tanh(c),
  saved too; after the projection (`forward_output`): its clip and mask, the carried and saved
  h, the layers' outputs with the residual, saved, and the next step's matmul operand
  [inputs; h] with the dropout on the inputs from the layer below;
- backward, after the projection's transposed matmul (`backward_cell`): the cell's gradient and
  the gates' gradient, written to its save slot and as the operand of the matmul that carries
  it back; after that matmul (`backward_output`): the h gradient carried back, the input
  gradients (saved: layer 0's leave the stack, the others are passed down a step later) and the
  next step's gradient of the unclipped projection.

On GPUs they lower to Triton; elsewhere (this project's tests) Pallas interprets them, to the
same numbers as the XLA cell (`lstm._wave_forward`, `lstm._wavefront_bwd`). Save slots are whole
buffers passed through (`input_output_aliases`) and written at the step's slot in place; each
kernel declares the bytes it reads and writes in its custom call's metadata (`BYTES_KEY`), which
`elmo_jax.plan` reads. A grid program handles a block of rows (of one layer and direction) and
of the cell's columns, the four gates of those columns together.

No kernel of XLA's runs between ours: a matmul that contracts over the cell's columns with a
small result (the projection, the gates' transposed product) runs as a batch of products over
parts of those columns (`parts`), which `forward_output` and `backward_output` add, where XLA
would split it itself and add the parts in a kernel of its own. The gates' weights and the
arrays of gates come with the cell's columns in the backward product's parts.
"""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from elmo_jax.errors import UserError
from elmo_jax.model.backend import backend

# Per gate i, j, f, o: (slope, offset, shift) of act = slope * tanh(slope * z + offset) + shift,
# the four activations [sigmoid(i), tanh(j), sigmoid(f + 1), sigmoid(o)] as one tanh
# (sigmoid(x) = tanh(x / 2) / 2 + 1 / 2; the +1 forget bias as the offset 1/2).
GATES = ((0.5, 0.0, 0.5), (1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, 0.0, 0.5))
BYTES_KEY = "elmo_jax.bytes"  # the custom call's metadata: bytes it reads and writes in device memory
FLOPS_KEY = "elmo_jax.flops"  # and the floating-point operations of its products, where it has any
_BLOCK_ROWS, _BLOCK_COLUMNS = 32, 128  # at most: a block's rows divide B, its columns C (powers of 2)
# A matmul whose contraction runs over the cell's C columns is split into parts (`parts`) until
# its result has about this many blocks of 128 x 128 to compute in parallel (an H200 has 132
# SMs), as XLA splits a long contraction with a small result anyway: then its partial sums are
# added by our kernel after it, not by a kernel of XLA's of their own, each step. A part has at
# least _PART_COLUMNS columns, and the kernels' blocks as many as divide every part.
_PARALLEL_BLOCKS, _PART_COLUMNS = 128, 32


class _Block:
    """Where grid program (i, k) works: its rows of the (L * D * B, .) arrays (of one layer and
    direction: `layer`, `d`, and `b` of the B rows) and its columns, the slot s (the loop's
    counter, or S - 1 - it where the loop counts down), and which rows ran at s (the mask
    (L, B, S))."""

    def __init__(self, counter_ref, mask_ref, n_rows: int, n_columns: int, B: int, D: int, down: bool):
        i, self._k = pl.program_id(0), pl.program_id(1)
        first, self._n_rows, self._n_columns, self._layer_rows = i * n_rows, n_rows, n_columns, D * B
        self.layer, self.d, self.b = first // (D * B), first // B % D, pl.ds(first % B, n_rows)
        self.ld = first // B  # the layer and direction's index in arrays (L * D, ...)
        self._first_column = self._k * n_columns
        self.s = mask_ref.shape[2] - 1 - counter_ref[0] if down else counter_ref[0]
        self.rows, self.columns = pl.ds(first, n_rows), self.columns_from(0)
        self.ran = mask_ref[self.layer, self.b, self.s][:, None] != 0

    def rows_of(self, layer):
        """The rows of the same direction and batch rows in another layer."""
        return pl.ds(layer * self._layer_rows + self.rows.start % self._layer_rows, self._n_rows)

    def columns_from(self, offset: int):
        """This program's columns of an array whose columns start at `offset`."""
        return pl.ds(offset + self._first_column, self._n_columns)

    def in_parts(self, width: int):
        """(the part, its columns) of this program's columns, where the columns are cut into
        parts of `width`, a multiple of a block's columns."""
        return self._first_column // width, pl.ds(self._first_column % width, self._n_columns)


def clipped(x, value: float | None):
    """x clipped to [-value, value] (None: not clipped)."""
    return x if value is None else jnp.clip(x, -value, value)


def clipped_gradient(g, x, value: float | None):
    """The gradient g of a clip's output at its input x: g where |x| < value, else 0."""
    return g if value is None else jnp.where(jnp.abs(x) < value, g, 0.0)


def _summed(parts_ref, ld, rows, columns):
    """The sum over a matmul's partial products (L * D, J, B, N) at layer and direction ld, in
    order."""
    total = parts_ref[ld, 0, rows, columns]
    for j in range(1, parts_ref.shape[1]):
        total += parts_ref[ld, j, rows, columns]
    return total


def _cell_before(at: _Block, c0_ref, cells_ref):
    """The cell that step at.s reads: the one slot s - 1 keeps, or the initial one (c0's block)."""
    return jax.lax.cond(
        at.s == 0, lambda: c0_ref[...], lambda: cells_ref[at.rows, jnp.maximum(at.s - 1, 0), at.columns]
    )


def _dropped(x, keep_ref, index: tuple, rate: float | None):
    """Inverted dropout of x where the keep mask (int8) at `index` is 0; none where rate is None."""
    return x if rate is None else jnp.where(keep_ref[index] != 0, x / (1.0 - rate), 0.0)


def _forward_kernel(
    s_ref, c0_ref, b_ref, mask_ref, z_ref, _acts, _cells, _a_slots, acts_ref, cells_ref, a_slots_ref, a_ref,
    *, clip, B, D,
):  # fmt: skip
    at = _Block(s_ref, mask_ref, *c0_ref.shape, B, D, down=False)
    j, part_columns = at.in_parts(z_ref.shape[-1])
    acts = []
    for g, (slope, offset, shift) in enumerate(GATES):
        z = z_ref[at.ld, j, at.b, g, part_columns].astype(jnp.float32) + b_ref[0, g, :][None, :]
        act = (slope * jnp.tanh(slope * z + offset) + shift).astype(acts_ref.dtype)
        acts_ref[at.rows, at.s, g, at.columns] = act
        acts.append(act.astype(jnp.float32))  # the values the backward pass reads back
    si, tj, sf, so = acts
    c = _cell_before(at, c0_ref, cells_ref)
    c_new = clipped(sf * c + si * tj, clip)
    cells_ref[at.rows, at.s, at.columns] = jnp.where(at.ran, c_new, c)
    a = (so * jnp.tanh(c_new)).astype(a_ref.dtype)
    j, part_columns = at.in_parts(a_ref.shape[-1])
    a_ref[at.ld, j, at.b, part_columns] = a
    a_slots_ref[at.rows, at.s, at.columns] = a


def _output_kernel(
    s_ref, h_ref, mask_ref, h_raw_ref, x_ref, keep_ref, _h_slots, _outs, h_slots_ref, outs_ref, h_out_ref, rows_ref,
    *, clip, skip, rate, B, D,
):  # fmt: skip
    at = _Block(s_ref, mask_ref, *h_ref.shape, B, D, down=False)
    L, S, P = outs_ref.shape[0], outs_ref.shape[3], outs_ref.shape[4]
    layer, d, b = at.layer, at.d, at.b
    below, after = jnp.maximum(layer - 1, 0), jnp.minimum(at.s + 1, S - 1)

    def dropped(x, keep_layer, slot):  # dropout on the input of layer keep_layer + 1
        return _dropped(x, keep_ref, (keep_layer, d, b, slot, at.columns), rate)

    # This step's inputs: layer 0's x, layer l's the outputs of layer l - 1 a step earlier.
    upper = outs_ref[below, d, b, jnp.maximum(at.s - 1, 0), at.columns]
    upper = jnp.where(at.s == 0, 0.0, dropped(upper, below, at.s))
    inputs = jnp.where(layer == 0, x_ref[d, b, at.s, at.columns], upper)
    h_new = clipped(_summed(h_raw_ref, at.ld, b, at.columns), clip)
    out = jnp.where(at.ran, jnp.where(skip & (layer > 0), h_new + inputs, h_new), 0.0)
    h = jnp.where(at.ran, h_new, h_ref[...])
    h_out_ref[...] = h
    h_slots_ref[layer, d, b, at.s, at.columns] = h
    outs_ref[layer, d, b, at.s, at.columns] = out
    # The next step's matmul operand [inputs; h]: this block's h, and the inputs of the layer
    # above (this block's outputs) or, from the top layer, layer 0's (x).
    above = (layer + 1) % L
    rows_ref[at.rows, at.columns_from(P)] = h.astype(rows_ref.dtype)
    next_inputs = jnp.where(layer == L - 1, x_ref[d, b, after, at.columns], dropped(out, layer, after))
    rows_ref[at.rows_of(above), at.columns] = next_inputs.astype(rows_ref.dtype)


def _backward_kernel(
    i_ref, d_a_ref, d_c_ref, c0_ref, mask_ref, acts_ref, cells_ref, _d_gates, d_slots_ref, d_gates_ref, d_c_out_ref,
    *, clip, B, D,
):  # fmt: skip
    at = _Block(i_ref, mask_ref, *d_c_ref.shape, B, D, down=True)
    j, part_columns = at.in_parts(d_gates_ref.shape[-1])
    acts = [acts_ref[at.rows, at.s, g, at.columns].astype(jnp.float32) for g in range(4)]
    si, tj, sf, so = acts
    c_new, c_prev = cells_ref[at.rows, at.s, at.columns], _cell_before(at, c0_ref, cells_ref)
    d_a, d_c = d_a_ref[...].astype(jnp.float32), d_c_ref[...]
    tc = jnp.tanh(c_new)
    d_c_raw = jnp.where(at.ran, d_c, 0.0) + d_a * so * (1.0 - tc * tc)
    d_c_raw = clipped_gradient(d_c_raw, c_new, clip)
    d_acts = (d_c_raw * tj, d_c_raw * si, d_c_raw * c_prev, d_a * tc)
    for g, ((slope, _, shift), act, d_act) in enumerate(zip(GATES, acts, d_acts, strict=True)):
        tanh_of_act = (act - shift) / slope
        d_gate = (d_act * slope * slope * (1.0 - tanh_of_act * tanh_of_act)).astype(d_gates_ref.dtype)
        d_gates_ref[at.ld, j, at.b, g, part_columns] = d_gate
        d_slots_ref[at.rows, at.s, g, at.columns] = d_gate
    d_c_out_ref[...] = d_c_raw * sf + jnp.where(at.ran, 0.0, d_c)


def _backward_output_kernel(
    i_ref, d_h_ref, d_h_raw_ref, mask_ref, d_in_h_ref, d_out_ref, h_ref, keep_ref, _d_ins, _d_h_raws,
    d_ins_ref, d_h_raws_ref, d_h_prev_ref, d_h_raw_next_ref, *, clip, skip, rate, B, D,
):  # fmt: skip
    at = _Block(i_ref, mask_ref, *d_h_ref.shape, B, D, down=True)
    L, S, P = d_ins_ref.shape[0], d_ins_ref.shape[3], d_ins_ref.shape[4]
    layer, d, b, s = at.layer, at.d, at.b, at.s

    def ran(l, slot):
        return mask_ref[l, b, slot][:, None] != 0

    def d_in_h(l, columns):  # layer l's gradient of [inputs; h]
        return _summed(d_in_h_ref, l * D + d, b, columns)

    def dropped(x, keep_layer, slot):  # dropout on the input of layer keep_layer + 1
        return _dropped(x, keep_ref, (keep_layer, d, b, slot, at.columns), rate)

    def input_gradient(l):
        """Layer l's input gradient at slot s: its half of the matmul's, and the output gradient
        through the residual (which takes what layer l + 1 passed down at slot s + 1)."""
        later, up = jnp.minimum(s + 1, S - 1), jnp.minimum(l + 1, L - 1)
        passed = dropped(d_ins_ref[up, d, b, later, at.columns], jnp.minimum(l, L - 2), later)
        passed = jnp.where((s < S - 1) & (l < L - 1), passed, 0.0)
        d_out = jnp.where(ran(l, s), d_out_ref[l, d, b, s, at.columns] + passed, 0.0)
        return d_in_h(l, at.columns) + jnp.where(skip & (l > 0), d_out, 0.0)

    d_ins_ref[layer, d, b, s, at.columns] = input_gradient(layer)
    d_h_raws_ref[layer, d, b, s, at.columns] = d_h_raw_ref[...]
    d_h_prev = d_in_h(layer, at.columns_from(P))
    d_h_prev += jnp.where(ran(layer, s), 0.0, d_h_ref[...])
    d_h_prev_ref[...] = d_h_prev
    # Slot s - 1's gradient of the unclipped projection: its output gradient (with what the layer
    # above passes down at slot s, computed here again: another block writes it) and d_h.
    passed = dropped(input_gradient(jnp.minimum(layer + 1, L - 1)), jnp.minimum(layer, L - 2), s)
    passed = jnp.where(layer < L - 1, passed, 0.0)
    earlier = jnp.maximum(s - 1, 0)
    ran_earlier = ran(layer, earlier)
    d_out = jnp.where(ran_earlier, d_out_ref[layer, d, b, earlier, at.columns] + passed, 0.0)
    d_h_raw = d_out + jnp.where(ran_earlier, d_h_prev, 0.0)
    d_h_raw = clipped_gradient(d_h_raw, h_ref[layer, d, b, earlier, at.columns], clip)
    d_h_raw_next_ref[...] = d_h_raw.astype(d_h_raw_next_ref.dtype)


def like(x: jax.Array, shape: tuple[int, ...], dtype=None) -> jax.ShapeDtypeStruct:
    """An output of `shape` as device-varying as x (under shard_map)."""
    return jax.ShapeDtypeStruct(shape, dtype or x.dtype, manual_axis_type=jax.typeof(x).manual_axis_type)


def refuse_where_unable(setting: str, x: jax.Array) -> None:
    """Our kernels are Triton's (GPUs): a UserError on a TPU, and on a CPU where x is
    device-varying (Pallas's interpreter, which runs them in the tests, cannot run inside the
    data-parallel train step's shard_map). `setting` names the setting that picked them."""
    if backend() == "tpu":
        raise UserError(f"{setting}='pallas' has kernels for GPUs (Triton), none for TPUs: use {setting}='xla'")
    if backend() != "gpu" and jax.typeof(x).manual_axis_type.varying:
        raise UserError(
            f"{setting}='pallas' has kernels for GPUs (Triton); on a CPU JAX's Pallas interpreter cannot run them "
            f"inside the data-parallel train step: use {setting}='xla'"
        )


def _call(
    kernel,
    name: str,
    counter,
    blocked,
    whole,
    out_shape,
    out_blocked,
    aliases,
    touched: int,
    mask_LBS,
    parts=(),
    **static,
):
    """pallas_call of `kernel` (with the `static` arguments, B among them) over blocks of (R, C):
    inputs the loop's counter, `blocked` (R, C) or (R, 4, C) cut into blocks, the mask (L, B, S),
    `whole` (passed whole: read or written at slot s); outputs `out_shape`, those with
    `out_blocked` cut into blocks. A block's columns divide C and each width in `parts` (the
    columns' parts that the kernel reads or writes, `in_parts`)."""
    refuse_where_unable("lstm_cell", blocked[0])
    R, C, B = blocked[0].shape[0], blocked[0].shape[-1], static["B"]
    n_rows, n_columns = math.gcd(B, _BLOCK_ROWS), math.gcd(C, _BLOCK_COLUMNS, *parts)

    def spec(x):
        if len(x.shape) == 2:
            return pl.BlockSpec((n_rows, n_columns), lambda i, k: (i, k))
        if x.shape[0] == R:
            return pl.BlockSpec((n_rows, 4, n_columns), lambda i, k: (i, 0, k))
        return pl.BlockSpec((1, 4, n_columns), lambda i, k: (i * n_rows // B, 0, k))  # the rows' layer and direction

    call = pl.pallas_call(
        functools.partial(kernel, **static),
        out_shape=out_shape,
        grid=(R // n_rows, C // n_columns),
        in_specs=(pl.BlockSpec((1,), lambda i, k: (0,)), *map(spec, blocked), *[pl.no_block_spec] * (1 + len(whole))),
        out_specs=tuple(spec(o) if blocked_ else pl.no_block_spec for o, blocked_ in zip(out_shape, out_blocked)),
        input_output_aliases=aliases,
        interpret=backend() != "gpu",
        name=name,
        metadata={BYTES_KEY: json.dumps(int(touched))},
    )
    return call(jnp.reshape(counter, (1,)).astype(jnp.int32), *blocked, mask_LBS, *whole)


def _bytes(shape: tuple[int, ...], dtype) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def parts(C: int, result_size: int) -> int:
    """J, the parts of the cell's C columns that a matmul contracting over them, with a result of
    `result_size` elements, runs as products of their own: a power of 2, doubled while the
    result's blocks are fewer than _PARALLEL_BLOCKS and the parts stay _PART_COLUMNS wide. The
    gates' weights and their products come in such parts, and the projection's operand."""
    J = 1
    while result_size * J < _PARALLEL_BLOCKS * 128 * 128 and C % (2 * J) == 0 and C // (2 * J) >= _PART_COLUMNS:
        J *= 2
    return J


def forward_cell(s, z_LDJBGc, b_LDG, c0_LDBC, mask_LBS, acts_LDBSG, c_LDBSC, a_LDBSC, J: int, clip: float | None):
    """Step s of the wavefront's training forward: gates z (L, D, J', B, 4, C / J') in the
    compute dtype, the cell's columns in J' parts (`parts`; the matmul's rounded result, without
    the bias b (L, D, 4C)), the initial cell (L, D, B, C:
    the cell before slot 0), the mask (L, B, S) int32, and the save slots of the activations
    (L, D, B, S, 4C, compute dtype), of the cell (L, D, B, S, C: the cell each step leaves, the
    one it read where it did not run; the next step reads it there) and of the projection's
    operand (L, D, B, S, C, compute dtype: the projection's weight gradient reads it) -> (the
    three slots with slot s written, the projection's operand o * tanh(c) in the compute dtype,
    its columns in J parts (L, D, J, B, C / J))."""
    L, D, B, C = c0_LDBC.shape
    S, R, dtype = acts_LDBSG.shape[3], L * D * B, acts_LDBSG.dtype
    z, c0 = z_LDJBGc.reshape(L * D, -1, B, 4, z_LDJBGc.shape[-1]), c0_LDBC.reshape(R, C)
    # z and b read, the cell of slot s - 1 (or c0) read, the activations', the cell's slot and a
    # written, the mask's rows
    touched = _bytes(z.shape, z.dtype) + _bytes(b_LDG.shape, b_LDG.dtype) + _bytes(c0.shape, c_LDBSC.dtype)
    touched += _bytes(z.shape, dtype) + _bytes(c0.shape, c_LDBSC.dtype) + 2 * _bytes(c0.shape, dtype) + R * 4
    acts, cells, a_slots, a = _call(
        _forward_kernel,
        "lstm_forward_cell",
        s,
        (c0, b_LDG.reshape(L * D, 4, C)),
        (z, acts_LDBSG.reshape(R, S, 4, C), c_LDBSC.reshape(R, S, C), a_LDBSC.reshape(R, S, C)),
        (
            like(acts_LDBSG, (R, S, 4, C)),
            like(c_LDBSC, (R, S, C)),
            like(a_LDBSC, (R, S, C)),
            like(z, (L * D, J, B, C // J), dtype),
        ),
        (False, False, False, False),
        {5: 0, 6: 1, 7: 2},  # the slots
        touched,
        mask_LBS,
        parts=(z.shape[-1], C // J),
        clip=clip,
        B=B,
        D=D,
    )
    return (
        acts.reshape(acts_LDBSG.shape),
        cells.reshape(c_LDBSC.shape),
        a_slots.reshape(a_LDBSC.shape),
        a.reshape(L, D, J, B, C // J),
    )


def backward_cell(
    i, d_a_LDBC, d_c_LDBC, c0_LDBC, mask_LBS, acts_LDBSG, c_LDBSC, d_gates_LDBSG, J: int, clip: float | None
):
    """Step s = S - 1 - i of the wavefront's backward (i: the loop's counter, so that no kernel
    computes s for this one): the gradient of o * tanh(c) (L, D, B, C) in the
    compute dtype (the projection's transposed matmul, rounded), the carried cell gradient
    (L, D, B, C), the initial cell (L, D, B, C: the cell before slot 0), the mask (L, B, S) int32,
    the forward's saved activations and cells, and the gates' gradient's save slots
    (L, D, B, S, 4C, compute dtype) -> (those slots with slot s written, the gates' gradient
    in the compute dtype, the cell's columns in J parts (L, D, J, B, 4, C / J), the cell gradient
    carried to step s - 1)."""
    L, D, B, C = d_a_LDBC.shape
    S, R, dtype = acts_LDBSG.shape[3], L * D * B, d_gates_LDBSG.dtype
    d_a, d_c = d_a_LDBC.reshape(R, C), d_c_LDBC.reshape(R, C)
    # d_a and the slot's activations read, the cells of slots s and s - 1 read, d_c read and
    # written, the gates' gradient written twice (its slot, the matmul's operand), the mask's rows
    touched = _bytes(d_a.shape, d_a.dtype) + _bytes((R, 4, C), acts_LDBSG.dtype) + 2 * _bytes(d_c.shape, c_LDBSC.dtype)
    touched += 2 * _bytes(d_c.shape, d_c.dtype) + 2 * _bytes((R, 4, C), dtype) + R * 4
    slots, d_gates, d_c_prev = _call(
        _backward_kernel,
        "lstm_backward_cell",
        i,
        (d_a, d_c, c0_LDBC.reshape(R, C)),
        (acts_LDBSG.reshape(R, S, 4, C), c_LDBSC.reshape(R, S, C), d_gates_LDBSG.reshape(R, S, 4, C)),
        (like(d_gates_LDBSG, (R, S, 4, C)), like(d_a, (L * D, J, B, 4, C // J), dtype), like(d_c, (R, C))),
        (False, False, True),
        {7: 0, 2: 2},  # the slots; d_c's block read, then written: in place
        touched,
        mask_LBS,
        parts=(C // J,),
        clip=clip,
        B=B,
        D=D,
    )
    d_gates = d_gates.reshape(L, D, J, B, 4, C // J)
    return slots.reshape(d_gates_LDBSG.shape), d_gates, d_c_prev.reshape(d_c_LDBC.shape)


def forward_output(s, h_raw_LDJBP, h_LDBP, mask_LBS, x_DBSP, keep_KDBSP, h_LDBSP, out_LDBSP, clip, skip, rate, dtype):
    """Step s of the wavefront's training forward after the projection: its result h_raw as J
    partial sums (L, D, J, B, P) float32, added here, the carried h (L, D, B, P), the mask
    (L, B, S) int32, the inputs x (D, B, S, P), the dropout's keep masks (L - 1, D, B, S, P) int8
    or None (`rate` None), and the save slots of h and of the layers' outputs (L, D, B, S, P) ->
    (those slots with slot s written, the new carried h, the next step's matmul operand
    [inputs; h] (L, D, B, 2P) in `dtype`). `clip`: the projection's; `skip`: the residual around
    layers >= 1."""
    L, D, B, P = h_LDBP.shape
    R = L * D * B
    J, h = h_raw_LDJBP.shape[2], h_LDBP.reshape(R, P)
    keep = jnp.zeros((1, 1, 1, 1, 1), jnp.int8) if keep_KDBSP is None else keep_KDBSP
    # h_raw's parts, h and the inputs read (and the keep masks of this step and the next), h
    # written in place and into its slot, the outputs into theirs, the next matmul's operand;
    # the mask's rows
    touched = (J + 5) * _bytes(h.shape, h.dtype) + _bytes((R, 2 * P), dtype) + (2 * R * P if rate else 0) + R * 4
    h_slots, outs, h_new, rows = _call(
        _output_kernel,
        "lstm_forward_output",
        s,
        (h,),
        (h_raw_LDJBP.reshape(L * D, J, B, P), x_DBSP, keep, h_LDBSP, out_LDBSP),
        (
            like(h_LDBSP, h_LDBSP.shape),
            like(out_LDBSP, out_LDBSP.shape),
            like(h, h.shape),
            like(h, (R, 2 * P), dtype),
        ),
        (False, False, True, False),
        {6: 0, 7: 1, 1: 2},  # the slots; h's block read, then written: in place
        touched,
        mask_LBS,
        clip=clip,
        skip=skip,
        rate=rate,
        B=B,
        D=D,
    )
    return h_slots, outs, h_new.reshape(h_LDBP.shape), rows.reshape(L, D, B, 2 * P)


def backward_output(
    i, d_in_h_LDJBK, d_h_LDBP, d_h_raw_LDBP, mask_LBS, d_out_LDBSP, h_LDBSP, keep_KDBSP, d_in_LDBSP, d_h_raw_LDBSP,
    clip, skip, rate,
):  # fmt: skip
    """Step s = S - 1 - i of the wavefront's backward after the gates' transposed matmul: its
    result d_in_h as J partial sums (L, D, J, B, 2P) float32, added here (the gradient of each
    layer's [inputs; h]; a product for each part of the cell's columns), the carried h gradient
    (L, D, B, P), this step's gradient of the unclipped projection d_h_raw (L, D, B, P, compute
    dtype), the mask (L, B, S) int32, the outputs' gradients, the forward's saved h (L, D, B, S,
    P), the keep masks (L - 1, D, B, S, P) int8 or None (`rate` None), and the save slots of the
    layers' input gradients (L, D, B, S, P, float32: layer 0's is the stack's; the others are read
    by the next step, as what each layer passes down) and of d_h_raw -> (those slots with slot s
    written, the h gradient carried to slot s - 1, slot s - 1's d_h_raw). `clip`: the
    projection's; `skip`: the residual around layers >= 1."""
    L, D, B, P = d_h_LDBP.shape
    R = L * D * B
    J, d_h, d_h_raw = d_in_h_LDJBK.shape[2], d_h_LDBP.reshape(R, P), d_h_raw_LDBP.reshape(R, P)
    keep = jnp.zeros((1, 1, 1, 1, 1), jnp.int8) if keep_KDBSP is None else keep_KDBSP
    # In float32, each (R, P): d_in_h's two halves and the inputs' half of the layer above read
    # (J parts each), d_h read and written, the output gradients of slots s and s - 1, h of slot s - 1 and the
    # input gradients passed down (to this layer and the one above) read, the input gradient
    # written; d_h_raw read, written into its slot and for the next step; the keep masks of three
    # slots; the mask's rows.
    f32 = _bytes(d_h.shape, jnp.float32)
    touched = (3 * J + 2 + 5 + 1) * f32 + 3 * _bytes(d_h.shape, d_h_raw.dtype) + (3 * R * P if rate else 0) + R * 4
    d_ins, d_h_raws, d_h_prev, d_h_raw_next = _call(
        _backward_output_kernel,
        "lstm_backward_output",
        i,
        (d_h, d_h_raw),
        (d_in_h_LDJBK.reshape(L * D, J, B, 2 * P), d_out_LDBSP, h_LDBSP, keep, d_in_LDBSP, d_h_raw_LDBSP),
        (
            like(d_in_LDBSP, d_in_LDBSP.shape),
            like(d_h_raw_LDBSP, d_h_raw_LDBSP.shape),
            like(d_h, d_h.shape),
            like(d_h_raw, d_h_raw.shape),
        ),
        (False, False, True, True),
        {8: 0, 9: 1, 1: 2, 2: 3},  # the slots; d_h's and d_h_raw's blocks read, then written: in place
        touched,
        mask_LBS,
        clip=clip,
        skip=skip,
        rate=rate,
        B=B,
        D=D,
    )
    return d_ins, d_h_raws, d_h_prev.reshape(d_h_LDBP.shape), d_h_raw_next.reshape(d_h_LDBP.shape)
