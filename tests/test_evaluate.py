"""Held-out evaluation equals the run_test.py formula computed directly: one pass, rows carrying
their LSTM state, full softmax, perplexity = exp(mean over positions of the two directions'
average cross entropy)."""

import jax
import numpy as np
import pytest
from tiny_models import tiny_options

from elmo_jax.config import ModelConfig
from elmo_jax.errors import RunFailed
from elmo_jax.model.bilm import bilm_top, init_params
from elmo_jax.model.lstm import LSTMState
from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.text.corpus import first_sentences
from elmo_jax.text.demo_corpus import DemoCorpus
from elmo_jax.text.vocab import Vocabulary, count_words
from elmo_jax.train.evaluate import evaluate


def test_evaluation_equals_the_formula():
    config = ModelConfig.from_options(tiny_options(32, 8, 4, [[1, 8], [2, 8]]))
    corpus = first_sentences(DemoCorpus("heldout"), 37)
    vocab = Vocabulary.from_counts(count_words(list(corpus.stream())[:20]))  # some held-out words are unknown
    params = jax.tree.map(np.asarray, init_params(jax.random.key(3), config, len(vocab)))
    params["softmax"]["b"] = np.linspace(-1, 1, len(vocab), dtype=np.float32)

    got = evaluate(params, corpus, vocab, config, batch_size=8, unroll_steps=6)  # 8 devices, 1 row each

    sums, count, state = np.zeros(2), 0, LSTMState.zeros(config, 8)
    for batch in StreamBatcher(corpus, vocab, 8, 6, shuffle=False, single_pass=True, backward_order="shared"):
        top, state = bilm_top(params, batch.chars, batch.ids, batch.mask, state, config)
        top = np.asarray(top, np.float64)
        for d in range(2):
            logits = top[d] @ np.asarray(params["softmax"]["W"], np.float64).T + params["softmax"]["b"]
            log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
            ce = log_z - np.take_along_axis(logits, batch.targets[d][..., None], -1)[..., 0]
            sums[d] += ce[batch.mask].sum()
        count += batch.mask.sum()
    assert got["tokens"] == count == sum(len(s) + 1 for s in corpus)
    np.testing.assert_allclose(
        [got["forward_perplexity"], got["backward_perplexity"], got["perplexity"]],
        [np.exp(sums[0] / count), np.exp(sums[1] / count), np.exp(sums.mean() / count)],
        rtol=1e-5,
    )


def test_a_perplexity_below_what_made_the_text_is_an_error_naming_the_words_outside_the_vocabulary(caplog):
    """A 3-word vocabulary scores every word as <UNK>: held-out perplexity 1.4 (in training) on the demo
    corpus, whose sentences the grammar itself scores at 20.9, was reported as a result."""
    config = ModelConfig.from_options(tiny_options(32, 8, 4, [[1, 8], [2, 8]]))
    corpus = DemoCorpus("heldout").first(40)
    vocab = Vocabulary(["<S>", "</S>", "<UNK>"])
    params = jax.tree.map(np.asarray, init_params(jax.random.key(3), config, len(vocab)))
    params["softmax"]["W"] = np.zeros_like(params["softmax"]["W"])
    params["softmax"]["b"] = np.array([-20.0, 0.0, 2.0], np.float32)  # <UNK> likely, </S> less so
    impossible = r"held-out perplexity \d\.\d+ is below 2\d\.\d+, what the grammar .* 100\.0% of its words are outside"
    with pytest.raises(RunFailed, match=impossible):
        evaluate(params, corpus, vocab, config, batch_size=8, unroll_steps=6)
    assert "100.0% of its" in caplog.text and "outside the vocabulary of 3 words" in caplog.text
