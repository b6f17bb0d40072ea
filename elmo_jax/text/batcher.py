"""The stream batcher: B rows of packed sentences cut into windows of T (docs/MODEL.md section 5).

The rows form G groups of B / G consecutive rows (one group per device in training). In epoch
e, group g reads its own sentence stream S_eg (see `Corpus.view`: the groups' streams are
disjoint, and shuffled from (seed, e) unless `shuffle` is off); row i of the group reads
S_eg[i], S_eg[i + B/G], S_eg[i + 2B/G], ..., then goes on to epoch e + 1: an endless stream
`<S> w1 ... wn </S> <S> ...`. As in bilm-tf, a sentence of n words gives n + 1 positions:
forward inputs `<S> w1 ... wn`, targets `w1 ... wn </S>`; the backward LM reads a sentence
reversed, inputs `</S> wn ... w1`, targets `wn ... w1 <S>`.

Which sentences the backward LM reads (`backward_order`):
  independent  its own stream of the same sentences, shuffled independently of the forward one
               (bilm-tf's two `LMDataset`s) and packed into the rows in the same way, so in a
               batch the two LMs read different sentences; each row has a position per stream
  shared       the forward stream's sentences at the same positions (one position per row,
               fewer distinct words per batch); without shuffling the two orders are the same
Either way each LM's carried state of a row continues its own stream across batches. The
positions of every row are a small JSON-serialisable state.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from elmo_jax.errors import UserError
from elmo_jax.settings import BACKWARD_ORDERS
from elmo_jax.text.chars import PAD_CHAR, ByteChars, TokenIds
from elmo_jax.text.corpus import Corpus
from elmo_jax.text.tokenized import Tokenized
from elmo_jax.text.vocab import Vocabulary

Leaf = TypeVar("Leaf")


class Batch(NamedTuple, Generic[Leaf]):
    """One batch of the bidirectional LM (numpy on the host, jax.Array on the devices; a pytree,
    whose leaves may also be their shardings or shapes).

    chars   (U, C) int32      char ids of the batch's distinct input tokens (spare rows 0)
    ids     (2, B, T) int32   row of `chars` at each position; axis 0: forward, backward
    targets (2, B, T) int32   word ids to predict
    mask    (B, T) bool       positions that hold a token
    """

    chars: Leaf
    ids: Leaf
    targets: Leaf
    mask: Leaf


QUEUED_WINDOWS = 16  # a row queues sentences for this many windows at a time


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_size(n: int) -> int:
    """n rounded up to one of 4 sizes per power of two (>= 64), to bound compiled shapes."""
    return round_up(n, max(64, 2 ** (max(n, 1).bit_length() - 3)))


def char_columns(words_NC: np.ndarray, char_window: int | None, pad: int | None = PAD_CHAR + 1) -> int:
    """Columns a table of words' char ids (N, C) needs. With `char_window` w (the widest CNN
    filter), the padding (id `pad`) after the last word's characters is cut to w (rounded up
    to a multiple of 8, to bound the compiled shapes): every word keeps at least one window of
    padding only, whose value is the same for all, so each filter's max is unchanged."""
    C = words_NC.shape[1]
    if char_window is None:
        return C
    # After the last column any word fills: a character may share pad's id, so not a count.
    filled = np.flatnonzero((words_NC != pad).any(axis=0))
    longest = int(filled[-1]) + 1 if len(filled) else 0
    return min(C, round_up(longest + char_window, 8))


def epochs_done(state: dict, n_sentences: int) -> float:
    """Fractional passes over the corpus recorded in a batcher state, averaged over its rows'
    forward streams."""
    return float(np.mean([e + k * state["batch_size"] / n_sentences for e, k, *_ in state["rows"]]))


