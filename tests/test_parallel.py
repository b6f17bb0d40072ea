"""Data parallelism on 8 fake CPU devices: the same numbers as one device, sharded layouts, the
bytes a step communicates, and the errors for layouts that cannot work."""

import dataclasses

import jax
import numpy as np
import pytest
from tiny_models import tiny_options

from elmo_jax.config import ModelConfig
from elmo_jax.plan.hlo import collectives_in_loops, communication_bytes, recurrence
from elmo_jax.settings import TrainSettings
from elmo_jax.text.batcher import Batch, StreamBatcher, round_up
from elmo_jax.text.demo_corpus import DemoCorpus
from elmo_jax.text.vocab import Vocabulary, count_words
from elmo_jax.train.parallel import DataParallel
from elmo_jax.train.step import init_train_state, make_train_step

CONFIG = ModelConfig.from_options(tiny_options(32, 8, 4, [[1, 8], [2, 8]]))
B, T = 16, 5


@pytest.fixture(scope="module")
def data():
    corpus = DemoCorpus("train", size=2_000)
    vocab = Vocabulary.from_counts(count_words(corpus.stream()))
    hp = TrainSettings(
        per_device_batch_size=B // 8, unroll_steps=T, n_tokens_vocab=len(vocab), n_negative_samples_batch=64
    )
    # Tables of distinct words rounded to a multiple of 8, which both layouts can take.
    batcher = StreamBatcher(corpus, vocab, B, T, seed=0, table_multiple=8)
    return hp, [next(batcher) for _ in range(3)]


def run(devices: int, shard_softmax: bool, hp: TrainSettings, batches: list[Batch], config: ModelConfig = CONFIG):
    parallel = DataParallel(devices)
    rows = round_up(hp.n_tokens_vocab, devices) if shard_softmax else hp.n_tokens_vocab
    init = lambda: init_train_state(jax.random.key(1), config, hp, B, rows)  # noqa: E731
    shardings = parallel.state_shardings(jax.eval_shape(init), shard_softmax)
    state = jax.jit(init, out_shardings=shardings)()
    step = make_train_step(config, hp, parallel=parallel, state_shardings=shardings)
    losses = []
    for batch in batches:
        state, metrics = step(state, parallel.put_batch(batch))
        losses.append(float(metrics["loss"]))
    return losses, state


