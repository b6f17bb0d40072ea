"""The stream batcher: B rows of packed sentences cut into windows of T (docs/MODEL.md section 5).

The rows form G groups of B / G consecutive rows (one group per device in training). In epoch
e, group g reads its own sentence stream S_eg (see `Corpus.view`: the groups' streams are
disjoint, and shuffled from (seed, e) unless `shuffle` is off); row i of the group reads
S_eg[i], S_eg[i + B/G], S_eg[i + 2B/G], ..., then goes on to epoch e + 1: an endless stream
`<S> w1 ... wn </S> <S> ...`. As in bilm-tf, a sentence of n words
gives n + 1 positions: forward inputs `<S> w1 ... wn`, targets `w1 ... wn </S>`; the backward LM
reads the same sentence reversed, inputs `</S> wn ... w1`, targets `wn ... w1 <S>`. Both streams
hold the same sentences at the same positions, so the carried LSTM state of each row continues
across batches. The position of every row is a small JSON-serialisable state.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from elmo_jax.errors import UserError
from elmo_jax.text.chars import BOS_TOKEN, EOS_TOKEN, PAD_CHAR, CharTable
from elmo_jax.text.corpus import Corpus
from elmo_jax.text.vocab import Vocabulary


class Batch(NamedTuple):
    """One batch of the bidirectional LM (numpy on the host, jax.Array on the devices; a pytree).

    chars   (U, C) int32      char ids of the batch's distinct input tokens (spare rows 0)
    ids     (2, B, T) int32   row of `chars` at each position; axis 0: forward, backward
    targets (2, B, T) int32   word ids to predict
    mask    (B, T) bool       positions that hold a token
    """

    chars: np.ndarray
    ids: np.ndarray
    targets: np.ndarray
    mask: np.ndarray


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_size(n: int) -> int:
    """n rounded up to one of 4 sizes per power of two (>= 64), to bound compiled shapes."""
    return round_up(n, max(64, 2 ** (max(n, 1).bit_length() - 3)))


def char_columns(words_NC: np.ndarray, char_window: int | None) -> int:
    """Columns a table of words' char ids (N, C) needs. With `char_window` w (the widest CNN
    filter), the padding after the longest word's characters is cut to w (rounded up to a
    multiple of 8, to bound the compiled shapes): every word keeps at least one window of padding
    only, whose value is the same for all, so each filter's max is unchanged."""
    C = words_NC.shape[1]
    if char_window is None:
        return C
    longest = int((words_NC != PAD_CHAR + 1).sum(axis=1).max(initial=0))
    return min(C, round_up(longest + char_window, 8))


def epochs_done(state: dict, n_sentences: int) -> float:
    """Fractional passes over the corpus recorded in a batcher state, averaged over its rows."""
    return float(np.mean([e + k * state["batch_size"] / n_sentences for e, k, _ in state["rows"]]))


