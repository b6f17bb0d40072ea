"""StreamBatcher (whole-array numpy over word numbers) makes the very batches and states of the
per-sentence reference (tests/reference_batcher.py, the batcher before 2026-12-05): random
corpora (empty sentences, words outside the vocabulary, multi-byte and long words) in both
orders, 1 or several groups, a process's subset of rows, fixed tables, single passes, several
epochs, and restored states."""

import json

import numpy as np
import pytest

from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.text.corpus import Sentences
from elmo_jax.text.demo_corpus import DemoCorpus
from elmo_jax.text.sources import open_corpus
from elmo_jax.text.vocab import Vocabulary, count_words
from tests.reference_batcher import ReferenceBatcher

WORDS = [f"w{i}" for i in range(60)] + ["café", "über", "ü" * 20, "x" * 47, "<S>"]


def random_corpus(seed: int, n: int) -> Sentences:
    rng = np.random.default_rng(seed)
    sentences = [list(rng.choice(WORDS, size=rng.integers(0, 14))) for _ in range(n)]
    return Sentences(sentences, f"random{seed}")


def assert_same(new: StreamBatcher, reference: ReferenceBatcher, n: int) -> int:
    """Compares up to n batches and the states after each; returns the batches compared."""
    for i in range(n):
        try:
            want = next(reference)
        except StopIteration:
            with pytest.raises(StopIteration):
                next(new)
            return i
        got = next(new)
        for name, x, y in zip(want._fields, got, want, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape, (i, name)
            np.testing.assert_array_equal(x, y, err_msg=f"batch {i}, {name}")
        assert json.dumps(new.state()) == json.dumps(reference.state()), i
    return n


def both(corpus, vocab, *args, **kwargs):
    return StreamBatcher(corpus, vocab, *args, **kwargs), ReferenceBatcher(corpus, vocab, *args, **kwargs)


@pytest.mark.parametrize("seed", range(6))
def test_random_configurations_make_the_reference_batches(seed):
    rng = np.random.default_rng(seed)
    corpus = random_corpus(seed, int(rng.integers(30, 90)))
    counts = count_words(corpus)
    vocab = Vocabulary.from_counts(counts, min_count=int(rng.integers(1, 4)))  # some words outside it
    groups = int(rng.choice([1, 2, 4]))
    B = groups * int(rng.integers(1, 4))
    T = int(rng.integers(1, 12))
    order = str(rng.choice(["independent", "shared"]))
    rows = None
    if groups > 1 and rng.random() < 0.5:  # one process's devices of several
        per = B // groups
        first = per * int(rng.integers(0, groups - 1))
        rows = range(first, first + 2 * per)
    kwargs = dict(seed=seed, groups=groups, rows=rows, backward_order=order, shuffle=bool(rng.random() < 0.8))
    kwargs |= dict(table_multiple=int(rng.choice([1, 2, 8])), fixed_table=bool(rng.random() < 0.3))
    kwargs |= dict(char_window=[None, 7][seed % 2])
    new, reference = both(corpus, vocab, B, T, **kwargs)
    steps = 3 * new.steps_per_epoch() + 5  # several epochs
    assert assert_same(new, reference, steps) == steps
    # Restored halfway through, both go on alike.
    saved = json.loads(json.dumps(new.state()))
    new, reference = both(corpus, vocab, B, T, **kwargs)
    new.restore(saved)
    reference.restore(saved)
    assert assert_same(new, reference, 40) == 40


@pytest.mark.parametrize("seed", range(3))
def test_single_passes_make_the_reference_batches(seed):
    corpus = random_corpus(100 + seed, 50)
    vocab = Vocabulary.from_counts(count_words(corpus), min_count=2)
    B = [1, 4, 9][seed]
    new, reference = both(corpus, vocab, B, 5, shuffle=False, single_pass=True, backward_order="shared")
    n = assert_same(new, reference, 1000)
    assert n == new.single_pass_batches() or n == new.single_pass_batches() - 1  # the last may be all padding


def test_text_shards_with_eight_groups_and_the_demo_corpus_make_the_reference_batches(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    for s in range(3):
        lines = [" ".join(rng.choice(WORDS, size=rng.integers(1, 20))) for _ in range(60)] + ["", "  ", "\u00a0"]
        data = "\n".join(lines).encode() + b"\n"
        (tmp_path / f"shard{s}.txt").write_bytes(data.replace(b"w7 ", b"w\xff7 ", 2))
    text = open_corpus(f"text:{tmp_path}/shard*.txt", "train")
    vocab = Vocabulary.from_counts(count_words(text.stream()), min_count=2)
    for kwargs in (dict(groups=8, table_multiple=8), dict(groups=8, rows=range(8, 24), fixed_table=True)):
        new, reference = both(text, vocab, 32, 10, seed=5, **kwargs)
        assert assert_same(new, reference, 60) == 60
    demo = DemoCorpus("train", size=2000)
    demo_vocab = Vocabulary.from_counts(count_words(demo.stream()))
    new, reference = both(demo, demo_vocab, 16, 20, seed=1, char_window=7)
    assert assert_same(new, reference, 30) == 30
