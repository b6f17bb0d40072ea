"""The stream batcher as it was before 2026-12-05 (one sentence at a time in Python, a cache of
character rows keyed by token): the reference StreamBatcher's whole-array batches must equal bit
for bit, with the corpora's sentence order (`sentence_ids`) and its tests' helpers unchanged.
Kept for the tests only (tests/test_batcher_equality.py)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence

import numpy as np

from elmo_jax.errors import UserError
from elmo_jax.settings import BACKWARD_ORDERS
from elmo_jax.text.batcher import Batch, bucket_size, char_columns, round_up
from elmo_jax.text.chars import BOS_TOKEN, EOS_TOKEN, CharTable
from elmo_jax.text.corpus import Corpus
from elmo_jax.text.vocab import Vocabulary


class _Stream:
    """Where each local row stands in one stream of sentences: stream 0 (the forward LM's, and
    the backward LM's in the shared order) or 1 (the backward LM's own, see `Corpus.view`)."""

    def __init__(self, batcher: ReferenceBatcher, number: int):
        # A weak reference: a batcher is freed as soon as it is dropped (an evaluation's, every
        # eval_every steps), not at Python's rare full garbage collections.
        self.batcher, self.number = weakref.proxy(batcher), number
        self.views: dict[tuple[int, int], object] = {}
        # Per local row: [epoch, sentences consumed in this epoch, offset in the current one].
        self.pos = [[0, 0, 0] for _ in batcher.rows]
        # Per local row: the sentence being read, [tokens with <S> and </S>, char-table rows or None].
        self.current: list[list | None] = [None] * len(batcher.rows)

    def view(self, epoch: int, group: int):
        if (epoch, group) not in self.views:
            self.views = {key: v for key, v in self.views.items() if key[0] >= epoch - 1}
            b = self.batcher
            ids = b.corpus.sentence_ids(epoch, group, b.groups, b.seed, b.shuffle, self.number)
            self.views[epoch, group] = [b.sentences[i] for i in ids]
        return self.views[epoch, group]

    def restore(self, positions: list[list[int]]) -> None:
        self.pos = [list(p) for p in positions]
        self.current = [None] * len(self.pos)

    def _advance(self, j: int) -> bool:
        """Loads local row j's next non-empty sentence; False when a single pass is over."""
        b = self.batcher
        group, i = divmod(b.rows[j], b.group_rows)
        while True:
            epoch, k, _ = self.pos[j]
            view = self.view(epoch, group)
            index = i + k * b.group_rows
            if index >= len(view):
                if b.single_pass:
                    return False
                self.pos[j] = [epoch + 1, 0, 0]
                continue
            words = view[index]
            if words:
                self.current[j] = [[BOS_TOKEN, *words, EOS_TOKEN], None]
                return True
            self.pos[j] = [epoch, k + 1, 0]

    def window(self, T: int) -> list[tuple[int, int, int, int, list]]:
        """The next T positions of every row as segments (row, time, offset in the sentence,
        positions taken, sentence), moving the rows on."""
        segments = []
        for j in range(len(self.pos)):
            t = 0
            while t < T:
                if self.current[j] is None and not self._advance(j):
                    break
                sentence = self.current[j]
                epoch, k, offset = self.pos[j]
                take = min(len(sentence[0]) - 1 - offset, T - t)
                segments.append((j, t, offset, take, sentence))
                t += take
                if offset + take == len(sentence[0]) - 1:
                    self.pos[j] = [epoch, k + 1, 0]
                    self.current[j] = None
                else:
                    self.pos[j] = [epoch, k, offset + take]
        return segments


class ReferenceBatcher:
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
        seed: int = 0,
        shuffle: bool = True,
        single_pass: bool = False,
        rows: Sequence[int] | None = None,
        chars: CharTable | None = None,
        table_multiple: int = 1,
        fixed_table: bool = False,
        groups: int = 1,
        char_window: int | None = None,
        backward_order: str = "independent",
    ):
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
        self.sentences = list(corpus.stream())
        self.batch_size, self.unroll_steps = batch_size, unroll_steps
        self.seed, self.shuffle, self.single_pass = seed, shuffle, single_pass
        self.backward_order = backward_order
        self.rows = list(range(batch_size) if rows is None else rows)
        self.chars = chars or CharTable()
        self.table_multiple, self.fixed_table = table_multiple, fixed_table
        self._word_ids = np.zeros(0, np.int32)  # char-table row -> vocabulary id
        self._streams = [_Stream(self, n) for n in range(2 if backward_order == "independent" else 1)]

    # -- state ---------------------------------------------------------------------------
    @property
    def positions_shape(self) -> tuple[int, int]:
        """Shape of the global rows' positions in a state: (B, 3 per stream)."""
        return self.batch_size, 3 * len(self._streams)

    def state(self) -> dict:
        """{seed, batch_size, backward_order, rows}: per local row, [epoch, sentences read in
        it, offset in the current one] of the forward stream, then of the backward stream."""
        rows = [sum((s.pos[j] for s in self._streams), []) for j in range(len(self.rows))]
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
        rows = [list(map(int, p)) for p in state["rows"]]
        for n, stream in enumerate(self._streams):
            stream.restore([p[3 * n : 3 * n + 3] for p in rows])

    # -- batches -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        T, B = self.unroll_steps, len(self.rows)
        windows = [stream.window(T) for stream in self._streams]
        if not windows[0]:
            raise StopIteration
        self._encode([seg[4] for segments in windows for seg in segments if seg[4][1] is None])
        rows = np.zeros((2, B, T), dtype=np.int64)
        targets = np.zeros((2, B, T), dtype=np.int32)
        mask = np.zeros((B, T), dtype=bool)
        layouts = [self._layout(segments) for segments in windows]
        for direction in (0, 1):
            j, t, start, n, p, flat = layouts[direction % len(layouts)]
            # Backward position p reads the sentence reversed: token n - 1 - p, target n - 2 - p.
            token = start + n - 1 - p if direction else start + p
            target = token - 1 if direction else token + 1
            rows[direction, j, t], targets[direction, j, t] = flat[token], self._word_ids[flat[target]]
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

    def _encode(self, sentences: list[list]) -> None:
        """Fills in the char-table rows of sentences [tokens, None], all in one lookup."""
        counts = [len(s[0]) for s in sentences]
        known = len(self.chars.tokens)
        rows = self.chars.ids([t for s in sentences for t in s[0]])
        if len(self.chars.tokens) > known:
            self._word_ids = np.concatenate([self._word_ids, self.vocab.ids(self.chars.tokens[known:])])
        for s, part in zip(sentences, np.split(rows, np.cumsum(counts)[:-1])):
            s[1] = part

    @staticmethod
    def _layout(segments: list) -> tuple[np.ndarray, ...]:
        """Every position of a window's segments: its row, time, the start of its sentence in
        `flat` and the sentence's length, its index p in the sentence; and `flat`, the
        char-table rows of the segments' sentences one after the other."""
        tables = [s[4][1] for s in segments]
        flat = np.concatenate(tables)
        lengths = np.array([len(x) for x in tables])
        start = np.cumsum(lengths) - lengths
        seg_j, seg_t, seg_offset, seg_take = np.array([s[:4] for s in segments]).T
        # One entry per position: its segment, and its index within the segment.
        each = np.repeat(np.arange(len(segments)), seg_take)
        within = np.arange(len(each)) - np.repeat(np.cumsum(seg_take) - seg_take, seg_take)
        return seg_j[each], seg_t[each] + within, start[each], lengths[each], seg_offset[each] + within, flat

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
