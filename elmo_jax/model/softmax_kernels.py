"""The sampled softmax's log-sum-exp as Pallas kernels of our own (`softmax_kernel="pallas"`):
the candidates' logits (N, S), the train step's largest softmax array (335 MB float32 a
direction at 512 rows), never in device memory. XLA's path writes them, reads them for the
log-sum-exp and again for its gradient.

- `_lse_kernel`: per block of rows, the logits tile by tile (h times the candidates' rows of W in
  the compute dtype, float32 accumulation, + bias - log Q, -inf at accidental hits) and their
  running max and sum of exponentials: only the log-sum-exp (N,) is written;
- `_gradient_kernel`: the logits again (the one recomputed product) and their gradient
  g * exp(logit - lse) (0 where masked), written in the compute dtype for XLA's two products
  (h's and W's gradients, as `matmul._narrow_matmul` computes them), with its float32 sum over
  each block's rows (the bias's gradient, summed by XLA).

On GPUs they lower to Triton (a program per block of rows, looping over the candidates' tiles),
block sizes chosen by compiling each alone for the device the model is traced for
(`chosen_block`, as char_kernels does); on TPUs their tiled variants (`kernel_calls.tiled()`: a
grid over blocks of rows and tiles of candidates, operands in VMEM blocks) to Mosaic; on a CPU
(the tests, both variants) Pallas interprets them, to the numbers of XLA's path
(`softmax.sampled_softmax_ce`). Each declares its product's FLOPs and the bytes it moves
(`kernel_calls.metadata`): on a GPU each operand once (the blocks of rows running side by side
share the candidates' rows in L2), on a TPU the blocks the pipeline fetches (the candidates'
rows once per block of rows).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from elmo_jax.errors import UserError
from elmo_jax.model import kernel_calls
from elmo_jax.model.backend import backend, device
from elmo_jax.model.kernel_calls import like, metadata, nbytes, refuse_where_unable, whole_blocks
from elmo_jax.model.matmul import narrow, result_type, widened

Block = tuple[int, int]  # (rows, candidates) of a tile
# Tried in this order on a GPU until both kernels compile for it (`chosen_block`).
BLOCKS = ((64, 128), (64, 64), (32, 64), (32, 32), (16, 32), (16, 16))
# A TPU tile (`kernel_calls.tiled()`): its blocks, double-buffered, and its float32 logits take a few MB of VMEM.
TILED_BLOCK, VMEM_LIMIT = (512, 512), 48 << 20
LANES = 128  # a TPU's (8, 128) tiles: a column (N, 1) of positions' values (targets, lse, g) is N x 128 wide there
LSE, GRADIENT = "sampled_softmax_lse", "sampled_softmax_gradient"


def _logits(h, targets, w_ref, bias_ref, ids_ref, j, n_columns: int, dtype: str):
    """Tile j of a block's logits (rows, n_columns) float32: h (rows, P) in `dtype` times the
    tile's candidate rows, + bias, -inf where a candidate is the row's target."""
    columns = pl.ds(j * n_columns, n_columns)
    product = jax.lax.dot_general(
        h, w_ref[columns, :], (((1,), (1,)), ((), ())), preferred_element_type=result_type(dtype)
    )
    y = widened(product) + bias_ref[columns][None, :]
    return jnp.where(ids_ref[columns][None, :] == targets[:, None], -jnp.inf, y)


def _lse_kernel(h_ref, targets_ref, w_ref, bias_ref, ids_ref, lse_ref, *, n_columns: int, dtype: str):
    # Grid (row blocks,): a block's running max and sum of exponentials over the candidates' tiles.
    h, targets = h_ref[...], targets_ref[...]

    def tile(j, carry):
        top, total = carry
        y = _logits(h, targets, w_ref, bias_ref, ids_ref, j, n_columns, dtype)
        new_top = jnp.maximum(top, y.max(axis=1))
        shift = jnp.where(new_top == -jnp.inf, 0.0, new_top)  # a row masked so far: its sum stays 0
        return new_top, total * jnp.exp(top - shift) + jnp.exp(y - shift[:, None]).sum(axis=1)

    start = (jnp.full(targets.shape, -jnp.inf, jnp.float32), jnp.zeros(targets.shape, jnp.float32))
    top, total = jax.lax.fori_loop(0, w_ref.shape[0] // n_columns, tile, start)
    lse_ref[...] = top + jnp.log(total)  # -inf for a row whose every candidate is masked


def _gradient_kernel(
    h_ref, targets_ref, lse_ref, g_ref, w_ref, bias_ref, ids_ref, d_ref, sums_ref, *, n_columns: int, dtype: str
):
    # Grid (row blocks,): the logits' gradient tile by tile, into d (N, S) and the block's row of sums.
    i, n_rows = pl.program_id(0), h_ref.shape[0]
    h, targets, lse, g = h_ref[...], targets_ref[...], lse_ref[...], g_ref[...]
    rows = pl.ds(i * n_rows, n_rows)

    def tile(j, _):
        y = _logits(h, targets, w_ref, bias_ref, ids_ref, j, n_columns, dtype)
        d = jnp.where(y == -jnp.inf, 0.0, g[:, None] * jnp.exp(y - lse[:, None]))
        columns = pl.ds(j * n_columns, n_columns)
        d_ref[rows, columns] = narrow(d, dtype)
        sums_ref[i, columns] = d.sum(axis=0)

    jax.lax.fori_loop(0, w_ref.shape[0] // n_columns, tile, None)


def _tiled_logits(h_ref, targets_ref, w_ref, bias_ref, ids_ref, dtype: str):
    """A TPU tile's logits (rows, candidates) float32 from its VMEM blocks (`_logits`' numbers)."""
    product = jax.lax.dot_general(
        h_ref[...], w_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=result_type(dtype)
    )
    return jnp.where(ids_ref[...] == targets_ref[...], -jnp.inf, widened(product) + bias_ref[...])


def _tiled_lse_kernel(h_ref, targets_ref, w_ref, bias_ref, ids_ref, lse_ref, top_ref, total_ref, *, dtype: str):
    # TPU: grid (row blocks, candidate tiles), the running max and sum (rows, 1) in VMEM scratch.
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        top_ref[...] = jnp.full(top_ref.shape, -jnp.inf, jnp.float32)
        total_ref[...] = jnp.zeros(total_ref.shape, jnp.float32)

    y, top = _tiled_logits(h_ref, targets_ref, w_ref, bias_ref, ids_ref, dtype), top_ref[...]
    new_top = jnp.maximum(top, y.max(axis=1, keepdims=True))
    shift = jnp.where(new_top == -jnp.inf, 0.0, new_top)
    total_ref[...] = total_ref[...] * jnp.exp(top - shift) + jnp.exp(y - shift).sum(axis=1, keepdims=True)
    top_ref[...] = new_top

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
        lse_ref[...] = top_ref[...] + jnp.log(total_ref[...])


def _tiled_gradient_kernel(h_ref, targets_ref, lse_ref, g_ref, w_ref, bias_ref, ids_ref, d_ref, sums_ref, *, dtype):
    # TPU: grid (row blocks, candidate tiles), each tile's gradient and its sum over the block's rows.
    y = _tiled_logits(h_ref, targets_ref, w_ref, bias_ref, ids_ref, dtype)
    d = jnp.where(y == -jnp.inf, 0.0, g_ref[...] * jnp.exp(y - lse_ref[...]))
    d_ref[...] = narrow(d, dtype)
    sums_ref[0] = d.sum(axis=0, keepdims=True)


def _tiled_bytes(x) -> int:
    """The bytes of x in a TPU's device memory: a column (N, 1) takes a row of LANES for each value."""
    return nbytes(x) * (LANES if x.shape[-1] == 1 else 1)