@pytest.mark.parametrize("shard_softmax, sample_softmax", [(False, True), (True, True), (True, False)])
def test_8_devices_equal_1_device(data, shard_softmax, sample_softmax):
    hp, batches = data
    hp = dataclasses.replace(hp, sample_softmax=sample_softmax)
    want_losses, want = run(1, False, hp, batches)
    losses, got = run(8, shard_softmax, hp, batches)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    V = hp.n_tokens_vocab
    trim = lambda s: {**s.params, "softmax": jax.tree.map(lambda x: np.asarray(x)[:V], s.params["softmax"])}  # noqa: E731
    for a, b in zip(jax.tree.leaves(trim(got)), jax.tree.leaves(trim(want))):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(got.lstm_state.h, want.lstm_state.h, atol=1e-5)
    # The layout really is sharded: rows of the carried state, and the table when asked.
    assert got.lstm_state.h.sharding.shard_shape(got.lstm_state.h.shape)[2] == B // 8
    W = got.params["softmax"]["W"]
    assert W.sharding.shard_shape(W.shape)[0] == (W.shape[0] // 8 if shard_softmax else V)


def compiled_step(
    vocab_size: int, shard_softmax: bool, config: ModelConfig = CONFIG, per_device: int = 2, unroll: int = 5
) -> str:
    """HLO text of the train step compiled for 8 devices (nothing allocated)."""
    parallel = DataParallel(8)
    rows = round_up(vocab_size, 8) if shard_softmax else vocab_size
    hp = TrainSettings(
        per_device_batch_size=per_device, unroll_steps=unroll, n_tokens_vocab=vocab_size, n_negative_samples_batch=64
    )
    abstract = jax.eval_shape(lambda: init_train_state(jax.random.key(0), config, hp, 8 * per_device, rows))
    step = make_train_step(
        config, hp, parallel=parallel, state_shardings=parallel.state_shardings(abstract, shard_softmax)
    )
    batch = parallel.abstract_batch(8 * per_device, unroll, 64, config.char_cnn.max_characters_per_token)
    return step.lower(abstract, batch).compile().as_text()


@pytest.mark.slow  # compiles four 8-device steps (23 s of the fast lane): the collectives, not the numbers
@pytest.mark.parametrize("shard_softmax", [False, True])
def test_communication_does_not_grow_with_the_vocabulary(shard_softmax):
    small_hlo, large_hlo = compiled_step(1_000, shard_softmax), compiled_step(16_000, shard_softmax)
    small, large = communication_bytes(small_hlo), communication_bytes(large_hlo)
    assert small == large and set(large) >= {"all-reduce"}
    # Nothing is exchanged at every time step of the LSTM scans.
    assert collectives_in_loops(large_hlo) == []
    # Far less than one dense gradient of the table.
    assert sum(large.values()) < 16_000 * CONFIG.lstm.projection_dim * 4 / 4


def test_async_collectives_count_their_results_once():
    """A GPU program's collectives are async pairs whose start returns (operands, results): only
    the results count, whatever the layouts' commas."""
    program = """
  %ar = ((f32[1000]{0}, s32[2]{0}), (f32[1000]{0}, s32[2]{0})) all-reduce-start(%a, %b), channel_id=1
  %ard = (f32[1000]{0}, s32[2]{0}) all-reduce-done(%ar)
  %ag = ((f32[4,2]{1,0}), f32[32,2]{1,0}) all-gather-start(%c), dimensions={0}
  %agd = f32[32,2]{1,0} all-gather-done(%ag)
  %sync = bf16[10,3]{1,0} all-reduce(%d), to_apply=%add
"""
    assert communication_bytes(program) == {"all-reduce": 4000 + 8 + 60, "all-gather": 256}


@pytest.mark.parametrize("schedule", ["wavefront", "layers"])
def test_the_lstm_schedules_compile_to_their_loops(schedule):
    """The compiled step's only loops with matmuls are the LSTMs', forward and backward: with the
    wavefront one loop of T + L - 1 dependent iterations each way, with a loop per layer L loops
    of T each way."""
    L, T = CONFIG.lstm.n_layers, 5
    assert L >= 2
    found = recurrence(compiled_step(1_000, False, dataclasses.replace(CONFIG, lstm_schedule=schedule), unroll=T))
    want = [T + L - 1] * 2 if schedule == "wavefront" else [T] * 2 * L
    assert [loop["trip_count"] for loop in found["loops"] if loop["matmul"]] == want
    assert found["dependent_loop_iterations"] == sum(want)


def test_bf16_step_is_close_to_float32_and_keeps_float32_state(data):
    hp, batches = data
    f32_losses, _ = run(1, False, hp, batches)
    bf16 = dataclasses.replace(CONFIG, compute_dtype="bfloat16")
    losses, state = run(1, False, hp, batches, bf16)
    np.testing.assert_allclose(losses, f32_losses, rtol=2e-2)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {np.dtype("float32")}
    assert state.lstm_state.c.dtype == np.float32 and state.opt_state["softmax"]["W"].dtype == np.float32


def test_layouts_that_cannot_work_fail_clearly():
    with pytest.raises(ValueError, match=r"config.train.eval_batch_size=12 rows cannot be split evenly over 8 devices"):
        DataParallel(8).check_rows(12, "config.train.eval_batch_size")
    with pytest.raises(ValueError, match=r"devices=9: this run sees 8 device\(s\)"):
        DataParallel(9)
    with pytest.raises(ValueError, match="compute_dtype 'float16'"):
        dataclasses.replace(CONFIG, compute_dtype="float16").validate()
