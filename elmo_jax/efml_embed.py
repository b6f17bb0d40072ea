"""ELMoForManyLangs' `Embedder(folder).sents2elmo(sentences, output_layer)`, on our `Embedder`:
the same numbers for the same calls, their batching and their carried state included.

    embedder = EfmlEmbedder("zh.model")           # their folder, or a loaded Model
    vectors = embedder.sents2elmo([["今天", "天气", "很", "好"]])   # [(n, 2P)], the 3 layers' mean

Their code sorts the sentences by length (longest first, ties in input order), cuts them into
batches of `batch_size` rows, runs the batches in an order shuffled by Python's `random`, and
keeps the LSTMs' state per batch row from batch to batch and call to call, never reset: a
batch's row k starts where the last batch with a row k left it (zeros at first). So only a fresh
embedder's first batch starts from zeros, and their results depend on the shuffle. Here the
batches run in sorted order unless `shuffle` (a `random.Random`) reorders them as theirs would
(the same seed, the same order); `reset()` zeroes the state. For vectors that do not depend on
the batch at all, use `elmo_jax.embed.Embedder` (stateless) or `Elmo`.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from elmo_jax.embed import Embedder
from elmo_jax.model_io import Model, load_model
from elmo_jax.text.chars import check_sentences


class EfmlEmbedder:
    """Sentences -> their `sents2elmo` output, one numpy float32 array each: output_layer -2: all
    layers (L + 1, n, 2P); 0..L: that layer (n, 2P); -1: their mean (n, 2P). `source`: their
    folder, a workdir fine-tuning one, or any model `load_model` reads (bilm-tf's too)."""

    def __init__(
        self,
        source: str | Path | Model,
        batch_size: int = 64,
        shuffle: random.Random | None = None,
        devices: int | None = None,
    ):
        model = source if isinstance(source, Model) else load_model(source)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: must be a positive integer")
        if shuffle is not None and not isinstance(shuffle, random.Random):
            raise TypeError(f"shuffle={shuffle!r}: a random.Random (random.Random(seed)) or None")
        self.model, self.batch_size, self.shuffle, self.devices = model, batch_size, shuffle, devices
        self.reset()

    def reset(self) -> None:
        """Every row's state back to zeros (a fresh embedder of theirs)."""
        self.embedder = Embedder(self.model, self.batch_size, stateful=True, devices=self.devices)

    def batches(self, n_lengths: list[int]) -> list[list[int]]:
        """The sentence indices of each batch, in the order they run (row k = the k-th index)."""
        order = sorted(range(len(n_lengths)), key=lambda i: -n_lengths[i])
        batches = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        if self.shuffle is not None:
            perm = list(range(len(batches)))
            self.shuffle.shuffle(perm)
            batches = [batches[i] for i in perm]
        return batches

    def sents2elmo(self, sentences: list[list[str]], output_layer: int = -1) -> list[np.ndarray]:
        """Token lists -> one array per sentence, in their order (`EfmlEmbedder`'s shapes); the
        state carries on from the last call (`reset`)."""
        check_sentences(sentences)
        layers = self.model.config.lstm.n_layers + 1
        if isinstance(output_layer, bool) or not isinstance(output_layer, int) or not -2 <= output_layer < layers:
            raise ValueError(f"output_layer={output_layer!r}: -2 (all), -1 (their mean) or a layer 0..{layers - 1}")
        out: list[np.ndarray] = [np.empty(0)] * len(sentences)
        for batch in self.batches([len(s) for s in sentences]):
            for i, vectors in zip(batch, self.embedder([list(sentences[i]) for i in batch])):
                out[i] = (
                    vectors
                    if output_layer == -2
                    else vectors.mean(axis=0)
                    if output_layer == -1
                    else vectors[output_layer]
                )
        return out
