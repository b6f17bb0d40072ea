import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import tiny_options

from elmo_jax.config import ModelConfig
from elmo_jax.settings import TrainSettings
from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.text.demo_corpus import DemoCorpus, grammar
from elmo_jax.text.vocab import Vocabulary, count_words
from elmo_jax.train.evaluate import evaluate
from elmo_jax.train.parallel import data_parallel
from elmo_jax.train.step import (
    _SMALL_LEAF,
    _global_norm,
    _loss,
    init_train_state,
    make_train_step,
    softmax_rows,
    warmup,
)

TINY = tiny_options(64, 16, 8, [[1, 16], [2, 16], [3, 32]])


def test_softmax_rows_hold_each_directions_sampled_ids_and_targets():
    """The step's softmax rows: distinct, ascending, padded with the table's row count, and
    `candidates` / `targets` index each direction's own sampled ids and targets among them."""
    from elmo_jax.model.softmax import log_uniform_log_probs, sample_candidates

    hp = TrainSettings(n_tokens_vocab=500, n_negative_samples_batch=64)
    targets_2N = jnp.asarray(np.random.default_rng(0).integers(500, size=(2, 40)), jnp.int32)
    used = softmax_rows(jax.random.key(5), targets_2N, hp, 512)
    rows = np.asarray(used.rows)
    real = rows[rows < 512]
    assert (np.diff(real) > 0).all() and (rows[len(real) :] == 512).all()
    np.testing.assert_array_equal(rows[np.asarray(used.targets)], targets_2N)
    for d in range(2):
        sampled = sample_candidates(jax.random.fold_in(jax.random.key(5), d), log_uniform_log_probs(500), 64)
        np.testing.assert_array_equal(rows[np.asarray(used.candidates[d])], sampled.ids)


@pytest.fixture(scope="module")
def demo():
    train, heldout = DemoCorpus("train", size=20_000), DemoCorpus("heldout")
    vocab = Vocabulary.from_counts(count_words(train.stream()))
    return train, heldout, vocab


def test_one_step_is_clipped_adagrad_on_the_whole_table(demo):
    """The step updates only the softmax rows it uses; the result equals dense clipped Adagrad
    on every param of the gradient of unroll_steps x the loss (bilm-tf's objective), computed
    here with the whole table differentiated."""
    train, _, vocab = demo
    config = ModelConfig.from_options(TINY)
    hp = TrainSettings(
        per_device_batch_size=4,
        unroll_steps=5,
        n_tokens_vocab=len(vocab),
        n_negative_samples_batch=64,
        all_clip_norm_val=0.1,
    )
    state = init_train_state(jax.random.key(0), config, hp, 4)
    batch = next(StreamBatcher(train, vocab, 4, 5, seed=0))
    params0 = jax.tree.map(np.array, state.params)
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    k_dropout, k_sample = jax.random.split(rng)
    used = softmax_rows(k_sample, batch.targets.reshape(2, -1), hp, len(vocab))
    # The same sample, indexing the whole table.
    whole = used._replace(
        rows=jnp.arange(len(vocab)), candidates=used.rows[used.candidates], targets=used.rows[used.targets]
    )

    def objective(p):
        return (
            hp.unroll_steps * _loss(p, batch, state.lstm_state, k_dropout, whole, config, hp, data_parallel(1).mesh)[0]
        )

    grads = jax.jit(jax.grad(objective))(state.params)
    norm = np.sqrt(sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(grads)))
    assert norm > hp.all_clip_norm_val  # so the clip is exercised
    scale = hp.all_clip_norm_val / norm
    new_state, metrics = make_train_step(config, hp)(state, batch)
    np.testing.assert_allclose(metrics["grad_norm"], norm, rtol=1e-4)
    assert int(metrics["tokens"]) == 20 and int(new_state.step) == 1
    np.testing.assert_allclose(metrics["loss"], 0.5 * (metrics["loss_forward"] + metrics["loss_backward"]), rtol=1e-6)
    for p0, g, p1 in zip(jax.tree.leaves(params0), jax.tree.leaves(grads), jax.tree.leaves(new_state.params)):
        g = np.asarray(g) * scale
        np.testing.assert_allclose(p1, p0 - hp.learning_rate * g / np.sqrt(1.0 + g**2), atol=1e-6)
    touched = np.zeros(len(vocab), bool)
    touched[np.asarray(used.rows)[np.asarray(used.rows) < len(vocab)]] = True
    assert 0 < touched.sum() < len(vocab) / 2  # the test covers both kinds of rows
    np.testing.assert_array_equal(new_state.params["softmax"]["W"][~touched], params0["softmax"]["W"][~touched])
    np.testing.assert_allclose(
        new_state.opt_state["softmax"]["W"], 1.0 + (np.asarray(grads["softmax"]["W"]) * scale) ** 2, rtol=1e-6
    )
    # Same types in and out (no weak types), so the jitted step compiles once.
    avals = lambda s: [(x.dtype, x.shape, x.weak_type) for x in jax.tree.leaves(s)]  # noqa: E731
    assert avals(jax.eval_shape(lambda: new_state)) == avals(jax.eval_shape(lambda: state))
    # The carried LSTM state moved on; the next step starts from it.
    assert np.abs(np.asarray(new_state.lstm_state.h)).max() > 0


