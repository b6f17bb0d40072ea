"""The LSTM cell of the wavefront's training step as Pallas kernels of our own
(`lstm_cell="pallas"`), two a step each way around the gates' matmul and its transpose, where
XLA's fusions of the same arithmetic take 8 and 7 and write each save slot with a kernel of its
own:

- forward, after the gates' matmul (`forward_cell`): the gate activations, written to their save
  slot, the cell update, the carried and saved cell, and the projection's operand o * tanh(c),
  written once, to its save slot; then the projection (`projection_and_output`: each program
  multiplies its block of rows of that operand, read from its slot, by its block of W_proj's
  columns, the product in registers) with its clip and mask, the carried and saved h, the
  layers' outputs with the residual, saved, and the next step's matmul operand [inputs; h]
  with the dropout on the inputs from the layer below;
- backward (`backward_cell`): the gradient of o * tanh(c), its block of the projection's
  transposed product (d_h_raw times W_proj's transpose: it never reaches device memory), the
  cell the step left, computed again from its activations and the cell before
  (`cell_math.cell_left`: the cells' save slots are read once a step, at s - 1), the cell's
  gradient and the gates' gradient, written to its save slot and as the operand of the matmul
  that carries it back; after that matmul (`backward_output`): the h gradient carried back, the
  input gradients (saved: layer 0's leave the stack, the others are passed down a step later)
  and the next step's gradient of the unclipped projection.

On GPUs they lower to Triton; elsewhere (this project's tests) Pallas interprets them, to the
same numbers as the XLA cell (`wavefront._xla_train_loop`, `wavefront._xla_backward_loop`; the arithmetic
of both is `cell_math`'s). Each kernel takes its inputs and outputs by name (`_call`); save slots
are whole buffers passed through, an output named as its input (`input_output_aliases`), and
written at the step's slot in place; each kernel declares the bytes it reads and writes, counted
from the shapes it touches (`kernel_calls.nbytes`), and the FLOPs of its products, which
`elmo_jax.plan` reads. A grid program handles a block of rows (of one layer and direction) and
of the cell's columns, the four gates of those columns together (the projection's: of its P
columns).

With `lstm_cell="fused"` the gates' matmul runs inside the forward's cell kernel
(`gates_and_forward_cell`: the gates stay in registers) and their gradient's product with the
weights inside the backward's (`backward_cell_and_gates_product`: d_gates written once, to
their slot): two kernels a step forward, three backward.

No kernel of XLA's runs between ours: the gates' transposed product, which contracts over the
cell's columns with a small result, runs as a batch of products over parts of those columns
(`parts`), which `backward_output` adds, where XLA would split it itself and add the parts in a
kernel of its own. The gates' weights and the arrays of gates come with the cell's columns in
its parts.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from elmo_jax.errors import UserError
from elmo_jax.model.backend import backend
from elmo_jax.model.cell_math import (
    GATES,
    activation,
    activation_gradient,
    cell_gradients,
    cell_left,
    cell_update,
    clipped,
    clipped_gradient,
)
from elmo_jax.model.kernel_calls import like, metadata, nbytes, product, refuse_where_unable
from elmo_jax.model.matmul import narrow, rounds_results, widened

_BLOCK_ROWS, _BLOCK_COLUMNS = 32, 128  # at most: a block's rows divide B, its columns C (powers of 2)
# A matmul whose contraction runs over the cell's C columns is split into parts (`parts`) until
# its result has about this many blocks of 128 x 128 to compute in parallel (an H200 has 132
# SMs), as XLA splits a long contraction with a small result anyway: then its partial sums are
# added by our kernel after it, not by a kernel of XLA's of their own, each step. A part has at
# least _PART_COLUMNS columns, a multiple of _PART_ALIGN (the 16 columns a block of Triton's
# products needs at the least), and the kernels' blocks as many as divide every part.
_PARALLEL_BLOCKS, _PART_COLUMNS, _PART_ALIGN = 128, 32, 16
# The kernel with the gates' matmul in it (`gates_and_forward_cell`), at most: a block's rows,
# and columns of each of the 4 gates (a 128 x 256 tile, as Triton's matmuls on Hopper take, in
# 8 warps); the bytes of each row of W that it multiplies at a time (64 rows in bfloat16, 32 in
# float32: the 3 stages of operands that Triton keeps in shared memory fit an A100's, 164 kB;
# `elmo_jax plan` compiles it for each GPU target). Its blocks of rows are each read from L2 once
# per block of columns, and W's once per block of rows: large blocks both ways.
_FUSED_ROWS, _FUSED_COLUMNS, _FUSED_DEPTH_BYTES, _FUSED_WARPS = 128, 64, 128, 8
# Its backward twin (`backward_cell_and_gates_product`), at most: a block's rows, the bytes of its
# columns of the product (of Q = 2P, in the compute dtype: 128 columns in bfloat16, 64 in
# float32), and the cell's columns of each of the 4 gates that it multiplies at a time: the
# largest whose operands fit an A100's shared memory (compiled alone for A100, H100 and H200).
_FUSED_BACK_ROWS, _FUSED_BACK_Q_BYTES, _FUSED_BACK_DEPTH, _FUSED_BACK_WARPS = 32, 256, 16, 8
# The backward cell kernel (`backward_cell`): the bytes of each row of d_h_raw and W_proj that
# it multiplies at a time (64 columns of P in bfloat16, 32 in float32).
_BACK_DEPTH_BYTES = 128
# The projection's kernel (`projection_and_output`), at most: a block's rows and P columns (at
# 128 rows a device, 16 blocks of rows x 8 of P's 512 columns: 128 programs), and the bytes of
# each row of its operand a that it multiplies at a time (128 of C's columns in bfloat16, 64 in
# float32; its operands' stages fit an A100's shared memory: `elmo_jax plan` compiles it).
_PROJ_ROWS, _PROJ_COLUMNS, _PROJ_DEPTH_BYTES = 32, 64, 256


class _Block:
    """Where grid program (i, k) works: its rows of the (L * D * B, .) arrays (of one layer and
    direction: `layer`, `d`, and `b` of the B rows) and its columns, the slot s (the loop's
    counter, or S - 1 - it where the loop counts down), and which rows ran at s (the mask
    (L, B, S))."""

    def __init__(self, counter_ref, mask_ref, *, block: tuple[int, int], B: int, D: int, down: bool):
        i, self._k = pl.program_id(0), pl.program_id(1)
        (n_rows, n_columns), self._layer_rows = block, D * B
        first, self._n_rows, self._n_columns = i * n_rows, n_rows, n_columns
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


# The kernels take their refs by the names `_call` gives them: inputs and outputs by name, an
# output of an input's name the same buffer (read, then written). Slots: whole (R, S, ...) save
# buffers written at slot s.


def _forward_kernel(*, counter, c0, b, mask, z, acts, cells, a_slots, clip, B, D):
    at = _Block(counter, mask, block=c0.shape, B=B, D=D, down=False)
    j, part_columns = at.in_parts(z.shape[-1])
    z_gates = [z[at.ld, j, at.b, g, part_columns] for g in range(4)]
    _cell_after_gates(at, z_gates, b=b, c0=c0, acts=acts, cells=cells, a_slots=a_slots, clip=clip)


def _gates_and_forward_kernel(*, counter, c0, b, mask, rows, W, acts, cells, a_slots, clip, B, D, depth):
    # Grid (row blocks, column blocks), rows fastest: the programs that read a block of W's
    # columns run side by side, so that W is read from device memory once.
    at = _Block(counter, mask, block=c0.shape, B=B, D=D, down=False)
    j, part_columns = at.in_parts(W.shape[-1])

    def accumulate(k, sums):  # the products of `depth` rows of W at a time
        q = pl.ds(k * depth, depth)
        x = rows[at.rows, q]
        return tuple(total + product(x, W[at.ld, j, q, g, part_columns]) for g, total in enumerate(sums))

    zeros = tuple(jnp.zeros(c0.shape, jnp.float32) for _ in range(4))
    sums = jax.lax.fori_loop(0, rows.shape[1] // depth, accumulate, zeros)
    z_gates = [s.astype(acts.dtype) for s in sums]  # rounded as the matmul's result before the cell
    _cell_after_gates(at, z_gates, b=b, c0=c0, acts=acts, cells=cells, a_slots=a_slots, clip=clip)


def _cell_after_gates(at: _Block, z_gates, *, b, c0, acts, cells, a_slots, clip):
    """The forward cell of a block from its gates' pre-activations without the bias (4 blocks in
    the compute dtype): the activations, the cell and the projection's operand, written to their
    slots (the projection's kernel reads the operand from its slot)."""
    gates = []
    for g, ((slope, offset, shift), z_g) in enumerate(zip(GATES, z_gates, strict=True)):
        act = activation(z_g.astype(jnp.float32) + b[0, g, :][None, :], slope, offset, shift).astype(acts.dtype)
        acts[at.rows, at.s, g, at.columns] = act
        gates.append(act.astype(jnp.float32))  # the values the backward pass reads back
    si, tj, sf, so = gates
    c = _cell_before(at, c0, cells)
    c_new = cell_update(si, tj, sf, c, clip)
    cells[at.rows, at.s, at.columns] = jnp.where(at.ran, c_new, c)
    a_slots[at.rows, at.s, at.columns] = (so * jnp.tanh(c_new)).astype(a_slots.dtype)


def _projection_and_output_kernel(
    *, counter, h, mask, a_slots, W, x, keep, h_slots, outs, rows, clip, skip, rate, rounded, depth, B, D
):  # fmt: skip
    at = _Block(counter, mask, block=h.shape, B=B, D=D, down=False)

    def accumulate(k, total):  # the products of `depth` of the cell's columns at a time
        q = pl.ds(k * depth, depth)
        return total + product(a_slots[at.rows, at.s, q], W[at.ld, q, at.columns])

    total = jax.lax.fori_loop(0, a_slots.shape[-1] // depth, accumulate, jnp.zeros(h.shape, jnp.float32))
    h_raw = widened(narrow(total, a_slots.dtype)) if rounded else total  # as XLA's product on CPU
    _output_after_projection(
        at, h_raw, h=h, x=x, keep=keep, h_slots=h_slots, outs=outs, rows=rows, clip=clip, skip=skip, rate=rate
    )


def _output_after_projection(at: _Block, h_raw, *, h, x, keep, h_slots, outs, rows, clip, skip, rate):
    """A block's outputs from its unclipped projection h_raw (float32): the clip and mask, the
    carried h and its slot, the layers' outputs with the residual and their slot, and its part of
    the next step's operand [inputs; h], with the dropout on the inputs from the layer below."""
    L, S, P = outs.shape[0], outs.shape[3], outs.shape[4]
    layer, d, b = at.layer, at.d, at.b
    below, after = jnp.maximum(layer - 1, 0), jnp.minimum(at.s + 1, S - 1)

    def dropped(value, keep_layer, slot):  # dropout on the input of layer keep_layer + 1
        return _dropped(value, keep, (keep_layer, d, b, slot, at.columns), rate)

    # This step's inputs: layer 0's x, layer l's the outputs of layer l - 1 a step earlier.
    upper = outs[below, d, b, jnp.maximum(at.s - 1, 0), at.columns]
    upper = jnp.where(at.s == 0, 0.0, dropped(upper, below, at.s))
    inputs = jnp.where(layer == 0, x[d, b, at.s, at.columns], upper)
    h_new = clipped(h_raw, clip)
    out = jnp.where(at.ran, jnp.where(skip & (layer > 0), h_new + inputs, h_new), 0.0)
    h_kept = jnp.where(at.ran, h_new, h[...])
    h[...] = h_kept
    h_slots[layer, d, b, at.s, at.columns] = h_kept
    outs[layer, d, b, at.s, at.columns] = out
    # The next step's matmul operand [inputs; h]: this block's h, and the inputs of the layer
    # above (this block's outputs) or, from the top layer, layer 0's (x).
    above = (layer + 1) % L
    rows[at.rows, at.columns_from(P)] = h_kept.astype(rows.dtype)
    next_inputs = jnp.where(layer == L - 1, x[d, b, after, at.columns], dropped(out, layer, after))
    rows[at.rows_of(above), at.columns] = next_inputs.astype(rows.dtype)


def _backward_kernel(*, W_proj, d_h_raw, counter, d_c, c0, mask, acts, cells, d_gate_slots, d_gates, clip, B, D, depth):
    at = _Block(counter, mask, block=d_c.shape, B=B, D=D, down=True)
    j, part_columns = at.in_parts(d_gates.shape[-1])

    def accumulate(k, total):  # d_a = d_h_raw @ W_proj's transpose, `depth` of the P columns at a time
        p = pl.ds(k * depth, depth)
        return total + product(d_h_raw[at.rows, p], W_proj[at.ld, at.columns, p], (1, 1))

    d_a = jax.lax.fori_loop(0, d_h_raw.shape[1] // depth, accumulate, jnp.zeros(d_c.shape, jnp.float32))
    d_a = widened(narrow(d_a, d_gates.dtype))  # rounded as the forward's gates (the XLA cell's product)
    gates = [acts[at.rows, at.s, g, at.columns].astype(jnp.float32) for g in range(4)]
    c_prev = _cell_before(at, c0, cells)
    c_new = cell_left(gates, c_prev, at.ran, clip)  # computed again, not read from slot s
    d_acts, d_c_prev = cell_gradients(gates, c_new, c_prev, d_a, d_c[...], at.ran, clip)
    for g, ((slope, _, shift), act, d_act) in enumerate(zip(GATES, gates, d_acts, strict=True)):
        d_gate = activation_gradient(d_act, act, slope, shift).astype(d_gates.dtype)
        d_gates[at.ld, j, at.b, g, part_columns] = d_gate
        d_gate_slots[at.rows, at.s, g, at.columns] = d_gate
    d_c[...] = d_c_prev


def _backward_gates_kernel(
    W, acts, cells, _d_gate_slots, _d_c, c0, d_a, mask, counter, d_gate_slots, d_c, d_in_h, *, clip, n_rows,
    n_q, depth, B, D,
):  # fmt: skip
    # The slots and d_c come as inputs and as the outputs in their buffers (aliased): written there.
    # Grid (columns of the product, row blocks, parts of the cell's columns), the first fastest:
    # the programs that compute a block's d_gates again (each for its columns of Q) run side by
    # side, so that L2 serves all but the first. d_c (2, R, C): read at the loop counter's parity,
    # written at the other, so that no program reads a block's d_c after another wrote it.
    n, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    first, S, part_width = i * n_rows, acts.shape[1], W.shape[-1]
    layer, ld, b, rows = first // (D * B), first // B, pl.ds(first % B, n_rows), pl.ds(first, n_rows)
    s, parity = S - 1 - counter[0], counter[0] % 2
    ran, q = mask[layer, b, s][:, None] != 0, pl.ds(n * n_q, n_q)

    def columns_step(k, total):
        in_part, columns = pl.ds(k * depth, depth), pl.ds(j * part_width + k * depth, depth)
        gates = [acts[rows, s, g, columns].astype(jnp.float32) for g in range(4)]
        c_prev = jax.lax.cond(s == 0, lambda: c0[rows, columns], lambda: cells[rows, jnp.maximum(s - 1, 0), columns])
        c_new = cell_left(gates, c_prev, ran, clip)  # computed again, not read from slot s
        d_acts, d_c_prev = cell_gradients(
            gates, c_new, c_prev, d_a[rows, columns].astype(jnp.float32), d_c[parity, rows, columns], ran, clip
        )
        d_gates = [
            activation_gradient(d_act, act, slope, shift).astype(d_gate_slots.dtype)
            for (slope, _, shift), act, d_act in zip(GATES, gates, d_acts, strict=True)
        ]

        @pl.when(n == 0)
        def _():  # once per block, by the first of its programs
            for g, d_gate in enumerate(d_gates):
                d_gate_slots[rows, s, g, columns] = d_gate
            d_c[1 - parity, rows, columns] = d_c_prev

        for g, d_gate in enumerate(d_gates):
            total += product(d_gate, W[ld, j, q, g, in_part], (1, 1))
        return total

    total = jax.lax.fori_loop(0, part_width // depth, columns_step, jnp.zeros((n_rows, n_q), jnp.float32))
    d_in_h[ld, j, b, q] = total


def _backward_output_kernel(
    *, counter, d_h, d_h_raw, mask, d_in_h, d_out, h, keep, d_ins, d_h_raws, clip, skip, rate, B, D
):
    at = _Block(counter, mask, block=d_h.shape, B=B, D=D, down=True)
    L, S, P = d_ins.shape[0], d_ins.shape[3], d_ins.shape[4]
    layer, d, b, s = at.layer, at.d, at.b, at.s

    def ran(l, slot):
        return mask[l, b, slot][:, None] != 0

    def d_in_h_of(l, columns):  # layer l's gradient of [inputs; h]
        return _summed(d_in_h, l * D + d, b, columns)

    def d_out_of(l, slot):
        """Layer l's output gradient at `slot`: given for every layer, or for the top layer alone
        (the layers' below are 0, not loaded)."""
        if d_out.shape[0] == L:
            return d_out[l, d, b, slot, at.columns]
        top = lambda: d_out[0, d, b, slot, at.columns]  # noqa: E731
        return jax.lax.cond(l == L - 1, top, lambda: jnp.zeros(d_h.shape, d_out.dtype))

    def dropped(x, keep_layer, slot):  # dropout on the input of layer keep_layer + 1
        return _dropped(x, keep, (keep_layer, d, b, slot, at.columns), rate)

    def input_gradient(l):
        """Layer l's input gradient at slot s: its half of the matmul's, and the output gradient
        through the residual (which takes what layer l + 1 passed down at slot s + 1)."""
        later, up = jnp.minimum(s + 1, S - 1), jnp.minimum(l + 1, L - 1)
        passed = dropped(d_ins[up, d, b, later, at.columns], jnp.minimum(l, L - 2), later)
        passed = jnp.where((s < S - 1) & (l < L - 1), passed, 0.0)
        d_out_l = jnp.where(ran(l, s), d_out_of(l, s) + passed, 0.0)
        return d_in_h_of(l, at.columns) + jnp.where(skip & (l > 0), d_out_l, 0.0)

    d_ins[layer, d, b, s, at.columns] = input_gradient(layer)
    d_h_raws[layer, d, b, s, at.columns] = d_h_raw[...]
    d_h_prev = d_in_h_of(layer, at.columns_from(P))
    d_h_prev += jnp.where(ran(layer, s), 0.0, d_h[...])
    d_h[...] = d_h_prev
    # Slot s - 1's gradient of the unclipped projection: its output gradient (with what the layer
    # above passes down at slot s, computed here again: another block writes it) and d_h.
    passed = dropped(input_gradient(jnp.minimum(layer + 1, L - 1)), jnp.minimum(layer, L - 2), s)
    passed = jnp.where(layer < L - 1, passed, 0.0)
    earlier = jnp.maximum(s - 1, 0)
    ran_earlier = ran(layer, earlier)
    d_out_earlier = jnp.where(ran_earlier, d_out_of(layer, earlier) + passed, 0.0)
    d_h_raw_earlier = d_out_earlier + jnp.where(ran_earlier, d_h_prev, 0.0)
    d_h_raw_earlier = clipped_gradient(d_h_raw_earlier, h[layer, d, b, earlier, at.columns], clip)
    d_h_raw[...] = d_h_raw_earlier.astype(d_h_raw.dtype)


class _Out(NamedTuple):
    """An output of a kernel: its shape and dtype, and whether it is cut into blocks (else whole)."""

    shape: jax.ShapeDtypeStruct
    blocked: bool = False


def _call(
    kernel,
    name: str,
    counter,
    mask_LBS,
    *,
    blocked: dict[str, jax.Array],
    whole: dict[str, jax.Array],
    outputs: dict[str, _Out],
    touched: int,
    flops: int | None = None,
    parts: tuple[int, ...] = (),
    rows: int = _BLOCK_ROWS,
    columns: int = _BLOCK_COLUMNS,
    warps: int | None = None,
    **static,
):
    """pallas_call of `kernel` (with the `static` arguments, B among them) over blocks of (R, C):
    inputs `whole` (passed whole: read or written at slot s; the first the operand whose dtype
    `elmo_jax.plan` counts the `flops` in), the loop's counter, `blocked` (R, C) or (R, 4, C) cut
    into blocks, the mask (L, B, S); `outputs`, an output named as an input
    that input's buffer, written in place. The kernel gets each ref by its name (an aliased pair
    as the output's). It declares `touched` bytes and its products' `flops` (`elmo_jax.plan`). A
    block's columns divide C and each width in `parts` (the columns' parts that the kernel reads
    or writes, `in_parts`), at most `columns` of them; its rows divide B, at most `rows`. `warps`:
    Triton's warps a program (None: its default)."""
    first = next(iter(blocked.values()))
    refuse_where_unable("lstm_cell", first, values=("pallas", "fused"))
    R, C, B = first.shape[0], first.shape[-1], static["B"]
    n_rows, n_columns = math.gcd(B, rows), math.gcd(C, columns, *parts)
    if flops is not None:
        _refuse_small_products(n_rows, n_columns, static["depth"])
    inputs = [*whole, "counter", *blocked, "mask"]
    aliases = {inputs.index(o): i for i, o in enumerate(outputs) if o in inputs}

    def spec(x):
        if len(x.shape) == 2:
            return pl.BlockSpec((n_rows, n_columns), lambda i, k: (i, k))
        if x.shape[0] == R:
            return pl.BlockSpec((n_rows, 4, n_columns), lambda i, k: (i, 0, k))
        return pl.BlockSpec((1, 4, n_columns), lambda i, k: (i * n_rows // B, 0, k))  # the rows' layer and direction

    def named(*refs):  # an output's ref replaces its aliased input's (the same buffer)
        kernel(**dict(zip([*inputs, *outputs], refs)), **static)

    call = pl.pallas_call(
        named,
        out_shape=tuple(o.shape for o in outputs.values()),
        grid=(R // n_rows, C // n_columns),
        in_specs=(
            *[pl.no_block_spec] * len(whole),
            pl.BlockSpec((1,), lambda i, k: (0,)),
            *map(spec, blocked.values()),
            pl.no_block_spec,
        ),
        out_specs=tuple(spec(o.shape) if o.blocked else pl.no_block_spec for o in outputs.values()),
        input_output_aliases=aliases,
        interpret=backend() != "gpu",
        name=name,
        metadata=metadata(touched, flops),
        compiler_params=None if warps is None else pltriton.CompilerParams(num_warps=warps),
    )
    counter = jnp.reshape(counter, (1,)).astype(jnp.int32)
    results = call(*whole.values(), counter, *blocked.values(), mask_LBS)
    return dict(zip(outputs, results))


def products_fit(B: int, C: int, P: int) -> bool:
    """Whether every kernel's products get blocks that Triton's matmuls take (16 or more each
    way, `_refuse_small_products`) at B rows a device, C cells and a projection of P."""
    return all(n % 16 == 0 for n in (B, C, P))


def _refuse_small_products(*block: int) -> None:
    """A UserError where a kernel's products would run on blocks (rows, columns, depth) that
    Triton's matmuls do not take (a side under 16) on a GPU."""
    if backend() == "gpu" and min(block) < 16:
        raise UserError(
            f"lstm_cell='pallas' and 'fused' multiply blocks of (rows, columns, depth) {block} here, and Triton's "
            "matmuls need 16 or more each way (rows per device a multiple of 16, the cell and projection multiples "
            "of 16): use lstm_cell='xla' (or 'auto', which picks it for such sizes)"
        )


def _slot(buffer_RS) -> jax.ShapeDtypeStruct:
    """One slot of a save buffer (R, S, ...): what a step reads or writes of it."""
    return jax.ShapeDtypeStruct((buffer_RS.shape[0], *buffer_RS.shape[2:]), buffer_RS.dtype)


def _rows(R: int, width: int, dtype) -> jax.ShapeDtypeStruct:
    """`width` elements of each of the R rows: what a step's blocks read of an array indexed by row."""
    return jax.ShapeDtypeStruct((R, width), dtype)


def parts(C: int, result_size: int) -> int:
    """J, the parts of the cell's C columns that a matmul contracting over them, with a result of
    `result_size` elements, runs as products of their own: a power of 2, doubled while the
    result's blocks are fewer than _PARALLEL_BLOCKS and the parts stay _PART_COLUMNS wide, in
    whole multiples of _PART_ALIGN (so that C a multiple of 16 gives blocks of 16 columns or more:
    `products_fit`). The gates' weights and their products come in such parts."""
    J = 1
    while (
        result_size * J < _PARALLEL_BLOCKS * 128 * 128
        and C % (2 * J * _PART_ALIGN) == 0
        and C // (2 * J) >= _PART_COLUMNS
    ):
        J *= 2
    return J


def forward_cell(s, z_LDJBGc, *, b_LDG, c0_LDBC, mask_LBS, acts_LDBSG, c_LDBSC, a_LDBSC, clip: float | None):
    """Step s of the wavefront's training forward: gates z (L, D, J', B, 4, C / J') in the
    compute dtype, the cell's columns in J' parts (`parts`; the matmul's rounded result, without
    the bias b (L, D, 4C)), the initial cell (L, D, B, C: the cell before slot 0), the mask
    (L, B, S) int32, and the save slots of the activations (L, D, B, S, 4C, compute dtype), of
    the cell (L, D, B, S, C: the cell each step leaves, the one it read where it did not run;
    the next step reads it there) and of the projection's operand o * tanh(c) (L, D, B, S, C,
    compute dtype: `projection_and_output` and W_proj's gradient read it) -> (the three slots
    with slot s written)."""
    L, D, B, C = c0_LDBC.shape
    z = z_LDJBGc.reshape(L * D, -1, B, 4, z_LDJBGc.shape[-1])
    return _forward(
        _forward_kernel, "lstm_forward_cell", s, {"z": z}, gate_columns=z.shape[-1], read=(z,), flops=None,
        b_LDG=b_LDG, c0_LDBC=c0_LDBC, mask_LBS=mask_LBS, acts_LDBSG=acts_LDBSG, c_LDBSC=c_LDBSC, a_LDBSC=a_LDBSC,
        clip=clip,
    )  # fmt: skip


def gates_and_forward_cell(
    s, rows_LDBQ, W_LDJQGc, *, b_LDG, c0_LDBC, mask_LBS, acts_LDBSG, c_LDBSC, a_LDBSC, clip: float | None
):
    """`forward_cell` with the gates' matmul in the kernel (`lstm_cell="fused"`): the matmul's
    operand [inputs; h] (L, D, B, Q) and the gates' weights (L, D, J', Q, 4, C / J') in the
    compute dtype, the cell's columns in J' parts (`parts`), instead of their product z: each
    grid program multiplies its block of rows by its 4 gates' block of columns, a few rows of W
    at a time (_FUSED_DEPTH_BYTES), and its gates go from registers into the cell's arithmetic, rounded to
    the compute dtype as the matmul's result; they never reach device memory. Other arguments
    and the results as `forward_cell`'s.

    Bytes declared: W once (the programs that share a block of its columns run together; L2
    serves the others) and the operand once (at most L * D * B * Q, 4 MB at the original size
    and 512 rows in bfloat16: it stays in L2 while every column block reads it)."""
    L, D, B, C = c0_LDBC.shape
    Q = rows_LDBQ.shape[-1]
    rows, W = rows_LDBQ.reshape(L * D * B, Q), W_LDJQGc.reshape(L * D, *W_LDJQGc.shape[2:])
    return _forward(
        _gates_and_forward_kernel, "lstm_gates_and_forward_cell", s, {"rows": rows, "W": W},
        gate_columns=W.shape[-1], read=(rows, W), flops=2 * L * D * B * Q * 4 * C,
        depth=math.gcd(Q, _FUSED_DEPTH_BYTES // rows.dtype.itemsize),
        rows=_FUSED_ROWS, columns=_FUSED_COLUMNS, warps=_FUSED_WARPS,
        b_LDG=b_LDG, c0_LDBC=c0_LDBC, mask_LBS=mask_LBS, acts_LDBSG=acts_LDBSG, c_LDBSC=c_LDBSC, a_LDBSC=a_LDBSC,
        clip=clip,
    )  # fmt: skip


def _forward(
    kernel, name, s, gates: dict, *, gate_columns, read, flops, b_LDG, c0_LDBC, mask_LBS, acts_LDBSG, c_LDBSC, a_LDBSC,
    clip, **static,
):  # fmt: skip
    """`forward_cell` and `gates_and_forward_cell` around their kernels: `gates` what the kernel
    computes the gates from (whole arrays; their bytes `read`, each once), in parts of the cell's
    columns `gate_columns` wide, its products' `flops`, the rest `_call`'s and the kernel's."""
    L, D, B, C = c0_LDBC.shape
    S, R = acts_LDBSG.shape[3], L * D * B
    c0 = c0_LDBC.reshape(R, C)
    acts, cells, a_slots = acts_LDBSG.reshape(R, S, 4, C), c_LDBSC.reshape(R, S, C), a_LDBSC.reshape(R, S, C)
    touched = nbytes(
        *read, b_LDG, _slot(cells),  # read: the gates (or their operands), the bias, the cell of slot s - 1 (or c0)
        _slot(acts), _slot(cells), _slot(a_slots),  # written: the slots
        _rows(R, 1, jnp.int32),  # the mask's rows
    )  # fmt: skip
    out = _call(
        kernel,
        name,
        s,
        mask_LBS,
        blocked={"c0": c0, "b": b_LDG.reshape(L * D, 4, C)},
        whole={**gates, "acts": acts, "cells": cells, "a_slots": a_slots},
        outputs={
            "acts": _Out(like(acts_LDBSG, acts.shape)),
            "cells": _Out(like(c_LDBSC, cells.shape)),
            "a_slots": _Out(like(a_LDBSC, a_slots.shape)),
        },
        touched=touched,
        flops=flops,
        parts=(gate_columns,),
        clip=clip,
        B=B,
        D=D,
        **static,
    )
    return (
        out["acts"].reshape(acts_LDBSG.shape),
        out["cells"].reshape(c_LDBSC.shape),
        out["a_slots"].reshape(a_LDBSC.shape),
    )


def backward_cell(
    i, d_h_raw_LDBP, W_proj_LDCP, d_c_LDBC, *, c0_LDBC, mask_LBS, acts_LDBSG, c_LDBSC, d_gates_LDBSG, J: int,
    clip: float | None,
):  # fmt: skip
    """Step s = S - 1 - i of the wavefront's backward (i: the loop's counter, so that no kernel
    computes s for this one): the gradient of the unclipped projection d_h_raw (L, D, B, P) and
    W_proj (L, D, C, P), both in the compute dtype, whose product, the gradient of o * tanh(c),
    each program computes for its block (a few of the P columns at a time, _BACK_DEPTH_BYTES;
    rounded to the compute dtype as the XLA cell's product: it never reaches device memory),
    the carried cell gradient (L, D, B, C), the initial cell (L, D, B, C: the cell before slot
    0), the mask (L, B, S) int32, the forward's saved
    activations and cells (slot s - 1's read: slot s's cell is computed again from it and slot
    s's activations, as the forward computed it, `cell_math.cell_left`), and the gates'
    gradient's save slots (L, D, B, S, 4C, compute dtype) -> (those slots with slot s written,
    the gates' gradient in the compute dtype, the cell's columns in J parts (L, D, J, B, 4,
    C / J), the cell gradient carried to step s - 1)."""
    L, D, B, C = d_c_LDBC.shape
    P = d_h_raw_LDBP.shape[-1]
    S, R, dtype = acts_LDBSG.shape[3], L * D * B, d_gates_LDBSG.dtype
    d_h_raw, W_proj, d_c = d_h_raw_LDBP.reshape(R, P), W_proj_LDCP.reshape(L * D, C, P), d_c_LDBC.reshape(R, C)
    acts, cells = acts_LDBSG.reshape(R, S, 4, C), c_LDBSC.reshape(R, S, C)
    d_gate_slots, d_gates = d_gates_LDBSG.reshape(R, S, 4, C), like(d_c, (L * D, J, B, 4, C // J), dtype)
    touched = nbytes(
        d_h_raw, W_proj,  # read: the product's operands, each once (a block's rows stay in L2 for its columns)
        _slot(acts), _slot(cells),  # the slot's activations, the cell of slot s - 1 (or c0)
        d_c, d_c,  # the cell gradient, read and written
        _slot(d_gate_slots), d_gates,  # the gates' gradient, written to its slot and as the matmul's operand
        _rows(R, 1, jnp.int32),  # the mask's rows
    )  # fmt: skip
    out = _call(
        _backward_kernel,
        "lstm_backward_cell",
        i,
        mask_LBS,
        blocked={"d_c": d_c, "c0": c0_LDBC.reshape(R, C)},
        whole={"W_proj": W_proj, "d_h_raw": d_h_raw, "acts": acts, "cells": cells, "d_gate_slots": d_gate_slots},
        outputs={
            "d_gate_slots": _Out(like(d_gates_LDBSG, d_gate_slots.shape)),
            "d_gates": _Out(d_gates),
            "d_c": _Out(like(d_c, d_c.shape), blocked=True),
        },
        touched=touched,
        flops=2 * R * C * P,
        parts=(C // J,),
        clip=clip,
        B=B,
        D=D,
        depth=math.gcd(P, _BACK_DEPTH_BYTES // W_proj.dtype.itemsize),
    )
    d_gates = out["d_gates"].reshape(L, D, J, B, 4, C // J)
    return out["d_gate_slots"].reshape(d_gates_LDBSG.shape), d_gates, out["d_c"].reshape(d_c_LDBC.shape)


def backward_cell_and_gates_product(
    i, d_a_LDBC, d_c_2LDBC, W_LDJQGc, *, c0_LDBC, mask_LBS, acts_LDBSG, c_LDBSC, d_gates_LDBSG,
    clip: float | None,
):  # fmt: skip
    """`backward_cell` with the gates' transposed matmul in the kernel (`lstm_cell="fused"`),
    taking the gradient of o * tanh(c) d_a (L, D, B, C) in the compute dtype (XLA's product:
    this kernel's programs compute a block's gradients once for each block of Q, and would
    compute its product as often), the carried cell gradient in two buffers (2, L, D, B, C),
    read at the counter's parity i % 2 and written at the other, and the gates' weights (L, D,
    J, Q, 4, C / J) in the compute dtype, instead of d_gates written for the matmul: each grid
    program computes the gates' gradient of its block of rows and of the cell's columns of its
    part (written to its slot once), and its product with its columns of W's transpose -> (the
    slots with slot s written, the gradient of [inputs; h] as J partial sums (L, D, J, B, Q)
    float32, which `backward_output` adds, the cell gradients with the one carried to step
    s - 1 written). Other arguments as `backward_cell`'s.

    Bytes declared: W once, and each block's operands of the cell once though the programs
    for each of its blocks of Q (_FUSED_BACK_Q_BYTES) read them (side by side: from L2).
    Those programs compute a block's gradients again each (8 at the original size in
    bfloat16), and each block of rows reads W's part from L2: untimed on a device, unlike the
    cell kernel and cuBLAS's product that it replaces."""
    L, D, B, C = d_a_LDBC.shape
    J, Q = W_LDJQGc.shape[2], W_LDJQGc.shape[3]
    S, R, dtype = acts_LDBSG.shape[3], L * D * B, d_gates_LDBSG.dtype
    n_rows, n_q = math.gcd(B, _FUSED_BACK_ROWS), math.gcd(Q, _FUSED_BACK_Q_BYTES // jnp.dtype(dtype).itemsize)
    depth = math.gcd(C // J, _FUSED_BACK_DEPTH)
    refuse_where_unable("lstm_cell", d_a_LDBC, values=("pallas", "fused"))
    _refuse_small_products(n_rows, n_q, depth)
    d_a, d_c = d_a_LDBC.reshape(R, C), d_c_2LDBC.reshape(2, R, C)
    acts, cells = acts_LDBSG.reshape(R, S, 4, C), c_LDBSC.reshape(R, S, C)
    d_gate_slots, W = d_gates_LDBSG.reshape(R, S, 4, C), W_LDJQGc.reshape(L * D, J, Q, 4, C // J)
    d_in_h = like(d_a, (L * D, J, B, Q), jnp.float32)
    touched = nbytes(
        d_a, _slot(acts), _slot(cells), W,  # read: d_a, the slot's activations, the cell of slot s - 1 (or c0)
        _rows(R, C, d_c.dtype), _rows(R, C, d_c.dtype),  # the cell gradient, read from one buffer, written to the other
        _slot(d_gate_slots), d_in_h,  # written: the gates' gradient into its slot, the product's parts
        _rows(R, 1, jnp.int32),  # the mask's rows
    )  # fmt: skip
    operands = (W, acts, cells, d_gate_slots, d_c, c0_LDBC.reshape(R, C), d_a, mask_LBS)
    counter = jnp.reshape(i, (1,)).astype(jnp.int32)
    kernel = functools.partial(_backward_gates_kernel, clip=clip, n_rows=n_rows, n_q=n_q, depth=depth, B=B, D=D)
    d_gate_slots, d_c, d_in_h = pl.pallas_call(
        kernel,
        out_shape=(like(d_gates_LDBSG, d_gate_slots.shape), like(d_c_2LDBC, d_c.shape), d_in_h),
        grid=(Q // n_q, R // n_rows, J),
        in_specs=(*[pl.no_block_spec] * len(operands), pl.BlockSpec((1,), lambda n, r, j: (0,))),
        out_specs=(pl.no_block_spec,) * 3,
        input_output_aliases={3: 0, 4: 1},
        interpret=backend() != "gpu",
        name="lstm_backward_cell_and_gates_product",
        metadata=metadata(touched, 2 * R * 4 * C * Q),
        compiler_params=pltriton.CompilerParams(num_warps=_FUSED_BACK_WARPS),
    )(*operands, counter)
    return (
        d_gate_slots.reshape(d_gates_LDBSG.shape),
        d_in_h.reshape(L, D, J, B, Q),
        d_c.reshape(d_c_2LDBC.shape),
    )


def projection_and_output(
    s, a_LDBSC, W_proj_LDCP, h_LDBP, *, mask_LBS, x_DBSP, keep_UDBSP, h_LDBSP, out_LDBSP, clip, skip, rate
):  # fmt: skip
    """Step s of the wavefront's training forward after the cell: the projection of its operand
    a, read from its save slots (L, D, B, S, C) at slot s, by W_proj (L, D, C, P) (both in the
    compute dtype; float32 sums, rounded to it where XLA's product is, `matmul.rounds_results`),
    then its clip and mask, given the carried h (L, D, B, P), the mask (L, B, S) int32, the
    inputs x (D, B, S, P), the dropout's keep masks of layers >= 1 (L - 1, D, B, S, P) int8 or
    None (`rate` None), and the save slots of h and of the layers' outputs (L, D, B, S, P) ->
    (those slots with slot s written, the new carried h, the next step's matmul operand
    [inputs; h] (L, D, B, 2P) in the compute dtype). `clip`: the projection's; `skip`: the
    residual around layers >= 1. Each grid program multiplies its block of rows by its block of
    W_proj's columns, a few of the cell's columns at a time (_PROJ_DEPTH_BYTES): the product never
    reaches device memory.

    Bytes declared: a's slot and W_proj once (the programs that share a block of either read it
    from L2: W_proj is 16.8 MB at the original size in bfloat16, a's slot 4.2 MB at 128 rows)."""
    L, D, B, P = h_LDBP.shape
    C, R, dtype = a_LDBSC.shape[-1], L * D * B, a_LDBSC.dtype
    a_slots, W, h = a_LDBSC.reshape(R, -1, C), W_proj_LDCP.reshape(L * D, C, P), h_LDBP.reshape(R, P)
    keep = jnp.zeros((1, 1, 1, 1, 1), jnp.int8) if keep_UDBSP is None else keep_UDBSP
    rows = like(h, (R, 2 * P), dtype)
    keep_rows = [_rows(R, P, jnp.int8)] * (2 if rate else 0)  # of this step and the next
    touched = nbytes(
        _slot(a_slots), W, h, _rows(R, P, h.dtype),  # read: a's slot, W_proj, h, the inputs
        h, _rows(R, P, h.dtype), _rows(R, P, h.dtype), rows,  # written: h, its slot, the outputs' slot, [inputs; h]
        *keep_rows, _rows(R, 1, jnp.int32),  # the keep masks' rows, the mask's
    )  # fmt: skip
    out = _call(
        _projection_and_output_kernel,
        "lstm_projection_and_output",
        s,
        mask_LBS,
        blocked={"h": h},
        whole={"a_slots": a_slots, "W": W, "x": x_DBSP, "keep": keep, "h_slots": h_LDBSP, "outs": out_LDBSP},
        outputs={
            "h_slots": _Out(like(h_LDBSP, h_LDBSP.shape)),
            "outs": _Out(like(out_LDBSP, out_LDBSP.shape)),
            "h": _Out(like(h, h.shape), blocked=True),
            "rows": _Out(rows),
        },
        touched=touched,
        flops=2 * R * C * P,
        rows=_PROJ_ROWS,
        columns=_PROJ_COLUMNS,
        clip=clip,
        skip=skip,
        rate=rate,
        rounded=rounds_results(dtype.name),
        depth=math.gcd(C, _PROJ_DEPTH_BYTES // dtype.itemsize),
        B=B,
        D=D,
    )
    return out["h_slots"], out["outs"], out["h"].reshape(h_LDBP.shape), out["rows"].reshape(L, D, B, 2 * P)


def backward_output(
    i, d_in_h_LDJBK, d_h_LDBP, d_h_raw_LDBP, *, mask_LBS, d_out_NDBSP, h_LDBSP, keep_UDBSP, d_in_LDBSP, d_h_raw_LDBSP,
    clip, skip, rate,
):  # fmt: skip
    """Step s = S - 1 - i of the wavefront's backward after the gates' transposed matmul: its
    result d_in_h as J partial sums (L, D, J, B, 2P) float32, added here (the gradient of each
    layer's [inputs; h]; a product for each part of the cell's columns), the carried h gradient
    (L, D, B, P), this step's gradient of the unclipped projection d_h_raw (L, D, B, P, compute
    dtype), the mask (L, B, S) int32, the outputs' gradients (N, D, B, S, P): every layer's
    (N = L), or the top layer's alone (N = 1: the layers' below are 0, never loaded), the
    forward's saved h (L, D, B, S, P), the keep masks of layers >= 1 (L - 1, D, B, S, P) int8 or
    None (`rate` None), and the save slots of the layers' input gradients (L, D, B, S, P,
    float32: layer 0's is the stack's; the others are read by the next step, as what each layer
    passes down) and of d_h_raw -> (those slots with slot s written, the h gradient carried to
    slot s - 1, slot s - 1's d_h_raw). `clip`: the projection's; `skip`: the residual around layers >= 1."""
    L, D, B, P = d_h_LDBP.shape
    R = L * D * B
    J, d_h, d_h_raw = d_in_h_LDJBK.shape[2], d_h_LDBP.reshape(R, P), d_h_raw_LDBP.reshape(R, P)
    d_in_h = d_in_h_LDJBK.reshape(L * D, J, B, 2 * P)
    keep = jnp.zeros((1, 1, 1, 1, 1), jnp.int8) if keep_UDBSP is None else keep_UDBSP
    f32_rows = _rows(R, P, jnp.float32)
    d_out_rows = _rows(d_out_NDBSP.shape[0] * D * B, P, jnp.float32)  # the layers' whose output gradients are given
    touched = nbytes(
        d_in_h, _rows(R, J * P, jnp.float32),  # read: d_in_h's parts, and the inputs' half of the layer above's
        d_h, d_h,  # the h gradient, read and written
        d_out_rows, d_out_rows,  # the output gradients of slots s and s - 1
        *[f32_rows] * 3,  # h of slot s - 1, the input gradients passed down (to this layer and the one above)
        f32_rows,  # written: the input gradient
        d_h_raw, d_h_raw, d_h_raw,  # d_h_raw read, written into its slot and for the next step
        *[_rows(R, P, jnp.int8)] * (3 if rate else 0),  # the keep masks' rows of 3 slots
        _rows(R, 1, jnp.int32),  # the mask's rows
    )  # fmt: skip
    out = _call(
        _backward_output_kernel,
        "lstm_backward_output",
        i,
        mask_LBS,
        blocked={"d_h": d_h, "d_h_raw": d_h_raw},
        whole={"d_in_h": d_in_h, "d_out": d_out_NDBSP, "h": h_LDBSP, "keep": keep, "d_ins": d_in_LDBSP,
               "d_h_raws": d_h_raw_LDBSP},
        outputs={
            "d_ins": _Out(like(d_in_LDBSP, d_in_LDBSP.shape)),
            "d_h_raws": _Out(like(d_h_raw_LDBSP, d_h_raw_LDBSP.shape)),
            "d_h": _Out(like(d_h, d_h.shape), blocked=True),
            "d_h_raw": _Out(like(d_h_raw, d_h_raw.shape), blocked=True),
        },
        touched=touched,
        clip=clip,
        skip=skip,
        rate=rate,
        B=B,
        D=D,
    )  # fmt: skip
    d_h_prev, d_h_raw_next = out["d_h"].reshape(d_h_LDBP.shape), out["d_h_raw"].reshape(d_h_LDBP.shape)
    return out["d_ins"], out["d_h_raws"], d_h_prev, d_h_raw_next