class _Queue(NamedTuple):
    """Positions queued per local row, (rows, capacity) arrays: what each direction reads (the
    rank of the word's characters, `WordTypes.ranks`) and predicts (its vocabulary id), None for a
    direction the stream does not serve; and where the position stands
    in its stream: `sentence` = epoch * 2^32 + the sentence's number in the epoch, `after` = the
    offset after it in the sentence, -1 at the sentence's end."""

    forward_input: np.ndarray | None
    forward_target: np.ndarray | None
    backward_input: np.ndarray | None
    backward_target: np.ndarray | None
    sentence: np.ndarray
    after: np.ndarray

    @classmethod
    def empty(cls, rows: int, capacity: int, directions: tuple[str, ...]) -> _Queue:
        def field(name: str):
            if name.split("_")[0] not in directions and name not in ("sentence", "after"):
                return None
            return np.zeros((rows, capacity), np.int64 if name == "sentence" else np.int32)

        return cls(*map(field, cls._fields))

    @property
    def capacity(self) -> int:
        return self.after.shape[1]

    def grown(self, capacity: int) -> _Queue:
        return _Queue._make(None if a is None else np.pad(a, ((0, 0), (0, capacity - a.shape[1]))) for a in self)


class _Window(NamedTuple):
    """A window of T positions of every local row, (rows, T) each; `valid` False where a row's
    single pass is over; a direction's fields None where the stream does not serve it."""

    valid: np.ndarray
    forward_input: np.ndarray | None
    forward_target: np.ndarray | None
    backward_input: np.ndarray | None
    backward_target: np.ndarray | None


