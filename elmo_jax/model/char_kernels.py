"""The char CNN's filters and their max over positions as Pallas kernels of our own
(`char_conv="pallas"`): the convolutions' (N, W, F) values, the train step's largest activation,
never leave the chip. XLA's path writes them, reads them for the max and for the positions that
hold it, and writes their gradient and reads it back twice (`elmo-jax plan` counts the bytes
of both; docs/archive/PERFORMANCE_LOG.md, "The char CNN's values off device memory").

- `max_and_ties`: per block of words and filters, each position's window of characters times
  the filters, rounded to the compute dtype, the max so far, the bits of the positions that
  hold it (`token_encoder._max_and_ties`' layout) and their count (the backward pass's divisor:
  its bits read only by the gradient kernels);
- `character_gradients` and `filter_gradients`: the products of the backward pass, with the
  max's gradient at each position (its share where the position's bit is set, else 0) built
  block by block from those bits; the first summed over the windows that hold each character
  into the characters' gradient (C, D) a word, the windows' (W, K) never in device memory (on a
  GPU a program a block of words, a character and 16 of its columns, on a TPU in VMEM).

Operands, in the compute dtype: on a GPU the characters, each word's D-wide characters flattened
and zero-padded (N, (W - 1) * D + K), position w's window the slice w * D.. w * D + K (K the
widest filter's width * D padded to a power of two: the characters a window holds past the
filter's width meet the bank's zero rows; the windows (W, N, K), 7 times the characters' bytes at
the published size, never in device memory); on a TPU the windows (W, K, N); the filter bank (K,
F); F and N padded to whole blocks (`kernel_calls.padded`). On GPUs they lower to Triton; on
TPUs their tiled
variants (`kernel_calls.tiled()`: each grid program's operands in VMEM blocks of whole positions,
words along the lanes, which the grid's pipeline fetches from device memory, the max, its bits
and the gradients' sums kept in their outputs' blocks) to Mosaic; on a CPU (this project's
tests, both variants) Pallas interprets them, to the numbers of token_encoder's XLA path. Each
kernel declares the HBM bytes it moves in its custom call's metadata (`kernel_calls.metadata`),
which `elmo_jax.plan` reads: on a GPU each operand once (the blocks that share an operand run
side by side and meet in L2), on a TPU the blocks the pipeline fetches (the filter bank once per
block of words).

On a GPU block sizes fit its shared memory (`chosen_block`): Triton stages a block's operands
there, and how much it asks for depends on the GPU's generation, the dtype, the matmul precision
and the widest window K in ways no formula here would track, so each kernel is compiled alone for
the device the model is traced for (as Triton's autotuner tries its configurations), from the
largest of BLOCKS down, and keeps the first that the compiler accepts.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from elmo_jax.errors import UserError
from elmo_jax.model import kernel_calls
from elmo_jax.model.backend import backend, device
from elmo_jax.model.kernel_calls import like, metadata, nbytes, product, refuse_where_unable

ROWS, COLUMNS = 64, 128  # a block's words and filters, at most (powers of two, as Triton's blocks are)
# (words, filters) of a block, tried in this order on a GPU until one fits its shared memory (`chosen_block`).
BLOCKS = ((ROWS, COLUMNS), (32, 128), (64, 64), (32, 64), (16, 64), (16, 32))
Block = tuple[int, int]  # (words, filters) of a grid program
DOT = 16  # Triton's smallest dot dimension: the character gradients' columns a GPU program
CHUNKS = 8  # the filter gradient's partial sums over words, at most (its grid: filter blocks x chunks)
# A TPU block's words and filters, at most (`kernel_calls.tiled()`; the filter gradient's: all filters), and the
# VMEM its pipeline may take (double-buffered blocks and each position's products: under 20 MB at
# the published size, float32).
TILED_ROWS, TILED_COLUMNS = 256, 512
LANES = 128  # a TPU block's words (the windows' last dimension) in multiples of these
VMEM_LIMIT = 48 << 20


def _divmod(a, b: int):
    """a // b and a % b of a non-negative int32 (lax's: Triton lowers jnp's sign fix-ups badly)."""
    return jax.lax.div(a, jnp.int32(b)), jax.lax.rem(a, jnp.int32(b))


