"""Held-out perplexity as bilm-tf's run_test.py computes it (docs/MODEL.md section 5).

Full softmax, no dropout, LSTM states carried along each row, one pass over the sentences in
order; perplexity = exp(mean over positions of 0.5 * (forward CE + backward CE)). Unlike
run_test.py, the last partial batch is counted rather than dropped, so every position counts.
Rows are sharded over the devices like training batches; every process runs the same number of
batches (a process whose rows are done sends empty ones).

A word outside the vocabulary is scored as `<UNK>`, which is easier to predict than the word:
the share of such words is part of the result (`oov_rate`), and a warning says when it is high.
Where the corpus knows what made its sentences (the demo corpus), a perplexity below what the
source itself scores on them (`source_perplexity`) is impossible for a sound model of the text:
it is an error (RunFailed), not a result.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math

import jax
import numpy as np

from elmo_jax import stop_signals
from elmo_jax.config import ModelConfig
from elmo_jax.errors import RunFailed
from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.text.chars import TokenIds
from elmo_jax.text.corpus import Corpus, first_sentences
from elmo_jax.text.vocab import Vocabulary
from elmo_jax.train.parallel import DataParallel, data_parallel
from elmo_jax.train.step import eval_step

log = logging.getLogger(__name__)

HIGH_OOV = 0.05  # above this share of held-out words outside the vocabulary, a warning
# How far below the source's own perplexity a model may score by chance on a sample: a model
# close to the source differs from it little on every word, so its mean differs by far less.
SOURCE_SLACK = 0.01
_warned: set[tuple[str, str]] = set()  # (corpus, vocabulary) warned about their OOV rate


def safe_exp(x: float) -> float:
    """exp, with inf past the float range instead of OverflowError (and NaN kept)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


@functools.cache
def _jitted_eval(config: ModelConfig, vocab_size: int, parallel: DataParallel):
    state = parallel.lstm_state_sharding()
    return jax.jit(
        functools.partial(eval_step, config=config, vocab_size=vocab_size),
        in_shardings=(None, parallel.batch_shardings(), state),
        out_shardings=(parallel.replicated, parallel.replicated, state),
    )


def evaluate(
    params: dict,
    corpus: Corpus,
    vocab: Vocabulary,
    config: ModelConfig,
    batch_size: int = 64,
    unroll_steps: int = 20,
    max_sentences: int | None = None,
    parallel: DataParallel | None = None,
    token_ids: TokenIds | None = None,
) -> dict[str, float]:
    """-> forward_perplexity, backward_perplexity, perplexity, tokens (predicted positions),
    oov_rate (the share of its words outside the vocabulary), and floor_perplexity where the
    corpus knows its floor (the demo corpus). `batch_size` rows in all, split over the devices
    of `parallel` (default: all devices); `token_ids`: how the model's tokens become ids (default
    bilm-tf's). Raises RunFailed for an impossible perplexity."""
    parallel = parallel or data_parallel()
    parallel.check_rows(batch_size, "eval batch_size")
    if max_sentences is not None:
        corpus = first_sentences(corpus, max_sentences)
    batcher = StreamBatcher(
        corpus,
        vocab,
        batch_size,
        unroll_steps,
        shuffle=False,
        single_pass=True,
        rows=parallel.local_rows(batch_size),
        table_multiple=parallel.local_size,
        fixed_table=parallel.fixed_table,
        char_window=config.char_cnn.widest_filter,
        backward_order="shared",
        token_ids=token_ids,
    )
    step = _jitted_eval(config, len(vocab), parallel)
    params = parallel.onto_mesh(params)
    state = parallel.zeros_lstm_state(config, batch_size)
    sums, count = [], []
    batches = itertools.chain(batcher, itertools.repeat(None))
    for batch in itertools.islice(batches, batcher.single_pass_batches()):
        stop_signals.check()
        ce, n, state = step(params, parallel.put_batch(batch if batch is not None else batcher.empty_batch()), state)
        sums.append(ce)
        count.append(n)
    total = np.sum(np.stack(jax.device_get(sums)), axis=0, dtype=np.float64)
    tokens = int(np.sum(jax.device_get(count)))
    forward, backward = total / tokens
    result = {
        "forward_perplexity": safe_exp(forward),
        "backward_perplexity": safe_exp(backward),
        "perplexity": safe_exp(0.5 * (forward + backward)),
        "tokens": tokens,
        "oov_rate": _oov_rate(corpus, vocab, token_ids),
    }
    if corpus.floor_perplexity is not None:
        result["floor_perplexity"] = corpus.floor_perplexity
    _check_possible(result, corpus)
    return result


def _oov_rate(corpus: Corpus, vocab: Vocabulary, token_ids: TokenIds | None) -> float:
    """The share of the corpus's words outside the vocabulary; warns (once per corpus and
    vocabulary) where it is above HIGH_OOV."""
    tokenized = corpus.tokenized(vocab, token_ids)  # the batcher's: made once
    rate = tokenized.oov_rate()
    if rate > HIGH_OOV and (corpus.name, vocab.sha256) not in _warned:
        _warned.add((corpus.name, vocab.sha256))
        log.warning(
            "%s: %.1f%% of its %d words are outside the vocabulary of %d words and are scored as <UNK>, which is "
            "easier to predict: the perplexity is not that of the text (is the vocabulary the text's?)",
            corpus.name, 100 * rate, len(tokenized.ids), len(vocab),
        )  # fmt: skip
    return rate


def _check_possible(result: dict[str, float], corpus: Corpus) -> None:
    """RunFailed where the perplexity is below what the corpus's source scores on it."""
    source_perplexity = getattr(corpus, "source_perplexity", None)
    if source_perplexity is None or not math.isfinite(result["perplexity"]):
        return
    floor = source_perplexity()
    if result["perplexity"] < floor * (1 - SOURCE_SLACK):
        raise RunFailed(
            f"{corpus.name}: held-out perplexity {result['perplexity']:.3f} is below {floor:.3f}, what the grammar "
            f"that made these sentences scores on them: impossible for a model of this text. "
            f"{100 * result['oov_rate']:.1f}% of its words are outside the vocabulary and scored as <UNK>: "
            "is the vocabulary the text's?"
        )