class StreamBatcher:
    """Yields `Batch`es: the distinct words of a window and where each one stands.

    The word table has U rows: the distinct count bucketed (`bucket_size`), or with
    `fixed_table` the bound 2 * B * T (every process of a multi-process mesh sends the same
    shape without asking the others); either rounded up to a multiple of `table_multiple` (the
    devices that split it). `rows` selects the
    global rows this process produces (all `batch_size` by default); `groups` divides them.
    `char_window` (the model's widest CNN filter) lets the batch drop the character columns no
    filter needs (see `char_columns`). With `single_pass` every row
    stops after one epoch and pads with mask 0; iteration ends when every row is done.
    """

    def __init__(
        self,
        corpus: Corpus,
        vocab: Vocabulary,
        batch_size: int,
        unroll_steps: int,
        seed: int = 0,
        shuffle: bool = True,
        single_pass: bool = False,
        rows: Sequence[int] | None = None,
        chars: CharTable | None = None,
        table_multiple: int = 1,
        fixed_table: bool = False,
        groups: int = 1,
        char_window: int | None = None,
    ):
        if len(corpus) == 0:
            raise UserError(f"{corpus.name}: the corpus holds no sentences")
        if len(corpus) < batch_size and not single_pass:
            raise UserError(f"{corpus.name}: {len(corpus)} sentences cannot fill {batch_size} rows")
        if batch_size % groups:
            raise UserError(f"batch_size={batch_size} rows cannot form {groups} equal groups")
        self.groups, self.group_rows = groups, batch_size // groups
        self.char_window = char_window
        self.corpus, self.vocab = corpus, vocab
        self.batch_size, self.unroll_steps = batch_size, unroll_steps
        self.seed, self.shuffle, self.single_pass = seed, shuffle, single_pass
        self.rows = list(range(batch_size) if rows is None else rows)
        self.chars = chars or CharTable()
        self.table_multiple, self.fixed_table = table_multiple, fixed_table
        self._views: dict[tuple[int, int], object] = {}
        self._word_ids = np.zeros(0, np.int32)  # char-table row -> vocabulary id
        # Per local row: [epoch, sentences consumed in this epoch, offset in the current one].
        self._pos = [[0, 0, 0] for _ in self.rows]
        # Per local row: the sentence being read, [tokens with <S> and </S>, char-table rows or None].
        self._current: list[list | None] = [None] * len(self.rows)

    # -- state ---------------------------------------------------------------------------
    def state(self) -> dict:
        return {"seed": self.seed, "batch_size": self.batch_size, "rows": [list(p) for p in self._pos]}

    def restore(self, state: dict) -> None:
        if state["batch_size"] != self.batch_size or state["seed"] != self.seed:
            raise ValueError(
                f"batcher state is for batch_size={state['batch_size']}, seed={state['seed']}; "
                f"this batcher has batch_size={self.batch_size}, seed={self.seed}"
            )
        if len(state["rows"]) != len(self.rows):
            raise ValueError(f"batcher state has {len(state['rows'])} rows, expected {len(self.rows)}")
        self._pos = [list(map(int, p)) for p in state["rows"]]
        self._current = [None] * len(self.rows)

    # -- sentences -----------------------------------------------------------------------
    def _view(self, epoch: int, group: int):
        if (epoch, group) not in self._views:
            self._views = {key: v for key, v in self._views.items() if key[0] >= epoch - 1}
            self._views[epoch, group] = self.corpus.view(epoch, group, self.groups, self.seed, self.shuffle)
        return self._views[epoch, group]

    def _encode(self, sentences: list[list]) -> None:
        """Fills in the char-table rows of sentences [tokens, None], all in one lookup."""
        counts = [len(s[0]) for s in sentences]
        known = len(self.chars.tokens)
        rows = self.chars.ids([t for s in sentences for t in s[0]])
        if len(self.chars.tokens) > known:
            self._word_ids = np.concatenate([self._word_ids, self.vocab.ids(self.chars.tokens[known:])])
        for s, part in zip(sentences, np.split(rows, np.cumsum(counts)[:-1])):
            s[1] = part

    def _advance(self, j: int) -> bool:
        """Loads local row j's next non-empty sentence; False when a single pass is over."""
        group, i = divmod(self.rows[j], self.group_rows)
        while True:
            epoch, k, _ = self._pos[j]
            view = self._view(epoch, group)
            index = i + k * self.group_rows
            if index >= len(view):
                if self.single_pass:
                    return False
                self._pos[j] = [epoch + 1, 0, 0]
                continue
            words = view[index]
            if words:
                self._current[j] = [[BOS_TOKEN, *words, EOS_TOKEN], None]
                return True
            self._pos[j] = [epoch, k + 1, 0]

    # -- batches -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        T, B = self.unroll_steps, len(self.rows)
        # Which part of which sentence goes where: (row, time, offset in the sentence, length).
        segments, sentences = [], []
        for j in range(B):
            t = 0
            while t < T:
                if self._current[j] is None and not self._advance(j):
                    break
                sentence = self._current[j]
                epoch, k, offset = self._pos[j]
                take = min(len(sentence[0]) - 1 - offset, T - t)
                segments.append((j, t, offset, take, len(sentences)))
                sentences.append(sentence)
                t += take
                if offset + take == len(sentence[0]) - 1:
                    self._pos[j] = [epoch, k + 1, 0]
                    self._current[j] = None
                else:
                    self._pos[j] = [epoch, k, offset + take]
        if not segments:
            raise StopIteration
        self._encode([s for s in sentences if s[1] is None])
        flat_rows = np.concatenate([s[1] for s in sentences])
        flat_ids = self._word_ids[flat_rows]
        lengths = np.array([len(s[1]) for s in sentences])
        base = np.cumsum(lengths) - lengths
        seg_j, seg_t, seg_offset, seg_take, seg_sentence = np.array(segments).T
        # One entry per position: its row, time, and index in its sentence.
        each = np.repeat(np.arange(len(segments)), seg_take)
        within = np.arange(len(each)) - np.repeat(np.cumsum(seg_take) - seg_take, seg_take)
        j, t = seg_j[each], seg_t[each] + within
        start, n = base[seg_sentence[each]], lengths[seg_sentence[each]]
        p = seg_offset[each] + within
        # Backward position p reads the sentence reversed: token n - 1 - p, target n - 2 - p.
        rows = np.zeros((2, B, T), dtype=np.int64)
        targets = np.zeros((2, B, T), dtype=np.int32)
        mask = np.zeros((B, T), dtype=bool)
        rows[0, j, t], targets[0, j, t] = flat_rows[start + p], flat_ids[start + p + 1]
        rows[1, j, t], targets[1, j, t] = flat_rows[start + n - 1 - p], flat_ids[start + n - 2 - p]
        mask[j, t] = True
        distinct, inverse = np.unique(rows, return_inverse=True)
        words = self.chars.lookup(distinct)
        # Order the distinct words by their characters, not by cache row numbers, so a batch is
        # the same whatever the cache saw before it (resuming reproduces it bit for bit).
        # (Lexicographic over the columns: big-endian bytes of non-negative ids compare alike.)
        keys = np.ascontiguousarray(words, dtype=">i4").view(np.dtype((np.void, 4 * words.shape[1])))
        order = np.argsort(keys.ravel())
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        columns = char_columns(words, self.char_window)
        chars = np.zeros((self._table_rows(len(distinct)), columns), np.int32)
        chars[: len(distinct)] = words[order, : chars.shape[1]]
        ids = rank[inverse].reshape(rows.shape).astype(np.int32)
        return Batch(chars, ids, targets, mask)

    def empty_batch(self) -> Batch:
        """A batch without tokens (mask all False), shaped like this batcher's."""
        B, T = len(self.rows), self.unroll_steps
        chars = np.zeros((self._table_rows(0), self.chars.max_chars), np.int32)
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
            view, per_row = self._view(0, group), np.zeros(self.group_rows, np.int64)
            for k in range(len(view)):
                n = len(view[k])
                per_row[k % self.group_rows] += n + 1 if n else 0
            most = max(most, int(per_row.max()))
        return -(-most // self.unroll_steps)

    def positions_per_epoch(self) -> int:
        """Predicted positions in one pass over the corpus: sum of (n + 1) over sentences."""
        return self.corpus.positions()

    def steps_per_epoch(self) -> int:
        return math.ceil(self.positions_per_epoch() / (self.batch_size * self.unroll_steps))
