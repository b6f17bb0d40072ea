import gc
import json
import weakref

import numpy as np
import pytest

from elmo_jax.text.batcher import StreamBatcher, bucket_size
from elmo_jax.text.chars import token_char_ids
from elmo_jax.text.corpus import Sentences
from elmo_jax.text.vocab import Vocabulary, count_words


def list_corpus(sentences):
    return Sentences(sentences, "list")


def make_corpus(n=37, seed=0):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(25)]
    return list_corpus([list(rng.choice(words, size=rng.integers(1, 9))) for _ in range(n)])


def decode_row(batches, vocab, key, direction, row):
    out = []
    for b in batches:
        m = b.mask[row]
        if key == "targets":
            out += [vocab.words[i] for i in b.targets[direction, row][m]]
        else:
            out += [tuple(c) for c in b.chars[b.ids[direction, row]][m]]
    return out


def test_each_token_once_per_pass_in_order_forward_and_reversed_backward():
    corpus = make_corpus()
    vocab = Vocabulary.from_counts(count_words(corpus))
    B, T = 4, 5
    batcher = StreamBatcher(corpus, vocab, B, T, shuffle=False, single_pass=True, backward_order="shared")
    batches = list(batcher)
    for row in range(B):
        sentences = corpus[row::B]
        forward_targets = [w for s in sentences for w in [*s, "</S>"]]
        backward_targets = [w for s in sentences for w in [*s[::-1], "<S>"]]
        assert decode_row(batches, vocab, "targets", 0, row) == forward_targets
        assert decode_row(batches, vocab, "targets", 1, row) == backward_targets
        forward_inputs = [tuple(c) for s in sentences for c in token_char_ids(["<S>", *s])]
        backward_inputs = [tuple(c) for s in sentences for c in token_char_ids(["</S>", *s[::-1]])]
        assert decode_row(batches, vocab, "inputs", 0, row) == forward_inputs
        assert decode_row(batches, vocab, "inputs", 1, row) == backward_inputs
    total = sum(b.mask.sum() for b in batches)
    assert total == batcher.positions_per_epoch() == sum(len(s) + 1 for s in corpus)
    # Each batch holds its distinct tokens once, in a bucketed block.
    for b in batches:
        used = np.unique(b.ids[:, b.mask])
        assert len(np.unique(b.chars[used], axis=0)) == len(used)
        assert len(b.chars) == bucket_size(len(np.unique(b.ids)))


def test_word_table_rows_round_to_the_devices_or_take_the_fixed_bound():
    corpus = make_corpus()
    vocab = Vocabulary.from_counts(count_words(corpus))
    B, T = 3, 4
    single = next(StreamBatcher(corpus, vocab, B, T, shuffle=False, table_multiple=48))
    assert len(single.chars) == 96  # bucket_size (64 here) rounded up to a multiple of 48
    fixed = StreamBatcher(corpus, vocab, B, T, shuffle=False, table_multiple=5, fixed_table=True)
    # Every process's table: 2 * B * T (a window's inputs, both directions), rounded up to 5.
    assert len(next(fixed).chars) == len(fixed.empty_batch().chars) == 25
    np.testing.assert_array_equal(next(StreamBatcher(corpus, vocab, B, T, shuffle=False)).ids, single.ids)


def sentences_read(batches, vocab, direction, row):
    """The whole sentences a row's targets spell in one direction, in reading order (backward
    ones turned the right way round), and the inputs the row should have read for them."""
    end = "</S>" if direction == 0 else "<S>"
    sentences, words = [], []
    for w in decode_row(batches, vocab, "targets", direction, row):
        if w != end:
            words.append(w)
        else:
            sentences.append(words if direction == 0 else words[::-1])
            words = []
    first = "<S>" if direction == 0 else "</S>"
    inputs = [tuple(c) for s in sentences for c in token_char_ids([first, *(s if direction == 0 else s[::-1])])]
    return sentences, inputs


@pytest.mark.parametrize("order", ["independent", "shared"])
def test_shuffled_training_stream_reads_every_sentence_once_per_epoch(order):
    corpus = make_corpus(40)
    vocab = Vocabulary.from_counts(count_words(corpus))
    B, T, N = 4, 3, 40
    batcher = StreamBatcher(corpus, vocab, B, T, seed=3, backward_order=order)
    batches = [next(batcher) for _ in range(3 * batcher.steps_per_epoch())]
    assert all(b.mask.all() for b in batches)  # training batches are always full
    read = {}  # (direction, row) -> sentences
    for direction in (0, 1):
        epochs = [[], []]
        for row in range(B):
            sentences, inputs = sentences_read(batches, vocab, direction, row)
            # Inputs: <S> w1 ... wn forward, </S> wn ... w1 backward (the word table holds both).
            assert decode_row(batches, vocab, "inputs", direction, row)[: len(inputs)] == inputs
            n = len(range(row, N, B))
            epochs[0] += sentences[:n]
            epochs[1] += sentences[n : 2 * n]
            read[direction, row] = sentences[: 2 * n]
        assert sorted(epochs[0]) == sorted(corpus) == sorted(epochs[1])
        assert epochs[0] != epochs[1]  # reshuffled per epoch
    same = [read[0, row] == read[1, row] for row in range(B)]
    # Shared: the backward LM reads the forward LM's sentences; independent: a shuffle of its own.
    assert same == [order == "shared"] * B
    if order == "shared":
        bos, eos = token_char_ids(["<S>", "</S>"])
        # At the same positions: each sentence starts with <S> forward and </S> backward.
        starts = [(b.chars[b.ids[0]] == bos).all(-1) for b in batches]
        np.testing.assert_array_equal([(b.chars[b.ids[1]] == eos).all(-1) for b in batches], starts)
        assert np.sum(starts) > 40