def _bit(w):
    """Position w's word and bit in it (uint32)."""
    word, bit = _divmod(w, 32)
    return word, jnp.left_shift(jnp.uint32(1), bit.astype(jnp.uint32))


def _share(words_ref, share_ref, w, rows, columns, dtype):
    """The max's gradient at position w of a block: its share where w's bit is set, else 0."""
    word, bit = _bit(w)
    hit = (words_ref[word, rows, columns] & bit) != 0
    return jnp.where(hit, share_ref[rows, columns], 0).astype(dtype)


def _window(chars_ref, rows, w, D: int, K: int):
    """Position w's windows (rows, K) of a block of words: their characters w * D.. w * D + K."""
    start = w * D
    if not isinstance(w, int):  # traced: Triton told its alignment, D & -D (the largest power of 2 dividing D)
        start = pl.multiple_of(start, D & -D)
    return chars_ref[rows, pl.ds(start, K)]


def _max_kernel(chars_ref, bank_ref, last_ref, max_ref, count_ref, words_ref, *, W, D, dtype):
    # Grid (column blocks, row blocks): a block of words' programs side by side, its characters
    # read once from device memory.
    rows = pl.ds(pl.program_id(1) * max_ref.shape[0], max_ref.shape[0])
    bank, last = bank_ref[...], last_ref[...]

    def window_product(w):  # rounded to the compute dtype, -inf where the filter does not fit
        y = product(_window(chars_ref, rows, w, D, bank.shape[0]), bank, (1, 0))
        return jnp.where(w <= last[None, :], y.astype(dtype).astype(jnp.float32), -jnp.inf)

    def position(w, carry):
        top, count, *words = carry
        y, (at, bit) = window_product(w), _bit(w)
        above, tie = y > top, y == top
        words = [
            jnp.where(above, jnp.where(at == m, bit, 0), jnp.where(tie & (at == m), word | bit, word))
            for m, word in enumerate(words)
        ]
        return (jnp.maximum(top, y), jnp.where(above, 1, jnp.where(tie, count + 1, count)), *words)

    first = window_product(0)
    words = [jnp.full(first.shape, 1 if m == 0 else 0, jnp.uint32) for m in range(words_ref.shape[0])]
    top, count, *words = jax.lax.fori_loop(1, W, position, (first, jnp.ones(first.shape, jnp.int32), *words))
    max_ref[...] = top.astype(max_ref.dtype)  # exact: the max of values rounded to it
    count_ref[...] = count.astype(count_ref.dtype)
    columns = pl.ds(pl.program_id(0) * top.shape[1], top.shape[1])
    for m, word in enumerate(words):
        words_ref[m, rows, columns] = word


