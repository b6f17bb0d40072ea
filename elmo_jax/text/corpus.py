"""What a corpus is: tokenized sentences with a name, read whole (`stream`), or as one device
group's share of an epoch (`view`, see elmo_jax/text/batcher.py), with the number of positions a
pass predicts.

  InMemory             the methods for corpora with random access by index (`Sentences` here,
                       demo_corpus.DemoCorpus): a view permutes the indices from (seed, epoch)
                       and deals them to the groups in turn
  shards.ShardedCorpus files or an archive read shard by shard, with views of its own
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import numpy as np


class Corpus(Protocol):
    name: str
    # The lowest perplexity a model can expect on it, where that is known (the demo corpus).
    floor_perplexity: float | None

    def __len__(self) -> int: ...

    def stream(self) -> Iterator[list[str]]:
        """Every sentence once, in storage order."""
        ...

    def view(
        self, epoch: int, group: int, groups: int, seed: int, shuffle: bool, stream: int = 0
    ) -> Sequence[list[str]]:
        """The sentences group `group` of `groups` reads in `epoch` of stream `stream` (0 the
        forward LM's, 1 the backward LM's own: shuffled independently, see `shuffle_rng`); the
        groups' views are disjoint and together hold every sentence."""
        ...

    def positions(self) -> int:
        """Predicted positions of one pass: the sum of (n + 1) over the non-empty sentences."""
        ...


def shuffle_rng(stream: int, *key: int) -> np.random.Generator:
    """The generator of a shuffle from `key` (seed, epoch, ...) in sentence stream `stream`:
    stream 0's is default_rng(key), other streams' are independent of it (numpy's spawn keys)."""
    return np.random.default_rng(np.random.SeedSequence(list(key), spawn_key=(stream,) if stream else ()))


class InMemory:
    """Corpus methods for a class with __len__ and __getitem__ (and a `name`)."""

    floor_perplexity: float | None = None

    def stream(self) -> Iterator[list[str]]:
        return (self[i] for i in range(len(self)))

    def view(
        self, epoch: int, group: int, groups: int, seed: int, shuffle: bool, stream: int = 0
    ) -> Sequence[list[str]]:
        n = len(self)
        order = shuffle_rng(stream, seed, epoch).permutation(n) if shuffle else np.arange(n)
        return _Indexed(self, order[group::groups])

    def positions(self) -> int:
        return sum(len(s) + 1 for s in self.stream() if s)


class _Indexed:
    def __init__(self, corpus: InMemory, indices: np.ndarray):
        self.corpus, self.indices = corpus, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> list[str]:
        return self.corpus[int(self.indices[i])]


class Sentences(InMemory, list):
    """A list of tokenized sentences with a name (and the floor of the corpus it came from)."""

    def __init__(self, sentences: Iterable[list[str]], name: str, floor_perplexity: float | None = None):
        super().__init__(sentences)
        self.name, self.floor_perplexity = name, floor_perplexity


def first_sentences(corpus: Corpus, n: int) -> Sentences:
    """The first n sentences of a corpus, in memory."""
    return Sentences(itertools.islice(corpus.stream(), n), corpus.name, corpus.floor_perplexity)
