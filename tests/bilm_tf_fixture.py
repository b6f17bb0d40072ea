"""Reading fixtures/bilm_tf_training (four recorded steps of bilm-tf's own training code, see
the README there) into this project's params, batches, states and TrainSettings."""

import json
from pathlib import Path
from typing import NamedTuple

import h5py
import jax
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.settings import TrainSettings
from elmo_jax.text.batcher import Batch, char_columns
from elmo_jax.train.step import TrainState, init_train_state

DIRECTIONS = ("forward", "backward")


def tf_names(config: ModelConfig) -> dict[tuple[str, ...], str]:
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
                names[("lstm", f"layer_{layer}", ours, str(d))] = (
                    f"lm/RNN_{d}/rnn/multi_rnn_cell/cell_{layer}/lstm_cell/{theirs}"
                )
    names[("softmax", "W")] = "lm/softmax/W"
    names[("softmax", "b")] = "lm/softmax/b"
    return names


def params_from_tf(group: h5py.Group, config: ModelConfig, fill_row_0: float) -> dict:
    """bilm-tf variables (or their accumulators) -> our params tree. Its 261-row char table
    becomes rows 1..261 of ours; row 0 (the padding row) gets `fill_row_0`."""
    tree: dict = {}
    for path, name in tf_names(config).items():
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


def params_to_tf(tree: dict, config: ModelConfig) -> dict[str, np.ndarray]:
    """Our params tree (or a tree shaped like it: gradients, accumulators) -> bilm-tf variable
    name -> value in bilm-tf's layout; the inverse of params_from_tf (row 0 of the char table
    dropped)."""
    out = {}
    for path, name in tf_names(config).items():
        value = tree
        for key in path[:-1] if path[0] == "lstm" else path:
            value = value[key]
        if path[0] == "lstm":
            value = value[int(path[-1])]
        elif path[-1] == "char_embed":
            value = value[1:]
        elif path[:2] == ("token_encoder", "cnn") and path[-1] == "W":
            value = value[None]
        out[name] = np.asarray(value)
    return out


def batch_from_tf(step: h5py.Group, char_window: int) -> Batch:
    """A recorded bilm-tf batch (raw training char ids) -> our batch of distinct words, their
    padding columns cut as the batcher cuts them for a widest filter of `char_window`."""
    chars = np.stack([step["batch/tokens_characters"][...], step["batch/tokens_characters_reverse"][...]])
    words, ids = np.unique(chars.reshape(-1, chars.shape[-1]) + 1, axis=0, return_inverse=True)
    words = words[:, : char_columns(words, char_window)]
    targets = np.stack([step["batch/next_token_id"][...], step["batch/next_token_id_reverse"][...]])
    return Batch(
        chars=words.astype(np.int32),
        ids=ids.reshape(chars.shape[:3]).astype(np.int32),
        targets=targets.astype(np.int32),
        mask=np.ones(chars.shape[1:3], bool),
    )


def state_from_tf(step: h5py.Group, which: str) -> tuple[np.ndarray, np.ndarray]:
    """Recorded LSTM state -> (h (2, L, B, P), c (2, L, B, C))."""
    layers = sorted(step[f"{which}/forward"])
    return tuple(
        np.stack([np.stack([step[f"{which}/{d}/{layer}/{x}"][...] for layer in layers]) for d in DIRECTIONS])
        for x in ("h", "c")
    )


class Recorded(NamedTuple):
    config: ModelConfig
    hp: TrainSettings  # the run's options; dropout as recorded (0.0) unless load() was told otherwise
    values: dict  # initial params ("initial") and Adagrad accumulators ("initial_acc"), ours
    steps: list[dict]  # per step: batch, init_state, final_state, outputs, metrics, params, acc
    spelled: list  # (word, its raw training char ids) at every input position of a vocabulary word


def load(folder: Path, dropout: float | None = None) -> Recorded:
    """The fixture in `folder`; `dropout` replaces the recorded 0.0."""
    with h5py.File(folder / "fixture.hdf5", "r") as f:
        options = json.loads(f.attrs["options"])
        config = ModelConfig.from_options(options, source="bilm_tf_training options")
        hp = TrainSettings(
            per_device_batch_size=options["batch_size"],
            unroll_steps=options["unroll_steps"],
            n_tokens_vocab=options["n_tokens_vocab"],
            sample_softmax=options["sample_softmax"],
            dropout=options["dropout"] if dropout is None else dropout,
            all_clip_norm_val=options["all_clip_norm_val"],
            learning_rate=options["learning_rate"],
        )
        values = {
            "initial": params_from_tf(f["initial"], config, 0.0),
            "initial_acc": params_from_tf(f["initial/adagrad_accumulator"], config, 1.0),
        }
        steps = []
        for k in range(1, int(f.attrs["n_steps"]) + 1):
            g = f[f"step_{k}"]
            steps.append(
                {
                    "batch": batch_from_tf(g, config.char_cnn.widest_filter),
                    "init_state": state_from_tf(g, "init_state"),
                    "final_state": state_from_tf(g, "final_state"),
                    "outputs": np.stack([g[f"lstm_outputs/{d}"][...] for d in DIRECTIONS]),
                    "metrics": {
                        key: float(g[key][()]) for key in ("loss", "loss_forward", "loss_backward", "grad_norm")
                    },
                    "params": params_from_tf(g["after"], config, 0.0),
                    "acc": params_from_tf(g["after/adagrad_accumulator"], config, 1.0),
                }
            )
        vocab = [word.decode("utf-8") for word in f["meta/vocab"][...]]
        spelled = [
            (vocab[i], row)
            for s in range(1, len(steps) + 1)
            for suffix in ("", "_reverse")
            for i, row in zip(
                f[f"step_{s}/batch/token_ids{suffix}"][...].ravel(),
                f[f"step_{s}/batch/tokens_characters{suffix}"][...].reshape(-1, 50),
            )
            if vocab[i] != "<UNK>"
        ]
    return Recorded(config, hp, values, steps, spelled)


def start_state(config: ModelConfig, hp: TrainSettings, values: dict) -> TrainState:
    """A TrainState holding the recorded initial params and Adagrad accumulators, zero LSTM state."""
    state = init_train_state(jax.random.key(0), config, hp, hp.per_device_batch_size)
    dense_acc = {k: v for k, v in values["initial_acc"].items() if k != "softmax"}
    rss = state.opt_state["dense"][0]
    assert jax.tree.structure(rss.sum_of_squares) == jax.tree.structure(dense_acc)
    opt_state = {
        "dense": (rss._replace(sum_of_squares=dense_acc), *state.opt_state["dense"][1:]),
        "softmax": values["initial_acc"]["softmax"],
    }
    return state.replace(params=values["initial"], opt_state=opt_state)