class _Stream:
    """Where each local row stands in one stream of sentences: stream 0 (the forward LM's, and
    the backward LM's in the shared order) or 1 (the backward LM's own, see `Corpus.sentence_ids`).
    Each row queues the positions of its next sentences, many at a time, with whole-array numpy."""

    def __init__(self, batcher: StreamBatcher, number: int, directions: tuple[str, ...]):
        # A weak reference: a batcher is freed as soon as it is dropped (an evaluation's, every
        # eval_every steps), not at Python's rare full garbage collections.
        self.batcher, self.number, self.directions = weakref.proxy(batcher), number, directions
        self.views: dict[tuple[int, int], np.ndarray] = {}
        n = len(batcher.rows)
        self.group, self.index = np.divmod(np.asarray(batcher.rows, np.int64), batcher.group_rows)
        # Per local row: [epoch, sentences consumed in this epoch, offset in the current one].
        self.pos = np.zeros((n, 3), np.int64)
        self.restore(self.pos)

    def view(self, epoch: int, group: int) -> np.ndarray:
        """The sentence ids (storage order) group `group` reads in `epoch`."""
        if (epoch, group) not in self.views:
            self.views = {key: v for key, v in self.views.items() if key[0] >= epoch - 1}
            b = self.batcher
            self.views[epoch, group] = b.corpus.sentence_ids(epoch, group, b.groups, b.seed, b.shuffle, self.number)
        return self.views[epoch, group]

    def restore(self, positions: np.ndarray) -> None:
        self.pos = np.array(positions, np.int64).reshape(-1, 3)
        n = len(self.pos)
        self.next = self.pos[:, :2].copy()  # [epoch, sentence] of the next sentence to queue
        self.skip = self.pos[:, 2].copy()  # positions of that sentence already read
        capacity = 2 * QUEUED_WINDOWS * self.batcher.unroll_steps
        self.queue, self.fill, self.read = _Queue.empty(n, capacity, self.directions), np.zeros(n, np.int64), 0
        self.over = np.zeros(n, bool)  # a single pass: no sentence left to queue

    def window(self, T: int) -> _Window:
        """The next T positions of every row, moving the rows on."""
        self._top_up(T)
        n = len(self.pos)
        take = np.minimum(self.fill - self.read, T)
        if self.queue.capacity < self.read + T:
            self.queue = self.queue.grown(self.read + T)
        q, columns, rows = self.queue, slice(self.read, self.read + T), np.arange(n)
        last = np.maximum(self.read + take - 1, 0)
        sentence, after = q.sentence[rows, last], q.after[rows, last]
        ended, moved = after < 0, take > 0
        self.pos[moved, 0] = (sentence >> 32)[moved]
        self.pos[moved, 1] = ((sentence & 0xFFFFFFFF) + ended)[moved]
        self.pos[moved, 2] = np.where(ended, 0, after)[moved]
        # A row whose single pass ended in this window stands after its epoch's last sentence.
        finished = take < T
        self.pos[finished] = np.concatenate([self.next[finished], np.zeros((finished.sum(), 1), np.int64)], axis=1)
        self.read += T
        valid = take[:, None] > np.arange(T) if finished.any() else np.ones((n, T), bool)
        return _Window(valid, *(None if a is None else a[:, columns] for a in q[:4]))

    def _top_up(self, T: int) -> None:
        """Queues sentences until every row holds at least T positions (a single pass: or has
        none left), QUEUED_WINDOWS windows' worth at a time."""
        need = QUEUED_WINDOWS * T - (self.fill - self.read)
        if not ((self.fill - self.read < T) & ~self.over).any():
            return
        # Drop the positions read.
        q, keep = self.queue, int(self.fill.max()) - self.read
        for a in q:
            if a is not None:
                a[:, :keep] = a[:, self.read : self.read + keep]
        self.fill -= self.read
        self.read = 0
        b = self.batcher
        mean = b.mean_positions
        while True:
            wanted = np.flatnonzero((need > 0) & ~self.over)
            if not len(wanted):
                return
            parts = []
            for epoch, group in sorted(set(zip(self.next[wanted, 0].tolist(), self.group[wanted].tolist()))):
                rows = wanted[(self.next[wanted, 0] == epoch) & (self.group[wanted] == group)]
                view = self.view(epoch, group)
                left = np.maximum(-(-(len(view) - self.index[rows]) // b.group_rows) - self.next[rows, 1], 0)
                done = left == 0
                if done.any():
                    if b.single_pass:
                        self.over[rows[done]] = True
                    else:
                        self.next[rows[done]] = [epoch + 1, 0]
                rows, left = rows[~done], left[~done]
                count = np.minimum(left, np.ceil(need[rows] / mean).astype(np.int64) + 1)
                # Sentence k of a row in its group's epoch stream is view[index + k * group_rows].
                row_of = np.repeat(rows, count)
                k = self.next[row_of, 1] + _ragged_arange(count)
                parts.append((row_of, np.full(len(row_of), epoch), k, view[self.index[row_of] + k * b.group_rows]))
                self.next[rows, 1] += count
            if parts:
                row_of, epoch, k, ids = (np.concatenate(x) for x in zip(*parts))
                order = np.argsort(row_of, kind="stable")  # each row's sentences in their order
                need -= self._queue(row_of[order], epoch[order], k[order], ids[order])

    def _queue(self, row_of: np.ndarray, epoch: np.ndarray, k: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Appends the positions of sentences (grouped by row, in order) to their rows; returns
        the positions added per row."""
        b = self.batcher
        tokenized, n_rows = b.tokenized, len(self.pos)
        n = tokenized.lengths[ids].astype(np.int64)
        # A sentence of n words gives n + 1 positions; the first sentence queued after a
        # restore starts at its saved offset.
        first = np.ones(len(row_of), bool)
        first[1:] = row_of[1:] != row_of[:-1]
        start = np.where(first, self.skip[row_of], 0)
        self.skip[row_of[first]] = 0
        count = np.where(n > 0, n + 1 - start, 0)
        # The sentences as tokens <S> w1 ... wn </S>, one after the other, as what a position
        # reads (ranks) and predicts (vocabulary ids).
        tokens = np.empty(int((n + 2).sum()), np.int32)
        at = np.cumsum(n + 2) - (n + 2)  # each sentence's <S>
        tokens[_not_boundary(at, n, len(tokens))] = tokenized.ids[
            np.repeat(tokenized.starts[ids], n) + _ragged_arange(n)
        ]
        tokens[at], tokens[at + n + 1] = b.vocab.bos, b.vocab.eos
        types = tokenized.types
        reads, predicts = types.ranks[tokens], types.vocab_ids[tokens]
        # Position p of a sentence: forward, token p predicts p + 1; backward (the sentence
        # reversed), token n + 1 - p predicts n - p. `g`: each position's token p in `tokens`.
        total = int(count.sum())
        g = np.repeat(at + start - (np.cumsum(count) - count), count) + np.arange(total)
        # Each row's positions go after the ones it holds.
        added = np.bincount(row_of, weights=count, minlength=n_rows).astype(np.int64)
        end = int((self.fill + added).max(initial=0))
        if end > self.queue.capacity:
            self.queue = self.queue.grown(max(2 * self.queue.capacity, end))
        q = self.queue
        flat = np.repeat(np.arange(n_rows) * q.capacity + self.fill - (np.cumsum(added) - added), added)
        flat += np.arange(total)
        if q.forward_input is not None and q.forward_target is not None:
            q.forward_input.reshape(-1)[flat] = reads[g]
            q.forward_target.reshape(-1)[flat] = predicts[g + 1]
        if q.backward_input is not None and q.backward_target is not None:
            mirror = np.repeat(2 * at + n + 1, count) - g
            q.backward_input.reshape(-1)[flat] = reads[mirror]
            q.backward_target.reshape(-1)[flat] = predicts[mirror - 1]
        q.sentence.reshape(-1)[flat] = np.repeat((epoch << 32) + k, count)
        after = g - np.repeat(at - 1, count)
        after[after == np.repeat(n + 1, count)] = -1
        q.after.reshape(-1)[flat] = after
        self.fill += added
        return added


def _not_boundary(at: np.ndarray, n: np.ndarray, size: int) -> np.ndarray:
    """Of `size` tokens of sentences starting at `at` (n words each), those that are words."""
    mask = np.ones(size, bool)
    mask[at], mask[at + n + 1] = False, False
    return mask


def _ragged_arange(count: np.ndarray) -> np.ndarray:
    """0, 1, ..., count[i] - 1 for each i, one after the other."""
    return np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)


class StreamBatcher:
    """Yields `Batch`es: the distinct words of a window and where each one stands.

    The word table has U rows: the distinct count bucketed (`bucket_size`), or with
    `fixed_table` the bound 2 * B * T (every process of a multi-process mesh sends the same
    shape without asking the others); either rounded up to a multiple of `table_multiple` (the
    devices that split it). `rows` selects the
    global rows this process produces (all `batch_size` by default); `groups` divides them.
    `char_window` (the model's widest CNN filter) lets the batch drop the character columns no
    filter needs (see `char_columns`). `backward_order` is one of BACKWARD_ORDERS (module doc).
    With `single_pass` (shared order only) every row stops after one epoch and pads with mask 0;
    iteration ends when every row is done.
    """

    def __init__(
        self,
        corpus: Corpus,
        vocab: Vocabulary,
        batch_size: int,
        unroll_steps: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        single_pass: bool = False,
        rows: Sequence[int] | None = None,
        token_ids: TokenIds | None = None,
        table_multiple: int = 1,
        fixed_table: bool = False,
        groups: int = 1,
        char_window: int | None = None,
        backward_order: str = "independent",
    ):
        self.tokenized: Tokenized = corpus.tokenized(vocab, token_ids)
        # Positions per sentence, to size each row's next batch of sentences (one pass over the lengths).
        self.mean_positions = max(1.0, self.tokenized.positions() / max(len(self.tokenized.lengths), 1))
        if len(corpus) == 0:
            raise UserError(f"{corpus.name}: the corpus holds no sentences")
        if len(corpus) < batch_size and not single_pass:
            raise UserError(f"{corpus.name}: {len(corpus)} sentences cannot fill {batch_size} rows")
        if batch_size % groups:
            raise UserError(f"batch_size={batch_size} rows cannot form {groups} equal groups")
        if backward_order not in BACKWARD_ORDERS:
            raise ValueError(f"backward_order={backward_order!r}: must be one of {BACKWARD_ORDERS}")
        if single_pass and backward_order != "shared":
            raise ValueError("a single pass (evaluation) reads both LMs in the shared order")
        self.groups, self.group_rows = groups, batch_size // groups
        self.char_window = char_window
        self.corpus, self.vocab = corpus, vocab
        self.batch_size, self.unroll_steps = batch_size, unroll_steps
        self.seed, self.shuffle, self.single_pass = seed, shuffle, single_pass
        self.backward_order = backward_order
        self.rows = list(range(batch_size) if rows is None else rows)
        token_ids = token_ids if token_ids is not None else ByteChars()
        self.max_chars, self.pad, self.lead = token_ids.width, token_ids.pad, token_ids.lead
        self.table_multiple, self.fixed_table = table_multiple, fixed_table
        n_ranks = self.tokenized.types.n_ranks
        self._seen, self._slot = np.zeros(n_ranks, bool), np.zeros(n_ranks, np.int32)  # per batch, see __next__
        if backward_order == "independent":
            self._streams = [_Stream(self, 0, ("forward",)), _Stream(self, 1, ("backward",))]
        else:
            self._streams = [_Stream(self, 0, ("forward", "backward"))]

    # -- state ---------------------------------------------------------------------------
    @property
    def positions_shape(self) -> tuple[int, int]:
        """Shape of the global rows' positions in a state: (B, 3 per stream)."""
        return self.batch_size, 3 * len(self._streams)

    def state(self) -> dict:
        """{seed, batch_size, backward_order, rows}: per local row, [epoch, sentences read in
        it, offset in the current one] of the forward stream, then of the backward stream."""
        rows = np.concatenate([s.pos for s in self._streams], axis=1).tolist()
        return {"seed": self.seed, "batch_size": self.batch_size, "backward_order": self.backward_order, "rows": rows}

    def restore(self, state: dict) -> None:
        saved = (state["batch_size"], state["seed"], state.get("backward_order", "shared"))  # older states: shared
        if saved != (self.batch_size, self.seed, self.backward_order):
            raise ValueError(
                "batcher state is for batch_size={}, seed={}, backward_order={}; this batcher has ".format(*saved)
                + f"batch_size={self.batch_size}, seed={self.seed}, backward_order={self.backward_order}"
            )
        if len(state["rows"]) != len(self.rows):
            raise ValueError(f"batcher state has {len(state['rows'])} rows, expected {len(self.rows)}")
        rows = np.array(state["rows"], np.int64).reshape(len(self.rows), -1)
        for n, stream in enumerate(self._streams):
            stream.restore(rows[:, 3 * n : 3 * n + 3])

    # -- batches -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        T = self.unroll_steps
        windows = [stream.window(T) for stream in self._streams]
        forward, backward = windows[0], windows[-1]
        mask = forward.valid
        if not mask.any():
            raise StopIteration
        types = self.tokenized.types
        # The forward stream serves the forward LM, the last the backward LM (the same one when shared).
        assert forward.forward_input is not None and forward.forward_target is not None
        assert backward.backward_input is not None and backward.backward_target is not None
        ranks = np.stack([forward.forward_input, backward.backward_input])
        targets = np.stack([forward.forward_target, backward.backward_target])
        if not mask.all():  # a position without a token reads `<S>` (as it always has), predicts id 0
            ranks = np.where(mask, ranks, types.ranks[self.vocab.bos])
            targets = np.where(mask, targets, 0)
        # The batch's distinct rows of characters, in their ranks' order (`WordTypes`), so a batch
        # is the same whatever was read before it (resuming reproduces it bit for bit).
        self._seen[ranks] = True
        distinct = np.flatnonzero(self._seen)
        self._seen[distinct] = False
        self._slot[distinct] = np.arange(len(distinct), dtype=np.int32)
        words = types.chars[distinct]
        window = self.char_window if self.pad is not None else None
        columns = self.lead + char_columns(words[:, self.lead :], window, self.pad)
        chars = np.zeros((self._table_rows(len(distinct)), columns), np.int32)
        chars[: len(distinct)] = words[:, :columns]
        return Batch(chars, self._slot[ranks], targets, mask)

    def empty_batch(self) -> Batch:
        """A batch without tokens (mask all False), shaped like this batcher's."""
        B, T = len(self.rows), self.unroll_steps
        chars = np.zeros((self._table_rows(0), self.max_chars), np.int32)
        ids = np.zeros((2, B, T), np.int32)
        return Batch(chars, ids, ids.copy(), np.zeros((B, T), bool))

    def _table_rows(self, n_distinct: int) -> int:
        """Rows of the word table of a batch of `n_distinct` distinct input tokens."""
        bound = 2 * len(self.rows) * self.unroll_steps  # a window's inputs, both directions
        return round_up(bound if self.fixed_table else bucket_size(n_distinct), self.table_multiple)

    def single_pass_batches(self) -> int:
        """Batches one pass over the corpus takes: the global row with the most positions
        decides (every process can compute it, whichever rows it reads)."""
        most = 0
        for group in range(self.groups):
            n = self.tokenized.lengths[self._streams[0].view(0, group)].astype(np.int64)
            per_row = np.bincount(np.arange(len(n)) % self.group_rows, weights=np.where(n > 0, n + 1, 0))
            most = max(most, int(per_row.max(initial=0)))
        return -(-most // self.unroll_steps)

    def positions_per_epoch(self) -> int:
        """Predicted positions in one pass over the corpus: sum of (n + 1) over sentences."""
        return self.tokenized.positions()

    def steps_per_epoch(self) -> int:
        return math.ceil(self.positions_per_epoch() / (self.batch_size * self.unroll_steps))
