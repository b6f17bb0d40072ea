"""Four steps of bilm-tf's own training code (fixtures/bilm_tf_training, README there): started
from the recorded initial values and fed the recorded batches, our train step must give every
recorded quantity after each step: losses, gradient norm, top LSTM outputs, carried states,
every param and every Adagrad accumulator (full softmax, no dropout, so it is deterministic)."""

import dataclasses
import json

import h5py
import jax
import numpy as np
import pytest

from elmo_jax.config import ModelConfig, TrainHParams
from elmo_jax.model.bilm import bilm_top
from elmo_jax.model.lstm import LSTMState
from elmo_jax.text.chars import CharTable
from elmo_jax.train.step import init_train_state, make_train_step

TOL = {"atol": 1e-5, "rtol": 1e-5}
DIRECTIONS = ("forward", "backward")


def _tf_names(config: ModelConfig) -> dict[tuple[str, ...], str]:
    """Our params path (axis-0 direction index last for the LSTMs) -> bilm-tf variable name."""
    names = {("token_encoder", "char_embed"): "lm/char_embed"}
    for i in range(len(config.char_cnn.filters)):
        names[("token_encoder", "cnn", f"filter_{i}", "W")] = f"lm/CNN/W_cnn_{i}"
        names[("token_encoder", "cnn", f"filter_{i}", "b")] = f"lm/CNN/b_cnn_{i}"
    for k in range(config.char_cnn.n_highway):
        for name in ("W_carry", "b_carry", "W_transform", "b_transform"):
            names[("token_encoder", "highway", f"layer_{k}", name)] = f"lm/CNN_high_{k}/{name}"
    names[("token_encoder", "proj", "W")] = "lm/CNN_proj/W_proj"
    names[("token_encoder", "proj", "b")] = "lm/CNN_proj/b_proj"
    for layer in range(config.lstm.n_layers):
        for ours, theirs in (("W_0", "kernel"), ("B", "bias"), ("W_P_0", "projection/kernel")):
            for d in range(2):
                names[("lstm", f"layer_{layer}", ours, str(d))] = f"lm/RNN_{d}/rnn/multi_rnn_cell/cell_{layer}/lstm_cell/{theirs}"
    names[("softmax", "W")] = "lm/softmax/W"
    names[("softmax", "b")] = "lm/softmax/b"
    return names


def _from_tf(group: h5py.Group, config: ModelConfig, fill_row_0: float) -> dict:
    """bilm-tf variables (or their accumulators) -> our params tree. Its 261-row char table
    becomes rows 1..261 of ours; row 0 (the padding row) gets `fill_row_0`."""
    tree: dict = {}
    for path, name in _tf_names(config).items():
        value = group[name][...]
        if path[-1] == "char_embed":
            value = np.concatenate([np.full((1, value.shape[1]), fill_row_0, np.float32), value])
        elif path[:2] == ("token_encoder", "cnn") and path[-1] == "W":
            value = value[0]  # (1, w, D, n) -> (w, D, n)
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    for layer in tree["lstm"].values():
        for key, per_direction in layer.items():
            layer[key] = np.stack([per_direction["0"], per_direction["1"]])
    return tree


def _batch(step: h5py.Group) -> dict:
    """A recorded bilm-tf batch (raw training char ids) -> our batch of distinct words."""
    chars = np.stack([step["batch/tokens_characters"][...], step["batch/tokens_characters_reverse"][...]])
    words, ids = np.unique(chars.reshape(-1, chars.shape[-1]) + 1, axis=0, return_inverse=True)
    targets = np.stack([step["batch/next_token_id"][...], step["batch/next_token_id_reverse"][...]])
    return {
        "chars": words.astype(np.int32),
        "ids": ids.reshape(chars.shape[:3]).astype(np.int32),
        "targets": targets.astype(np.int32),
        "mask": np.ones(chars.shape[1:3], bool),
    }


def _state(step: h5py.Group, which: str) -> tuple[np.ndarray, np.ndarray]:
    """Recorded LSTM state -> (h (2, L, B, P), c (2, L, B, C))."""
    layers = sorted(step[f"{which}/forward"])
    return tuple(
        np.stack([np.stack([step[f"{which}/{d}/{layer}/{x}"][...] for layer in layers]) for d in DIRECTIONS])
        for x in ("h", "c")
    )


