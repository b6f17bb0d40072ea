"""What a corpus is: tokenized sentences with a name, read whole (`stream`), as numbers
(`tokenized`, for StreamBatcher), and the order in which one device group reads them in an
epoch (`sentence_ids`, see elmo_jax/text/batcher.py).

  InMemory             the methods for corpora with random access by index (`Sentences` here,
                       demo_corpus.DemoCorpus): an epoch permutes the indices from (seed, epoch)
                       and deals them to the groups in turn
  shards.ShardedCorpus files or an archive read shard by shard, with an order of its own
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from elmo_jax import stop_signals
from elmo_jax.text.chars import ByteChars, TokenIds
from elmo_jax.text.tokenized import Tokenized, tokenize_sentences
from elmo_jax.text.vocab import Vocabulary


class Corpus(Protocol):
    name: str

    @property
    def floor_perplexity(self) -> float | None:
        """The lowest perplexity a model can expect on it, where that is known (the demo corpus)."""
        ...

    def __len__(self) -> int: ...

    def stream(self) -> Iterator[list[str]]:
        """Every sentence once, in storage order."""
        ...

    def fingerprint(self) -> str:
        """A SHA-256 (hex) of what the text is: the same text, the same fingerprint, wherever its
        files are; another text, another fingerprint."""
        ...

    def sentence_ids(
        self, epoch: int, group: int, groups: int, seed: int, shuffle: bool, stream: int = 0
    ) -> np.ndarray:
        """The sentences (numbers in storage order) group `group` of `groups` reads in `epoch` of
        stream `stream` (0 the forward LM's, 1 the backward LM's own: shuffled independently, see
        `shuffle_rng`), in order; the groups' sentences are disjoint and together every one."""
        ...

    def tokenized(self, vocab: Vocabulary, token_ids: TokenIds | None = None) -> Tokenized:
        """Every sentence as word types (kept: later calls with the same vocabulary return it)."""
        ...


def shuffle_rng(stream: int, *key: int) -> np.random.Generator:
    """The generator of a shuffle from `key` (seed, epoch, ...) in sentence stream `stream`:
    stream 0's is default_rng(key), other streams' are independent of it (numpy's spawn keys)."""
    return np.random.default_rng(np.random.SeedSequence(list(key), spawn_key=(stream,) if stream else ()))


class InMemory:
    """Corpus methods for a class with __len__ and __getitem__ (and a `name`)."""

    if TYPE_CHECKING:  # what the class it is mixed into has

        def __len__(self) -> int: ...

        def __getitem__(self, i: Any) -> Any: ...

    def stream(self) -> Iterator[list[str]]:
        for i in range(len(self)):
            if i % 4096 == 0:  # a long pass (counting the words of 200,000 demo sentences) stops in between
                stop_signals.check()
            yield self[i]

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for sentence in self.stream():
            h.update(json.dumps(sentence).encode() + b"\n")
        return h.hexdigest()

    def sentence_ids(
        self, epoch: int, group: int, groups: int, seed: int, shuffle: bool, stream: int = 0
    ) -> np.ndarray:
        n = len(self)
        order = shuffle_rng(stream, seed, epoch).permutation(n) if shuffle else np.arange(n)
        return order[group::groups]

    def tokenized(self, vocab: Vocabulary, token_ids: TokenIds | None = None) -> Tokenized:
        key = (vocab.sha256, token_ids or ByteChars(), len(self))
        if getattr(self, "_tokenized", (None,))[0] != key:
            self._tokenized = (key, tokenize_sentences(self.stream(), vocab, token_ids))
        return self._tokenized[1]


class Sentences(InMemory, list):
    """A list of tokenized sentences with a name (and the floor of the corpus it came from)."""

    def __init__(self, sentences: Iterable[list[str]], name: str, floor_perplexity: float | None = None):
        super().__init__(sentences)
        self.name, self.floor_perplexity = name, floor_perplexity


def first_sentences(corpus: Corpus, n: int) -> Corpus:
    """The first n sentences of a corpus: in memory, or a corpus of its own kind where it has
    one (`first`: the demo corpus, which knows what made them)."""
    first = getattr(corpus, "first", None)
    if first is not None:
        return first(n)
    return Sentences(itertools.islice(corpus.stream(), n), corpus.name, corpus.floor_perplexity)
