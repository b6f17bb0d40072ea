"""Held-out perplexity as bilm-tf's run_test.py computes it (ELMO_SPEC.md section 5).

Full softmax, no dropout, LSTM states carried along each row, one pass over the sentences in
order; perplexity = exp(mean over positions of 0.5 * (forward CE + backward CE)). Unlike
run_test.py, the last partial batch is counted rather than dropped, so every position counts.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.model.lstm import LSTMState
from elmo_jax.text.batcher import Corpus, StreamBatcher
from elmo_jax.text.vocab import Vocabulary
from elmo_jax.train.step import eval_step


class _Prefix:
    """The first n sentences of a corpus."""

    def __init__(self, corpus: Corpus, n: int):
        self.corpus, self.n, self.name = corpus, min(n, len(corpus)), corpus.name

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> list[str]:
        return self.corpus[i]


@functools.cache
def _jitted_eval(config: ModelConfig):
    return jax.jit(functools.partial(eval_step, config=config))


def evaluate(
    params: dict,
    corpus: Corpus,
    vocab: Vocabulary,
    config: ModelConfig,
    batch_size: int = 64,
    unroll_steps: int = 20,
    max_sentences: int | None = None,
) -> dict[str, float]:
    """-> forward_perplexity, backward_perplexity, perplexity, tokens (predicted positions)."""
    if max_sentences is not None:
        corpus = _Prefix(corpus, max_sentences)
    batcher = StreamBatcher(corpus, vocab, batch_size, unroll_steps, shuffle=False, single_pass=True)
    step = _jitted_eval(config)
    state = LSTMState.zeros(config, batch_size)
    sums, count = [], []
    for batch in batcher:
        ce, n, state = step(params, batch, state)
        sums.append(ce)
        count.append(n)
    total = np.sum(np.stack(jax.device_get(sums)), axis=0, dtype=np.float64)
    tokens = int(np.sum(jax.device_get(count)))
    forward, backward = total / tokens
    return {
        "forward_perplexity": math.exp(forward),
        "backward_perplexity": math.exp(backward),
        "perplexity": math.exp(0.5 * (forward + backward)),
        "tokens": tokens,
    }
