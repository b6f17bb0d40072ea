"""Four steps of bilm-tf's own training code (fixtures/bilm_tf_training, README there): started
from the recorded initial values and fed the recorded batches, our train step must give every
recorded quantity after each step: losses, gradient norm, top LSTM outputs, carried states,
every param and every Adagrad accumulator (full softmax, no dropout, so it is deterministic)."""

import dataclasses

import jax
import numpy as np
import pytest
from bilm_tf_fixture import load, params_from_tf, params_to_tf, start_state

from elmo_jax.model.bilm import bilm_top
from elmo_jax.text.chars import CharTable
from elmo_jax.train.step import make_train_step

TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def recorded(fixture_set):
    return load(fixture_set / "bilm_tf_training")


def test_char_ids_are_bilm_tf_training_ids_plus_one(recorded):
    """At every input position of the recorded batches whose word is in the vocabulary (the long
    one cut to 48 bytes, accented letters as two bytes each, <S>, </S>), bilm-tf's raw training
    char ids are our char encoding of that word minus 1."""
    words = sorted({word for word, _ in recorded.spelled})
    ours = dict(zip(words, CharTable().encode(words) - 1))
    for word, row in recorded.spelled:
        np.testing.assert_array_equal(row, ours[word], err_msg=word)
    assert {"<S>", "</S>"} <= set(words) and len(words) > 30


def test_the_variable_mapping_round_trips(recorded):
    """params_to_tf (used by benchmarks/parity/bilm_tf_dropout.py) inverts params_from_tf."""
    config, _, values, *_ = recorded
    back = params_from_tf(params_to_tf(values["initial"], config), config, 0.0)
    jax.tree.map(np.testing.assert_array_equal, back, values["initial"])


def test_four_steps_match_bilm_tf_training(recorded):
    config, hp, values, steps, *_ = recorded
    state = start_state(config, hp, values)
    train_step = make_train_step(config, hp)
    top = jax.jit(lambda p, b, s: bilm_top(p, b.chars, b.ids, b.mask, s, config)[0])
    for k, rec in enumerate(steps, start=1):
        for got, want in zip(state.lstm_state, rec["init_state"]):
            np.testing.assert_allclose(got, want, **TOL, err_msg=f"step {k} initial state")
        np.testing.assert_allclose(
            top(state.params, rec["batch"], state.lstm_state), rec["outputs"], **TOL, err_msg=f"step {k} outputs"
        )
        state, metrics = train_step(state, rec["batch"])
        for key, value in rec["metrics"].items():
            np.testing.assert_allclose(float(metrics[key]), value, **TOL, err_msg=f"step {k} {key}")
        np.testing.assert_allclose(state.lstm_state.h, rec["final_state"][0], **TOL, err_msg=f"step {k} final h")
        np.testing.assert_allclose(state.lstm_state.c, rec["final_state"][1], **TOL, err_msg=f"step {k} final c")
        jax.tree.map_with_path(
            lambda path, got, want, k=k: np.testing.assert_allclose(
                got, want, **TOL, err_msg=f"step {k} {jax.tree_util.keystr(path)}"
            ),
            state.params,
            rec["params"],
        )
        accumulators = {**state.opt_state["dense"][0].sum_of_squares, "softmax": state.opt_state["softmax"]}
        jax.tree.map_with_path(
            lambda path, got, want, k=k: np.testing.assert_allclose(
                got, want, **TOL, err_msg=f"step {k} accumulator {jax.tree_util.keystr(path)}"
            ),
            accumulators,
            rec["acc"],
        )


def test_without_the_unroll_steps_factor_the_params_are_off(recorded):
    """The same first step on the gradient of the mean loss alone (unroll_steps 1) misses the
    recorded params by far more than the tolerance: the fixture sees the factor."""
    config, hp, values, steps, *_ = recorded
    state, _ = make_train_step(config, dataclasses.replace(hp, unroll_steps=1))(
        start_state(config, hp, values), steps[0]["batch"]
    )
    off = max(
        float(np.abs(np.asarray(got) - want).max())
        for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(steps[0]["params"]))
    )
    assert off > 1e-2
