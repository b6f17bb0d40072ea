"""A corpus as arrays of word types (see word_types.py), which StreamBatcher cuts into batches
with whole-array numpy: every sentence's words turned into numbers once.

  tokenize_lines   text lines (bytes) -> `Lines`: type numbers, words per line, the strings
                   outside the vocabulary (numbered from V), lines that were not valid UTF-8
  join             the `Lines` of a corpus's pieces -> `Tokenized`, each string outside the
                   vocabulary one type across the corpus
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from elmo_jax.text.chars import TokenIds
from elmo_jax.text.vocab import Vocabulary
from elmo_jax.text.word_types import WordTypes


class Lines(NamedTuple):
    """Lines of text as numbers. ids (N,) int32: a word's vocabulary id, or V + its index in
    `oov`; lengths (S,) int32: words per line (0 for a line of only whitespace); bad: the
    1-based numbers of lines that were not valid UTF-8 (decoded with U+FFFD)."""

    ids: np.ndarray
    lengths: np.ndarray
    oov: list[str]
    bad: np.ndarray


def number_words(words_per_line: list[list[str]], word_id: dict[str, int], bad: Iterable[int] = ()) -> Lines:
    """Tokenized lines -> `Lines` (ids from `word_id`, the vocabulary's word -> id)."""
    lengths = np.fromiter(map(len, words_per_line), np.int32, len(words_per_line))
    words = list(itertools.chain.from_iterable(words_per_line))
    ids = np.fromiter(map(word_id.get, words, itertools.repeat(-1, len(words))), np.int32, len(words))
    outside = np.flatnonzero(ids < 0)
    oov: dict[str, int] = {}
    if len(outside):
        ids[outside] = [len(word_id) + oov.setdefault(words[i], len(oov)) for i in outside]
    return Lines(ids, lengths, list(oov), np.array(list(bad), np.int64))


def tokenize_lines(lines: list[bytes], word_id: dict[str, int]) -> Lines:
    """Non-empty text lines (bytes, whitespace-separated words) -> `Lines`."""
    joined = b"\n".join(lines)
    try:
        texts = joined.decode("utf-8").split("\n")
        bad: list[int] = []
    except UnicodeDecodeError:
        texts = None
    if texts is None or len(texts) != len(lines):  # bad bytes, or a record holding a newline
        texts, bad = [], []
        for number, line in enumerate(lines, start=1):
            try:
                texts.append(line.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(line.decode("utf-8", errors="replace"))
                bad.append(number)
    return number_words([t.split() for t in texts], word_id, bad)


class Parted(Protocol):
    """A piece of a corpus as `Lines` has it, its ids perhaps read only when asked for
    (token_store.Cached)."""

    lengths: np.ndarray
    oov: list[str]
    bad: np.ndarray

    @property
    def ids(self) -> np.ndarray: ...


class Tokenized(NamedTuple):
    """Sentence s (in the corpus's storage order) is the types ids[starts[s] : starts[s] +
    lengths[s]]."""

    types: WordTypes
    ids: np.ndarray  # (N,) int32
    starts: np.ndarray  # (S,) int64
    lengths: np.ndarray  # (S,) int32

    def oov_rate(self) -> float:
        """The share of its words outside the vocabulary (types V and above)."""
        return float(np.count_nonzero(self.ids >= self.types.vocab_size) / max(len(self.ids), 1))

    def positions(self) -> int:
        """Positions of one pass: n + 1 for each sentence of n > 0 words."""
        n = self.lengths.astype(np.int64)
        return int((n + 1)[n > 0].sum())


def join(parts: Sequence[Lines | Parted], vocab: Vocabulary, token_ids: TokenIds | None = None) -> Tokenized:
    """The pieces of a corpus, in order, as one `Tokenized`: each piece's ids are read (a cached
    piece reads them from its file then) into one array made beforehand, one piece at a time."""
    V = len(vocab)
    oov: dict[str, int] = {}
    lengths = np.concatenate([p.lengths for p in parts]) if parts else np.zeros(0, np.int32)
    flat = np.empty(int(lengths.sum(dtype=np.int64)), np.int32)
    at = 0
    for part in parts:
        to_global = np.array([V + oov.setdefault(w, len(oov)) for w in part.oov], np.int32)
        ids = flat[at : at + int(part.lengths.sum(dtype=np.int64))]
        ids[:] = part.ids
        outside = np.flatnonzero(ids >= V)
        ids[outside] = to_global[ids[outside] - V]
        at += len(ids)
    starts = np.cumsum(lengths, dtype=np.int64) - lengths
    return Tokenized(WordTypes(vocab, list(oov), token_ids), flat, starts, lengths)


def tokenize_sentences(
    sentences: Iterable[list[str]], vocab: Vocabulary, token_ids: TokenIds | None = None
) -> Tokenized:
    """Sentences held in memory (token lists) -> `Tokenized`."""
    return join([number_words(list(sentences), vocab.word_ids)], vocab, token_ids)