@pytest.fixture(scope="module")
def recorded(fixtures_dir):
    folder = fixtures_dir / "bilm_tf_training"
    with h5py.File(folder / "fixture.hdf5", "r") as f:
        options = json.loads(f.attrs["options"])
        config = ModelConfig.from_options(options, source="bilm_tf_training options")
        hp = TrainHParams(
            batch_size=options["batch_size"],
            unroll_steps=options["unroll_steps"],
            n_tokens_vocab=options["n_tokens_vocab"],
            sample_softmax=options["sample_softmax"],
            dropout=options["dropout"],
            all_clip_norm_val=options["all_clip_norm_val"],
            learning_rate=options["learning_rate"],
        )
        values = {"initial": _from_tf(f["initial"], config, 0.0), "initial_acc": _from_tf(f["initial/adagrad_accumulator"], config, 1.0)}
        steps = []
        for k in range(1, int(f.attrs["n_steps"]) + 1):
            g = f[f"step_{k}"]
            steps.append({
                "batch": _batch(g),
                "init_state": _state(g, "init_state"),
                "final_state": _state(g, "final_state"),
                "outputs": np.stack([g[f"lstm_outputs/{d}"][...] for d in DIRECTIONS]),
                "metrics": {key: float(g[key][()]) for key in ("loss", "loss_forward", "loss_backward", "grad_norm")},
                "params": _from_tf(g["after"], config, 0.0),
                "acc": _from_tf(g["after/adagrad_accumulator"], config, 1.0),
            })
        raw_chars = {tuple(row) for s in range(1, len(steps) + 1) for key in ("tokens_characters", "tokens_characters_reverse")
                     for row in f[f"step_{s}/batch/{key}"][...].reshape(-1, 50)}
    text = (folder / "train.txt").read_text(encoding="utf-8").split()
    return config, hp, values, steps, raw_chars, text


def _start(config, hp, values) -> "TrainState":  # noqa: F821
    state = init_train_state(jax.random.key(0), config, hp, hp.batch_size)
    dense_acc = {k: v for k, v in values["initial_acc"].items() if k != "softmax"}
    rss = state.opt_state["dense"][0]
    assert jax.tree.structure(rss.sum_of_squares) == jax.tree.structure(dense_acc)
    opt_state = {"dense": (rss._replace(sum_of_squares=dense_acc), *state.opt_state["dense"][1:]), "softmax": values["initial_acc"]["softmax"]}
    return state.replace(params=values["initial"], opt_state=opt_state)


def test_char_ids_are_bilm_tf_training_ids_plus_one(recorded):
    """Every word the recorded batches hold (the 58-byte one cut to 48 bytes, é and ü as two
    bytes each, <S>, </S>) is our char encoding of it minus 1."""
    *_, raw_chars, text = recorded
    ours = {tuple(row - 1) for row in CharTable().encode(["<S>", "</S>", *text])}
    assert raw_chars <= ours and len(raw_chars) > 30


def test_four_steps_match_bilm_tf_training(recorded):
    config, hp, values, steps, *_ = recorded
    state = _start(config, hp, values)
    train_step = make_train_step(config, hp)
    top = jax.jit(lambda p, b, s: bilm_top(p, b["chars"], b["ids"], b["mask"], s, config)[0])
    for k, rec in enumerate(steps, start=1):
        for got, want in zip(state.lstm_state, rec["init_state"]):
            np.testing.assert_allclose(got, want, **TOL, err_msg=f"step {k} initial state")
        np.testing.assert_allclose(top(state.params, rec["batch"], state.lstm_state), rec["outputs"], **TOL, err_msg=f"step {k} outputs")
        state, metrics = train_step(state, rec["batch"])
        for key, value in rec["metrics"].items():
            np.testing.assert_allclose(float(metrics[key]), value, **TOL, err_msg=f"step {k} {key}")
        np.testing.assert_allclose(state.lstm_state.h, rec["final_state"][0], **TOL, err_msg=f"step {k} final h")
        np.testing.assert_allclose(state.lstm_state.c, rec["final_state"][1], **TOL, err_msg=f"step {k} final c")
        jax.tree.map_with_path(
            lambda path, got, want: np.testing.assert_allclose(got, want, **TOL, err_msg=f"step {k} {jax.tree_util.keystr(path)}"),
            state.params, rec["params"],
        )
        accumulators = {**state.opt_state["dense"][0].sum_of_squares, "softmax": state.opt_state["softmax"]}
        jax.tree.map_with_path(
            lambda path, got, want: np.testing.assert_allclose(got, want, **TOL, err_msg=f"step {k} accumulator {jax.tree_util.keystr(path)}"),
            accumulators, rec["acc"],
        )


def test_without_the_unroll_steps_factor_the_params_are_off(recorded):
    """The same first step on the gradient of the mean loss alone (unroll_steps 1) misses the
    recorded params by far more than the tolerance: the fixture sees the factor."""
    config, hp, values, steps, *_ = recorded
    state, _ = make_train_step(config, dataclasses.replace(hp, unroll_steps=1))(_start(config, hp, values), steps[0]["batch"])
    off = max(float(np.abs(np.asarray(got) - want).max()) for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(steps[0]["params"])))
    assert off > 1e-2
