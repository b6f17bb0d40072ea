"""bilm-tf / AllenNLP weight files (docs/MODEL.md section 3) <-> the params pytree.

The file holds the token encoder and both LSTM stacks, no softmax; `char_embed` has no padding
row (261 rows), which loading prepends and saving drops.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.errors import UserError
from elmo_jax.model import Params


def _lstm_prefix(direction: int, layer: int) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every dataset of the weight file and its shape."""
    cnn, lstm = config.char_cnn, config.lstm
    D, F, P, C = cnn.embedding_dim, cnn.n_filters, lstm.projection_dim, lstm.dim
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (261, D)}
    for i, (width, count) in enumerate(cnn.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, width, D, count)
        shapes[f"CNN/b_cnn_{i}"] = (count,)
    for k in range(cnn.n_highway):
        highway: tuple[tuple[str, tuple[int, ...]], ...] = (
            ("W_carry", (F, F)),
            ("W_transform", (F, F)),
            ("b_carry", (F,)),
            ("b_transform", (F,)),
        )
        for name, shape in highway:
            shapes[f"CNN_high_{k}/{name}"] = shape
    shapes["CNN_proj/W_proj"] = (F, P)
    shapes["CNN_proj/b_proj"] = (P,)
    for d in range(2):
        for layer in range(lstm.n_layers):
            prefix = _lstm_prefix(d, layer)
            shapes[f"{prefix}/W_0"] = (P + P, 4 * C)
            shapes[f"{prefix}/B"] = (4 * C,)
            shapes[f"{prefix}/W_P_0"] = (C, P)
    return shapes


def load_weights(path: str | Path, config: ModelConfig) -> Params:
    """Reads a weight file into params (float32 numpy arrays, no `softmax`)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weight file not found: {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise UserError(f"{path}: not a readable HDF5 file ({e})") from None
    with f:
        data = {}
        for name, shape in expected_shapes(config).items():
            if name not in f:
                raise UserError(f"{path}: missing dataset {name} (expected shape {shape})")
            _check_local(f, name, path)
            value = np.asarray(f[name], dtype=np.float32)
            if value.shape != shape:
                raise UserError(f"{path}: dataset {name} has shape {value.shape}, expected {shape}")
            data[name] = value
    cnn, lstm = config.char_cnn, config.lstm
    token_encoder = {
        "char_embed": np.concatenate([np.zeros((1, cnn.embedding_dim), np.float32), data["char_embed"]]),
        "cnn": {
            f"filter_{i}": {"W": data[f"CNN/W_cnn_{i}"][0], "b": data[f"CNN/b_cnn_{i}"]}
            for i in range(len(cnn.filters))
        },
        "highway": {
            f"layer_{k}": {
                name: data[f"CNN_high_{k}/{name}"] for name in ("W_carry", "b_carry", "W_transform", "b_transform")
            }
            for k in range(cnn.n_highway)
        },
        "proj": {"W": data["CNN_proj/W_proj"], "b": data["CNN_proj/b_proj"]},
    }
    layers = {
        f"layer_{layer}": {
            name: np.stack([data[f"{_lstm_prefix(d, layer)}/{name}"] for d in range(2)])
            for name in ("W_0", "B", "W_P_0")
        }
        for layer in range(lstm.n_layers)
    }
    return {"token_encoder": token_encoder, "lstm": layers}


def _check_local(f: h5py.File, name: str, path: Path) -> None:
    """Refuses a dataset that lives outside the file: an external or soft link on its path,
    external raw storage, or a virtual dataset."""
    parts = name.split("/")
    for i in range(1, len(parts) + 1):
        link = f.get("/".join(parts[:i]), getlink=True)
        if not isinstance(link, h5py.HardLink):
            raise UserError(f"{path}: {'/'.join(parts[:i])} is a {type(link).__name__}, not data stored in the file")
    dataset = f[name]
    if dataset.external or dataset.is_virtual:
        raise UserError(f"{path}: dataset {name} keeps its data outside the file (external or virtual storage)")


def save_weights(path: str | Path, params: Params, config: ModelConfig) -> None:
    """Writes params in the weight-file layout (float32, no softmax, no padding row)."""
    if config.token_ids != "bytes" or config.word_embedding is not None:
        raise UserError(
            "bilm-tf's weight file holds models whose tokens are UTF-8 bytes, without a word embedding; "
            "this model numbers its characters and words from its own vocabularies (ELMoForManyLangs')"
        )
    te, cnn = params["token_encoder"], config.char_cnn
    data = {"char_embed": np.asarray(te["char_embed"])[1:]}
    for i in range(len(cnn.filters)):
        data[f"CNN/W_cnn_{i}"] = np.asarray(te["cnn"][f"filter_{i}"]["W"])[None]
        data[f"CNN/b_cnn_{i}"] = te["cnn"][f"filter_{i}"]["b"]
    for k in range(cnn.n_highway):
        for name, value in te["highway"][f"layer_{k}"].items():
            data[f"CNN_high_{k}/{name}"] = value
    data["CNN_proj/W_proj"], data["CNN_proj/b_proj"] = te["proj"]["W"], te["proj"]["b"]
    for layer in range(config.lstm.n_layers):
        for name, value in params["lstm"][f"layer_{layer}"].items():
            for d in range(2):
                data[f"{_lstm_prefix(d, layer)}/{name}"] = np.asarray(value)[d]
    shapes = expected_shapes(config)
    with h5py.File(path, "w") as f:
        for name, value in data.items():
            value = np.asarray(value, dtype=np.float32)
            assert value.shape == shapes[name], (name, value.shape, shapes[name])
            f.create_dataset(name, data=value)