def _character_gradient_kernel(share_ref, words_ref, bank_ref, out_ref, *, W, width, n_rows, n_columns, dtype):
    # Program (i, c, q): columns q * DOT.. of character c's gradient of a block of words (rows,
    # DOT), the sum over the windows w = c - k that hold it as their k-th character (0 <= k <
    # width, 0 <= w < W) of the max's gradient at w times those columns of the bank's k-th Dp
    # rows. A block of words' programs side by side: its share and bits read once from device
    # memory (and from L2 by the others). A program's operands are the same for every D, so a
    # block that fits for D = DOT fits for all (`_probe`).
    C, Dp = out_ref.shape[1], out_ref.shape[2]
    i, cq = _divmod(pl.program_id(0), C * (Dp // DOT))
    c, q = _divmod(cq, Dp // DOT)
    rows = pl.ds(i * n_rows, n_rows)
    first, last = jnp.maximum(c - (W - 1), 0), jnp.minimum(c + 1, width)  # its windows' k

    def columns_block(j, acc):
        columns = pl.ds(j * n_columns, n_columns)
        share = share_ref[rows, columns]
        words = [words_ref[m, rows, columns] for m in range(words_ref.shape[0])]

        def window(k, acc):
            at, bit = _bit(c - k)
            word = functools.reduce(lambda a, m: jnp.where(at == m, words[m], a), range(1, len(words)), words[0])
            g = jnp.where((word & bit) != 0, share, 0).astype(dtype)
            return acc + product(g, bank_ref[pl.ds(pl.multiple_of(k * Dp + q * DOT, DOT), DOT), columns], (1, 1))

        return jax.lax.fori_loop(first, last, window, acc)

    acc = jnp.zeros((n_rows, DOT), jnp.float32)
    out_ref[rows, c, pl.ds(pl.multiple_of(q * DOT, DOT), DOT)] = jax.lax.fori_loop(
        0, share_ref.shape[1] // n_columns, columns_block, acc
    )


def _filter_gradient_kernel(chars_ref, share_ref, words_ref, out_ref, *, W, D, n_rows, n_columns, dtype):
    j, chunk = pl.program_id(0), pl.program_id(1)  # a chunk's column blocks side by side: its characters read once
    _, K, _ = out_ref.shape
    chunk_rows, columns = chars_ref.shape[0] // out_ref.shape[0], pl.ds(j * n_columns, n_columns)

    def block(t, acc):
        block_, w = _divmod(t, W)
        rows = pl.ds(chunk * chunk_rows + block_ * n_rows, n_rows)
        g = _share(words_ref, share_ref, w, rows, columns, dtype)
        return acc + product(_window(chars_ref, rows, w, D, K), g, (0, 0))

    acc = jnp.zeros((K, n_columns), jnp.float32)
    out_ref[chunk, :, columns] = jax.lax.fori_loop(0, chunk_rows // n_rows * W, block, acc)


def _tiled_max_kernel(windows_ref, bank_ref, last_ref, max_ref, count_ref, words_ref, tally_ref, *, dtype):
    # TPU: grid (row blocks, column blocks), blocks in VMEM: windows (W, K, rows), bank (K,
    # columns), last (1, columns); the max (rows, columns) and bits (M, rows, columns) kept in
    # the outputs' blocks, position by position, their count in the scratch `tally` (rows,
    # columns) int32.
    bank, last = bank_ref[...], last_ref[...]

    def window_product(w):  # rounded to the compute dtype, -inf where the filter does not fit
        y = product(windows_ref[w], bank, (0, 0))
        return jnp.where(w <= last, y.astype(dtype).astype(jnp.float32), -jnp.inf)

    def position(w, m: int, s):  # position w = 32 m + s: bit s of word m
        y, top = window_product(w), max_ref[...].astype(jnp.float32)
        bit = jnp.left_shift(jnp.uint32(1), s.astype(jnp.uint32))
        above, tie = y > top, y == top
        tally_ref[...] = jnp.where(above, 1, jnp.where(tie, tally_ref[...] + 1, tally_ref[...]))
        for other in range(words_ref.shape[0]):
            word = words_ref[other]
            if other == m:
                words_ref[other] = jnp.where(above, bit, jnp.where(tie, word | bit, word))
            else:
                words_ref[other] = jnp.where(above, jnp.uint32(0), word)
        max_ref[...] = jnp.maximum(top, y).astype(max_ref.dtype)  # exact: values rounded to it

    max_ref[...] = window_product(0).astype(max_ref.dtype)
    words_ref[...] = jnp.zeros(words_ref.shape, jnp.uint32)
    words_ref[0] = jnp.ones(max_ref.shape, jnp.uint32)
    tally_ref[...] = jnp.ones(max_ref.shape, jnp.int32)
    _over_positions(windows_ref.shape[0], position, first=1)
    count_ref[...] = tally_ref[...].astype(count_ref.dtype)


def _over_positions(W: int, body, first: int = 0) -> None:
    """body(w, m, s) for positions w = 32 m + s from `first` to W - 1, in order: a loop over
    each word m of the bits (m static, s traced)."""
    for m in range(-(-W // 32)):
        start = max(first - 32 * m, 0)
        jax.lax.fori_loop(start, min(32, W - 32 * m), lambda s, _, m=m: body(32 * m + s, m, s), None)


def _tiled_share(words_ref, share, m: int, s, dtype):
    """The max's gradient at position 32 m + s of a block: its share where the bit is set, else 0."""
    bit = jnp.left_shift(jnp.uint32(1), s.astype(jnp.uint32))
    return jnp.where((words_ref[m] & bit) != 0, share, 0).astype(dtype)


def _tiled_character_gradient_kernel(share_ref, words_ref, bank_ref, out_ref, windows_ref, *, D, width, dtype):
    # TPU: grid (row blocks, column blocks), the column blocks summed into the windows' gradient
    # (W, K, rows) in VMEM; after the last, the characters' (C, D, rows), character c the sum of
    # window c - k's k-th D rows (as token_encoder._characters sums them).
    @pl.when(pl.program_id(1) == 0)
    def _():
        windows_ref[...] = jnp.zeros(windows_ref.shape, jnp.float32)

    share, bank = share_ref[...], bank_ref[...]

    def position(w, m, s):
        windows_ref[w] += product(bank, _tiled_share(words_ref, share, m, s, dtype), (1, 1))

    W, C = windows_ref.shape[0], out_ref.shape[0]
    _over_positions(W, position)

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        for c in range(C):
            parts = [windows_ref[c - k, k * D : (k + 1) * D, :] for k in range(width) if 0 <= c - k < W]
            out_ref[c] = functools.reduce(jnp.add, parts)


def _tiled_filter_gradient_kernel(windows_ref, share_ref, words_ref, out_ref, *, dtype):
    # TPU: grid (chunks, a chunk's row blocks), the row blocks summed into out's block (1, K, F).
    @pl.when(pl.program_id(1) == 0)
    def _():
        out_ref[...] = jnp.zeros(out_ref.shape, jnp.float32)

    share = share_ref[...]

    def position(w, m, s):
        out_ref[0] += product(windows_ref[w], _tiled_share(words_ref, share, m, s, dtype), (1, 0))

    _over_positions(windows_ref.shape[0], position)


def _call(
    kernel, name: str, grid, in_specs, out_specs, out_shape, flops: int, args, touched=None, semantics=None, scratch=()
):
    """pallas_call of `kernel` over `grid` on `args`, declaring its FLOPs and the bytes it moves
    (`touched`; by default each operand and result once). `semantics`: a TPU grid's dimension
    semantics (its kernels, `kernel_calls.tiled()`), `scratch` its VMEM scratch."""
    refuse_where_unable("char_conv", args[0], on_tpu=True)
    if touched is None:
        touched = nbytes(*args, *jax.tree.leaves(out_shape))
    params = pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=VMEM_LIMIT) if semantics else None
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        interpret=backend() == "cpu",
        name=name,
        compiler_params=params,
        scratch_shapes=scratch,
        metadata=metadata(touched, flops),
    )(*args)


def padded_words(N: int) -> int:
    """N words padded to whole blocks (`kernel_calls.padded`): of ROWS, on a TPU of LANES."""
    return kernel_calls.padded(N, LANES if kernel_calls.tiled() else ROWS)


def max_and_ties(
    chars: jax.Array, bank_KF: jax.Array, last_F: jax.Array, W: int, D: int, dtype: str, block: Block | None = None
):
    """The W positions' windows of D-wide characters (the characters (N, (W - 1) * D + K), on a
    TPU the windows (W, K, N)) and the filter bank (K, F) in `dtype`, each filter's last position
    (F,) int32 (C - width; -1: a padding filter) -> the max over positions of the rounded
    products (N, F) in `dtype` (exact: each is rounded to it), the number of positions that hold
    it (N, F) (`count_dtype(W)`) and their bits (ceil(W / 32), N, F) uint32. `block`:
    (words, filters) of a grid program, by default `chosen_block`'s (as for the kernels below)."""
    N, K = _sizes(chars, W, D)
    if K != bank_KF.shape[0]:
        raise ValueError(
            f"the characters hold {K}-wide windows of {W} positions; the filter bank has {bank_KF.shape[0]} rows"
        )
    F, M = bank_KF.shape[1], -(-W // 32)
    n_rows, n_columns = _within(block or chosen_block(MAX, W, D, K, F, dtype), N, F)
    out_shape = (like(chars, (N, F), dtype), like(chars, (N, F), count_dtype(W)), like(chars, (M, N, F), jnp.uint32))
    flops = 2 * W * N * K * F
    if kernel_calls.tiled():  # the bank and last positions read once per block of rows
        return _call(
            functools.partial(_tiled_max_kernel, dtype=dtype),
            MAX,
            (N // n_rows, F // n_columns),
            [
                pl.BlockSpec((W, K, n_rows), lambda i, j: (0, 0, i)),
                pl.BlockSpec((K, n_columns), lambda i, j: (0, j)),
                pl.BlockSpec((1, n_columns), lambda i, j: (0, j)),
            ],
            (
                pl.BlockSpec((n_rows, n_columns), lambda i, j: (i, j)),
                pl.BlockSpec((n_rows, n_columns), lambda i, j: (i, j)),
                pl.BlockSpec((M, n_rows, n_columns), lambda i, j: (0, i, j)),
            ),
            out_shape,
            flops,
            (chars, bank_KF, last_F[None, :]),
            nbytes(chars, *out_shape) + N // n_rows * nbytes(bank_KF, last_F),
            ("parallel", "parallel"),
            [pltpu.VMEM((n_rows, n_columns), jnp.int32)],
        )
    return _call(
        functools.partial(_max_kernel, W=W, D=D, dtype=dtype),
        MAX,
        (F // n_columns, N // n_rows),
        [
            pl.no_block_spec,
            pl.BlockSpec((K, n_columns), lambda j, i: (0, j)),
            pl.BlockSpec((n_columns,), lambda j, i: (j,)),
        ],
        (*[pl.BlockSpec((n_rows, n_columns), lambda j, i: (i, j))] * 2, pl.no_block_spec),
        out_shape,
        flops,
        (chars, bank_KF, last_F),
    )


def character_gradients(
    share_NF: jax.Array,
    words_MNF: jax.Array,
    bank_KF: jax.Array,
    W: int,
    width: int,
    D: int,
    dtype: str,
    block: Block | None = None,
    C: int | None = None,
) -> jax.Array:
    """The max's gradient (its share of each max (N, F) in `dtype`, the bits of `max_and_ties`)
    times the filter bank's transpose, summed into the characters' gradient (the first C of the
    W + width - 1 characters of `width`-character windows of D-wide characters (all by default),
    the first width * D rows of the bank; character c the sum of window c - k's k-th D rows, as
    token_encoder._characters sums them) float32: on a GPU (N, C, D), on a TPU
    (`kernel_calls.tiled()`) (C, D, N). The windows' gradient (W, N, K) never in device memory
    (on a TPU summed in VMEM)."""
    N, F, K, M = *share_NF.shape, bank_KF.shape[0], words_MNF.shape[0]
    n_rows, n_columns = _within(block or chosen_block(CHARACTERS, W, D, K, F, dtype), N, F)
    C = W + width - 1 if C is None else C
    if kernel_calls.tiled():
        out_shape = like(share_NF, (C, D, N), jnp.float32)
        return _call(
            functools.partial(_tiled_character_gradient_kernel, D=D, width=width, dtype=dtype),
            CHARACTERS,
            (N // n_rows, F // n_columns),
            [
                pl.BlockSpec((n_rows, n_columns), lambda i, j: (i, j)),
                pl.BlockSpec((M, n_rows, n_columns), lambda i, j: (0, i, j)),
                pl.BlockSpec((K, n_columns), lambda i, j: (0, j)),
            ],
            pl.BlockSpec((C, D, n_rows), lambda i, j: (0, 0, i)),
            out_shape,
            2 * W * N * K * F,
            (share_NF, words_MNF, bank_KF),
            nbytes(share_NF, words_MNF, out_shape) + N // n_rows * nbytes(bank_KF),  # the bank once per block of rows
            ("parallel", "arbitrary"),
            [pltpu.VMEM((W, K, n_rows), jnp.float32)],
        )
    # GPU: each character's D rows of the bank in Dp = whole DOTs, zero-padded where D is not (the
    # published models' 16 need no copy).
    Dp = kernel_calls.whole_blocks(D, DOT)
    if Dp != D:
        bank_KF = jnp.pad(bank_KF[: width * D].reshape(width, D, F), ((0, 0), (0, Dp - D), (0, 0)))
        bank_KF = bank_KF.reshape(width * Dp, F)
    out_shape = like(share_NF, (N, C, Dp), jnp.float32)
    out = _call(
        functools.partial(
            _character_gradient_kernel, W=W, width=width, n_rows=n_rows, n_columns=n_columns, dtype=dtype
        ),
        CHARACTERS,
        (N // n_rows * C * (Dp // DOT),),
        [pl.no_block_spec] * 3,
        pl.no_block_spec,
        out_shape,
        # Each character's windows' products of Dp bank rows (a character's D padded to whole DOTs).
        2 * sum(min(c + 1, width) - max(c - W + 1, 0) for c in range(C)) * N * Dp * F,
        (share_NF, words_MNF, bank_KF),
    )
    return out if Dp == D else out[:, :, :D]


def filter_gradients(
    chars: jax.Array, share_NF: jax.Array, words_MNF: jax.Array, W: int, D: int, dtype: str, block: Block | None = None
) -> jax.Array:
    """The windows' transpose (of the characters as `max_and_ties` takes them) times the max's
    gradient (as `character_gradients` takes it): the filter bank's gradient (K, F) float32,
    summed over words in (at most) CHUNKS partial sums. On a GPU its rows past the widest
    filter's width * D are the characters past a window's, not 0: the caller drops them."""
    N, K = _sizes(chars, W, D)
    F, M = share_NF.shape[1], words_MNF.shape[0]
    n_rows, n_columns = _within(block or chosen_block(FILTERS, W, D, K, F, dtype), N, F)
    chunks = math.gcd(CHUNKS, N // n_rows)
    out_shape = like(share_NF, (chunks, K, F), jnp.float32)
    flops = 2 * W * N * K * F
    if kernel_calls.tiled():  # all F filters in a block (n_columns == F): the windows read once
        per_chunk = N // n_rows // chunks
        partial = _call(
            functools.partial(_tiled_filter_gradient_kernel, dtype=dtype),
            FILTERS,
            (chunks, per_chunk),
            [
                pl.BlockSpec((W, K, n_rows), lambda c, i: (0, 0, c * per_chunk + i)),
                pl.BlockSpec((n_rows, F), lambda c, i: (c * per_chunk + i, 0)),
                pl.BlockSpec((M, n_rows, F), lambda c, i: (0, c * per_chunk + i, 0)),
            ],
            pl.BlockSpec((1, K, F), lambda c, i: (c, 0, 0)),
            out_shape,
            flops,
            (chars, share_NF, words_MNF),
            semantics=("parallel", "arbitrary"),
        )
    else:
        partial = _call(
            functools.partial(_filter_gradient_kernel, W=W, D=D, n_rows=n_rows, n_columns=n_columns, dtype=dtype),
            FILTERS,
            (F // n_columns, chunks),
            [pl.no_block_spec] * 3,
            pl.no_block_spec,
            out_shape,
            flops,
            (chars, share_NF, words_MNF),
        )
    return partial.sum(axis=0)


MAX, CHARACTERS, FILTERS = "char_cnn_max", "char_cnn_character_gradients", "char_cnn_filter_gradients"
KERNELS = (MAX, CHARACTERS, FILTERS)


def _sizes(chars: jax.Array, W: int, D: int) -> tuple[int, int]:
    """N, K of the W positions' windows of D-wide characters: of the characters (N, (W - 1) * D +
    K), on a TPU of the windows (W, K, N)."""
    if kernel_calls.tiled():
        if chars.shape[0] != W:
            raise ValueError(f"windows {chars.shape} are not (W = {W}, K, N)")
        return chars.shape[2], chars.shape[1]
    return chars.shape[0], chars.shape[1] - (W - 1) * D


def _within(block: Block, N: int, F: int) -> Block:
    """A block of (words, filters) no larger than `block` that tiles the N words and F filters
    (padded): each the largest of block, block / 2, ... that divides them (N or F where smaller)."""
    return _dividing(N, block[0]), _dividing(F, block[1])


def chosen_block(kernel: str, W: int, D: int, K: int, F: int, dtype: str) -> Block:
    """(words, filters) of `kernel`'s grid programs for W positions, K-wide windows of D-wide
    characters and F filters (padded) in `dtype`: on a GPU the first of BLOCKS whose kernel
    compiles for the device the model is traced for (Triton stages the operands in its shared
    memory); on a TPU `_tiled_block`; elsewhere (Pallas interprets the kernels) the largest. A
    UserError where none fits."""
    if kernel_calls.tiled():
        return _tiled_block(kernel, F)
    if not kernel_calls.compiled_by_triton():
        return BLOCKS[0]
    for block in BLOCKS:
        if _refusal(kernel, block, W, D, K, F, dtype) is None:
            return block
    raise UserError(f"char_conv='pallas': {unfit(W, D, K, F, dtype)}: use char_conv='xla'")


def _tiled_block(kernel: str, F: int) -> Block:
    """A TPU block of `kernel` for F filters (padded): (TILED_ROWS, TILED_COLUMNS); the filter
    gradient's LANES words and all F filters (its (K, F) sums in VMEM, the windows read once)."""
    return (LANES, F) if kernel == FILTERS else (TILED_ROWS, TILED_COLUMNS)


def _dividing(n: int, most: int) -> int:
    """The largest of most, most / 2, ... (n where smaller) that divides n."""
    part = min(most, n)
    while n % part:
        part //= 2
    return part


def unfit(W: int, D: int, K: int, F: int, dtype: str) -> str | None:
    """Why the kernels cannot run for W positions, K-wide windows of D-wide characters and F
    filters in `dtype` on the device the model is traced for (the first that fits at no block
    size, and the compiler's words for its smallest), or None where each has a block that fits."""
    if not kernel_calls.compiled_by_triton():
        return None
    for kernel in KERNELS:
        if all(_refusal(kernel, block, W, D, K, F, dtype) for block in BLOCKS):  # stops at the first that fits
            (rows, columns), kind = BLOCKS[-1], device().device_kind
            return (
                f"the char CNN kernel {kernel} does not fit on {kind} at any block size ({K}-wide windows in "
                f"{dtype}; at {rows} words x {columns} filters: {_refusal(kernel, BLOCKS[-1], W, D, K, F, dtype)})"
            )
    return None


def count_dtype(W: int):
    """The dtype of a max's count of tied positions among W: int8 where it holds W, else int32."""
    return jnp.int8 if W <= jnp.iinfo(jnp.int8).max else jnp.int32


def _refusal(kernel: str, block: Block, W: int, D: int, K: int, F: int, dtype: str) -> str | None:
    """The compiler's reason why `kernel` at `block` cannot run on the device the model is traced
    for (`kernel_calls.refusal`), or None where it compiles: compiled alone over one block of
    words, whatever the width W: a block's operands in shared memory are one position's (its
    window (rows, K), at offsets w * D: as aligned for every W; the positions' bits, ceil(W / 32)
    words, are held in registers: compiled for an A100 in float32 at W = 3, 50, 200 and 400, D =
    16 and 50, each kernel fit or was refused alike, 2026-12-06), so the first width asked for
    answers for all (the train step asks at the widest before it is traced:
    token_encoder.resolved). Asked once per D: the windows' alignment, D's, changes what Triton
    stages (for an H200 in bfloat16 at K = 512 the largest block fits at D = 7, not at 16 or 50)."""
    return kernel_calls.refusal(
        (kernel, block, D, K, F, dtype), functools.partial(_probe, kernel, block, W, D, K, F, dtype)
    )


def _probe(
    kernel: str, block: Block, W: int, D: int, K: int, F: int, dtype: str, operand: kernel_calls.Operand
) -> kernel_calls.Probes:
    """`kernel` at `block`, over one block of words."""
    chars, bank, share = operand((ROWS, (W - 1) * D + K), dtype), operand((K, F), dtype), operand((ROWS, F), dtype)
    words = operand((-(-W // 32), ROWS, F), jnp.uint32)
    width = K // DOT  # characters of DOT: the character gradients' programs are the same for every D
    probes: kernel_calls.Probes = {
        MAX: (
            lambda x, b, last: max_and_ties(x, b, last, W, D, dtype, block),
            (chars, bank, operand((F,), jnp.int32)),
        ),
        CHARACTERS: (
            lambda s, bits, b: character_gradients(s, bits, b, W, width, DOT, dtype, block),
            (share, words, bank),
        ),
        FILTERS: (lambda x, s, bits: filter_gradients(x, s, bits, W, D, dtype, block), (chars, share, words)),
    }
    return {kernel: probes[kernel]}