@pytest.mark.parametrize("order", ["independent", "shared"])
def test_resume_from_saved_state_gives_identical_batches(order):
    corpus = make_corpus()
    vocab = Vocabulary.from_counts(count_words(corpus))
    a = StreamBatcher(corpus, vocab, 3, 4, seed=7, backward_order=order)
    for _ in range(11):
        next(a)
    saved = json.loads(json.dumps(a.state()))
    assert np.shape(saved["rows"]) == a.positions_shape == (3, 6 if order == "independent" else 3)
    expected = [next(a) for _ in range(25)]
    b = StreamBatcher(corpus, vocab, 3, 4, seed=7, backward_order=order)
    b.restore(saved)
    for want in expected:
        got = next(b)
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
    other_seed = StreamBatcher(corpus, vocab, 3, 4, seed=8, backward_order=order)
    with pytest.raises(ValueError, match="seed"):
        other_seed.restore(saved)
    other = "shared" if order == "independent" else "independent"
    with pytest.raises(ValueError, match=f"backward_order={order}; this batcher has .*backward_order={other}"):
        StreamBatcher(corpus, vocab, 3, 4, seed=7, backward_order=other).restore(saved)


def test_states_saved_before_the_backward_order_existed_are_shared_order():
    corpus = make_corpus()
    vocab = Vocabulary.from_counts(count_words(corpus))
    a = StreamBatcher(corpus, vocab, 3, 4, seed=7, backward_order="shared")
    next(a)
    older = {k: v for k, v in a.state().items() if k != "backward_order"}
    b = StreamBatcher(corpus, vocab, 3, 4, seed=7, backward_order="shared")
    b.restore(older)
    np.testing.assert_array_equal(next(b).targets, next(a).targets)
    with pytest.raises(ValueError, match="backward_order=shared"):
        StreamBatcher(corpus, vocab, 3, 4, seed=7).restore(older)


def test_bucket_sizes():
    assert [bucket_size(n) for n in (1, 64, 65, 400, 450, 3000)] == [64, 64, 128, 448, 512, 3072]
    assert all(n <= bucket_size(n) < 1.26 * n + 64 for n in range(1, 5000))


def test_deterministic_for_a_seed_and_different_across_seeds():
    corpus = make_corpus()
    vocab = Vocabulary.from_counts(count_words(corpus))
    first = [next(StreamBatcher(corpus, vocab, 3, 4, seed=s)).targets for s in (1, 1, 2)]
    np.testing.assert_array_equal(first[0], first[1])
    assert not np.array_equal(first[0], first[2])


def test_empty_sentences_are_skipped():
    corpus = list_corpus([["a", "b"], [], ["c"], []])
    vocab = Vocabulary.from_counts(count_words(corpus))
    batches = list(StreamBatcher(corpus, vocab, 1, 10, shuffle=False, single_pass=True, backward_order="shared"))
    assert decode_row(batches, vocab, "targets", 0, 0) == ["a", "b", "</S>", "c", "</S>"]


def test_rows_subset_reads_only_its_rows():
    corpus = make_corpus()
    vocab = Vocabulary.from_counts(count_words(corpus))
    full = next(StreamBatcher(corpus, vocab, 4, 5, seed=2))
    part = next(StreamBatcher(corpus, vocab, 4, 5, seed=2, rows=[2, 3]))
    np.testing.assert_array_equal(part.targets, full.targets[:, 2:])


def test_out_of_vocabulary_targets_become_unk_but_inputs_keep_their_characters():
    corpus = list_corpus([["known", "zebra"]])
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "known"])
    b = next(StreamBatcher(corpus, vocab, 1, 3, shuffle=False, single_pass=True, backward_order="shared"))
    assert [vocab.words[i] for i in b.targets[0, 0]] == ["known", "<UNK>", "</S>"]
    np.testing.assert_array_equal(b.chars[b.ids[1, 0, 1]], token_char_ids(["zebra"])[0])


def test_a_single_pass_reads_both_directions_in_the_shared_order():
    corpus = make_corpus()
    vocab = Vocabulary.from_counts(count_words(corpus))
    with pytest.raises(ValueError, match="shared order"):
        StreamBatcher(corpus, vocab, 4, 5, single_pass=True)
    with pytest.raises(ValueError, match="backward_order='reversed'"):
        StreamBatcher(corpus, vocab, 4, 5, backward_order="reversed")


def test_too_few_sentences_for_the_rows():
    corpus = make_corpus(3)
    vocab = Vocabulary.from_counts(count_words(corpus))
    with pytest.raises(ValueError, match="3 sentences cannot fill 4 rows"):
        StreamBatcher(corpus, vocab, 4, 5)


@pytest.mark.parametrize("order", ["independent", "shared"])
def test_a_dropped_batcher_is_freed_at_once_without_the_garbage_collector(order):
    """An evaluation makes a batcher every eval_every steps; a reference cycle would keep each
    (its char table, its sentences) until one of Python's rare full collections."""
    corpus = make_corpus()
    batcher = StreamBatcher(corpus, Vocabulary.from_counts(count_words(corpus)), 3, 4, backward_order=order)
    next(batcher)
    freed = weakref.ref(batcher)
    gc.disable()
    try:
        del batcher
        assert freed() is None
    finally:
        gc.enable()