@pytest.mark.slow
def test_a_few_hundred_steps_cut_heldout_perplexity(demo):
    train, heldout, vocab = demo
    config = ModelConfig.from_options(TINY)
    hp = TrainSettings(
        per_device_batch_size=16, unroll_steps=10, n_tokens_vocab=len(vocab), n_negative_samples_batch=256
    )
    state = init_train_state(jax.random.key(0), config, hp, 16)
    before = evaluate(state.params, heldout, vocab, config, batch_size=32, max_sentences=300)
    step = make_train_step(config, hp)
    batcher = StreamBatcher(train, vocab, 16, 10, seed=0)
    for _ in range(300):
        state, metrics = step(state, next(batcher))
    after = evaluate(state.params, heldout, vocab, config, batch_size=32, max_sentences=300)
    print(
        f"held-out perplexity {before['perplexity']:.0f} -> {after['perplexity']:.1f} "
        f"(floor {grammar().floor_perplexity:.1f})"
    )
    assert before["perplexity"] > 0.5 * len(vocab)  # an untrained model is near uniform
    assert after["perplexity"] < before["perplexity"] / 5
    assert np.isfinite(float(metrics["loss"]))


def test_the_global_norm_counts_large_and_small_leaves_once():
    """`_global_norm`: leaves of _SMALL_LEAF elements and more summed each, the smaller ones
    together (one reduction): the norm of all of them, as optax.tree.norm gives it."""
    rng = np.random.default_rng(0)
    grads = {
        "lstm": {"W": rng.normal(size=(2, _SMALL_LEAF // 2)), "b": rng.normal(size=(7,))},
        "proj": rng.normal(size=(_SMALL_LEAF,)) * 1e-3,
        "filters": [rng.normal(size=(3, 5)) * 1e3, rng.normal(size=(1,))],
    }
    grads = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), grads)
    want = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads)))
    np.testing.assert_allclose(jax.jit(_global_norm)(grads), want, rtol=1e-6)


def test_the_learning_rate_follows_the_global_batch_only_when_asked():
    """The recipe's default applies learning_rate as it is at any batch (no warm-up); sqrt and
    linear scale it by the global batch's ratio to lr_reference_batch."""
    recipe = TrainSettings(per_device_batch_size=512, devices=8)
    assert (recipe.lr_batch_scaling, recipe.warmup_steps) == ("none", 0)
    assert recipe.batch_learning_rate() == recipe.learning_rate and warmup(recipe, jnp.int32(0)) is None
    for rule, want in (("none", 0.2), ("sqrt", 0.4), ("linear", 0.8)):
        hp = TrainSettings(per_device_batch_size=64, devices=2, lr_reference_batch=32, lr_batch_scaling=rule)
        assert hp.batch_learning_rate() == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="devices not resolved"):
        TrainSettings(devices=0, lr_batch_scaling="sqrt").batch_learning_rate()
    hp = TrainSettings(warmup_steps=4)
    factors = [float(warmup(hp, jnp.int32(s))) for s in range(6)]
    assert factors == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("sample_softmax", [True, False])
def test_warmup_and_batch_scaling_are_adagrad_at_the_rate_they_name(demo, sample_softmax):
    """A step at warm-up factor 1/4 is the plain step at a quarter of the rate, and a step of 4
    rows with sqrt scaling from 1 row the plain step at twice the rate: every param and
    accumulator (the dense params through optax, the softmax rows by our Adagrad)."""
    train, _, vocab = demo
    config = ModelConfig.from_options(TINY)
    base = dict(per_device_batch_size=4, unroll_steps=5, n_tokens_vocab=len(vocab), n_negative_samples_batch=64)
    base.update(sample_softmax=sample_softmax, devices=1, dropout=0.0)
    batch = next(StreamBatcher(train, vocab, 4, 5, seed=0))

    def stepped(**settings):
        hp = TrainSettings(**base, **settings)
        return jax.tree.map(
            np.asarray, make_train_step(config, hp)(init_train_state(jax.random.key(0), config, hp, 4), batch)[0]
        )

    plain = stepped(learning_rate=0.2)
    for got, want in (
        (stepped(learning_rate=0.8, warmup_steps=4), stepped(learning_rate=0.2)),
        (stepped(learning_rate=0.1, lr_batch_scaling="sqrt", lr_reference_batch=1), stepped(learning_rate=0.2)),
    ):
        for g, w in zip(jax.tree.leaves((got.params, got.opt_state)), jax.tree.leaves((want.params, want.opt_state))):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    moved, leaves = stepped(learning_rate=0.4), jax.tree.leaves  # a rate that differs moves the params elsewhere
    assert any(not np.allclose(m, p, rtol=1e-6, atol=1e-7) for m, p in zip(leaves(moved.params), leaves(plain.params)))