def _tile(n: int, most: int) -> int:
    """A tile of n: `most`, or below it the power of two (at least 16) that covers n."""
    return min(most, kernel_calls.padded(n))


class _Operands:
    """The kernels' operands, padded to whole tiles: h (N', P) and W (S', P) in `dtype`,
    bias (S',) (padding candidates -inf), ids (S',), targets (N',)."""

    def __init__(self, h_NP, W_SP, bias_S, ids_S, targets_N, dtype: str, block: Block):
        N, S = h_NP.shape[0], W_SP.shape[0]
        self.dtype = dtype
        self.n_rows, self.n_columns = _tile(N, block[0]), _tile(S, block[1])
        N2, S2 = whole_blocks(N, self.n_rows), whole_blocks(S, self.n_columns)
        self.h = jnp.pad(narrow(h_NP, dtype), ((0, N2 - N), (0, 0)))
        self.W = jnp.pad(narrow(W_SP, dtype), ((0, S2 - S), (0, 0)))
        self.bias = jnp.pad(bias_S.astype(jnp.float32), (0, S2 - S), constant_values=-jnp.inf)
        self.ids = jnp.pad(ids_S.astype(jnp.int32), (0, S2 - S), constant_values=-1)
        self.targets = jnp.pad(targets_N.astype(jnp.int32), (0, N2 - N), constant_values=-1)

    def row_vector(self, x_N) -> jax.Array:
        """x (N,) padded to (N',) float32."""
        return jnp.pad(x_N.astype(jnp.float32), (0, self.h.shape[0] - x_N.shape[0]))

    def call(self, kernel, name: str, rows, out_shape, touched: int):
        """Triton: pallas_call over the row blocks of h and `rows` (each (N',)), W, bias and ids
        whole, the outputs `out_shape` whole (or, for one of (N',), its row blocks)."""
        refuse_where_unable("softmax_kernel", self.h, on_tpu=True)
        block = pl.BlockSpec((self.n_rows,), lambda i: (i,))
        return pl.pallas_call(
            functools.partial(kernel, n_columns=self.n_columns, dtype=self.dtype),
            out_shape=out_shape,
            grid=(self.h.shape[0] // self.n_rows,),
            in_specs=[pl.BlockSpec((self.n_rows, self.h.shape[1]), lambda i: (i, 0)), *[block] * len(rows)]
            + [pl.no_block_spec] * 3,
            out_specs=block if isinstance(out_shape, jax.ShapeDtypeStruct) else (pl.no_block_spec,) * len(out_shape),
            interpret=backend() == "cpu",
            name=name,
            metadata=metadata(touched, self.flops()),
        )(self.h, *rows, self.W, self.bias, self.ids)

    def tiled_call(self, kernel, name: str, rows, out_shape, out_specs, semantics, scratch=()):
        """Mosaic: pallas_call over (row blocks, candidate tiles) of h, `rows` (each (N', 1)), W,
        bias and ids ((1, S')); W's tiles, bias and ids fetched once per row block."""
        refuse_where_unable("softmax_kernel", self.h, on_tpu=True)
        n, m = self.n_rows, self.n_columns
        column = pl.BlockSpec((1, m), lambda i, j: (0, j))
        arrays = (self.h, *rows, *jax.tree.leaves(out_shape))
        touched = sum(map(_tiled_bytes, arrays)) + self.h.shape[0] // n * nbytes(self.W, self.bias, self.ids)
        return pl.pallas_call(
            functools.partial(kernel, dtype=self.dtype),
            out_shape=out_shape,
            grid=(self.h.shape[0] // n, self.W.shape[0] // m),
            in_specs=[
                pl.BlockSpec((n, self.h.shape[1]), lambda i, j: (i, 0)),
                *[pl.BlockSpec((n, 1), lambda i, j: (i, 0))] * len(rows),
                pl.BlockSpec((m, self.W.shape[1]), lambda i, j: (j, 0)),
                column,
                column,
            ],
            out_specs=out_specs,
            interpret=backend() == "cpu",
            name=name,
            compiler_params=pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=VMEM_LIMIT),
            scratch_shapes=scratch,
            metadata=metadata(touched, self.flops()),
        )(self.h, *rows, self.W, self.bias[None, :], self.ids[None, :])

    def flops(self) -> int:
        """The logits' product."""
        return 2 * self.h.shape[0] * self.W.shape[0] * self.h.shape[1]


def _lse(h_NP, W_SP, bias_S, ids_S, targets_N, dtype: str, block: Block) -> jax.Array:
    """The log-sum-exp (N,) float32 of each row's logits (`_lse_kernel`)."""
    ops = _Operands(h_NP, W_SP, bias_S, ids_S, targets_N, dtype, block)
    N, N2 = h_NP.shape[0], ops.h.shape[0]
    if kernel_calls.tiled():
        rows = pl.BlockSpec((ops.n_rows, 1), lambda i, j: (i, 0))
        scratch = [pltpu.VMEM((ops.n_rows, 1), jnp.float32)] * 2
        out_shape = like(ops.h, (N2, 1), jnp.float32)
        lse = ops.tiled_call(
            _tiled_lse_kernel, LSE, (ops.targets[:, None],), out_shape, rows, ("parallel", "arbitrary"), scratch
        )
        return lse[:N, 0]
    out_shape = like(ops.h, (N2,), jnp.float32)
    touched = nbytes(ops.h, ops.targets, ops.W, ops.bias, ops.ids, out_shape)
    return ops.call(_lse_kernel, LSE, (ops.targets,), out_shape, touched)[:N]


def _gradient(h_NP, W_SP, bias_S, ids_S, targets_N, lse_N, g_N, dtype: str, block: Block):
    """The logits' gradient (N, S) in `dtype` and its float32 sum over rows (S,) (`_gradient_kernel`)."""
    ops = _Operands(h_NP, W_SP, bias_S, ids_S, targets_N, dtype, block)
    N, S, (N2, S2) = h_NP.shape[0], W_SP.shape[0], (ops.h.shape[0], ops.W.shape[0])
    lse, g = ops.row_vector(lse_N), ops.row_vector(g_N)
    if kernel_calls.tiled():
        n, m = ops.n_rows, ops.n_columns
        out_shape = (like(ops.h, (N2, S2), dtype), like(ops.h, (N2 // n, 1, S2), jnp.float32))
        out_specs = (pl.BlockSpec((n, m), lambda i, j: (i, j)), pl.BlockSpec((1, 1, m), lambda i, j: (i, 0, j)))
        rows = (ops.targets[:, None], lse[:, None], g[:, None])
        d, sums = ops.tiled_call(_tiled_gradient_kernel, GRADIENT, rows, out_shape, out_specs, ("parallel",) * 2)
        return d[:N, :S], sums.sum(axis=(0, 1))[:S]
    out_shape = (like(ops.h, (N2, S2), dtype), like(ops.h, (N2 // ops.n_rows, S2), jnp.float32))
    touched = nbytes(ops.h, ops.targets, lse, g, ops.W, ops.bias, ops.ids, *out_shape)
    d, sums = ops.call(_gradient_kernel, GRADIENT, (ops.targets, lse, g), out_shape, touched)
    return d[:N, :S], sums.sum(axis=0)[:S]


def sampled_logsumexp(h_NP, W_SP, bias_S, ids_S, targets_N, dtype: str, block: Block) -> jax.Array:
    """log(sum(exp(logits))) (N,) float32 of the logits h (N, P) @ W (S, P)^T in `dtype` + bias
    (S,), -inf where ids (S,) equals the row's target (N,); (rows, candidates) a tile. Its
    gradients: h's and W's are `dtype` products of the logits' gradient rounded to `dtype` once,
    float32 results (as `matmul._narrow_matmul`'s)."""
    return _sampled_logsumexp(h_NP, W_SP, bias_S, ids_S, targets_N, dtype, block, h_NP.dtype.name, W_SP.dtype.name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _sampled_logsumexp(h_NP, W_SP, bias_S, ids_S, targets_N, dtype, block, h_dtype, W_dtype):
    return _lse(h_NP, W_SP, bias_S, ids_S, targets_N, dtype, block)


def _sampled_logsumexp_forward(h_NP, W_SP, bias_S, ids_S, targets_N, dtype, block, h_dtype, W_dtype):
    lse_N = _lse(h_NP, W_SP, bias_S, ids_S, targets_N, dtype, block)
    return lse_N, (narrow(h_NP, dtype), narrow(W_SP, dtype), bias_S, ids_S, targets_N, lse_N)


def _sampled_logsumexp_backward(dtype, block, h_dtype, W_dtype, residuals, g_N):
    h_NP, W_SP, bias_S, ids_S, targets_N, lse_N = residuals
    d_NS, d_bias_S = _gradient(h_NP, W_SP, bias_S, ids_S, targets_N, lse_N, g_N, dtype, block)
    d_h = widened(jnp.matmul(d_NS, W_SP, preferred_element_type=result_type(dtype)))
    d_W = widened(jnp.matmul(d_NS.T, h_NP, preferred_element_type=result_type(dtype)))
    return d_h.astype(h_dtype), d_W.astype(W_dtype), d_bias_S.astype(bias_S.dtype), None, None


_sampled_logsumexp.defvjp(_sampled_logsumexp_forward, _sampled_logsumexp_backward)


def chosen_block(P: int, dtype: str) -> Block:
    """(rows, candidates) of a tile for P-wide rows in `dtype`: on a GPU the first of BLOCKS at
    which both kernels compile for the device the model is traced for (Triton stages the
    operands in its shared memory), elsewhere the largest. A UserError where none fits."""
    if kernel_calls.tiled():
        return TILED_BLOCK
    if not kernel_calls.compiled_by_triton():
        return BLOCKS[0]
    reason = unfit(P, dtype)
    if reason:
        raise UserError(f"softmax_kernel='pallas': {reason}: use softmax_kernel='xla'")
    return next(block for block in BLOCKS if _refusal(block, P, dtype) is None)


def unfit(P: int, dtype: str) -> str | None:
    """Why the kernels cannot run for P-wide rows in `dtype` on the device the model is traced
    for (the compiler's words at the smallest block), or None where a block fits."""
    if not kernel_calls.compiled_by_triton():
        return None
    if P & (P - 1):
        return f"Triton's blocks span whole powers of two, and the rows are {P} wide (projection_dim)"
    if any(_refusal(block, P, dtype) is None for block in BLOCKS):
        return None
    return (
        f"the sampled softmax's kernels do not fit on {device().device_kind} at any block size ({P}-wide rows in "
        f"{dtype}; at {BLOCKS[-1]}: {_refusal(BLOCKS[-1], P, dtype)})"
    )


def _refusal(block: Block, P: int, dtype: str) -> str | None:
    """The compiler's reason why the kernels at `block` cannot run on the device the model is
    traced for (`kernel_calls.refusal`), or None where both compile: compiled alone over one
    block of rows and two of candidates."""
    return kernel_calls.refusal((LSE, GRADIENT, block, P, dtype), functools.partial(_probes, block, P, dtype))


def _probes(block: Block, P: int, dtype: str, operand: kernel_calls.Operand) -> kernel_calls.Probes:
    """Both kernels at `block`, over one block of rows and two of candidates."""
    (n_rows, n_columns), f32, i32 = block, jnp.float32, jnp.int32
    h, W = operand((n_rows, P), dtype), operand((2 * n_columns, P), dtype)
    bias, ids, targets, rows = (
        operand((2 * n_columns,), f32),
        operand((2 * n_columns,), i32),
        operand((n_rows,), i32),
        operand((n_rows,), f32),
    )
    return {
        LSE: (lambda h, W, b, ids, t: _lse(h, W, b, ids, t, dtype, block), (h, W, bias, ids, targets)),
        GRADIENT: (
            lambda h, W, b, ids, t, lse, g: _gradient(h, W, b, ids, t, lse, g, dtype, block),
            (h, W, bias, ids, targets, rows, rows),
        ),
    }
