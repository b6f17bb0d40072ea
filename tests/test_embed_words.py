"""The embedding path encodes each distinct word once, with its padding columns cut, and gives the
same layers as the biLM on the full char ids of every position."""

import dataclasses
import re

import jax
import numpy as np
import pytest
from cli import run_cli
from tiny_models import tiny_options

from elmo_jax import embed
from elmo_jax.config import ModelConfig
from elmo_jax.embed import Embedder, encode_words
from elmo_jax.model.bilm import bilm_layers, init_params
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.token_encoder import encode_tokens
from elmo_jax.model_io import Model
from elmo_jax.text.chars import BOS_TOKEN, EOS_TOKEN, CharTable


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.from_options(tiny_options(16, 8, 4, [[1, 4], [2, 4], [5, 8]]))
    return Model(config, init_params(jax.random.key(5), config, None))


def words_of_every_length(rng, n):
    """Words of 1 to 60 bytes (over the 48 kept), some multi-byte, drawn with repeats."""
    vocabulary = ["x" * k for k in range(1, 61)] + ["é" * k for k in range(1, 30)] + ["", "<S>", "a", "the"]
    return [vocabulary[i] for i in rng.integers(len(vocabulary), size=n)]


def test_words_encoded_in_length_sorted_pieces_equal_the_full_columns(model):
    words = list(dict.fromkeys(words_of_every_length(np.random.default_rng(0), 300)))
    chars = CharTable().encode(words)
    full = np.asarray(encode_tokens(model.params["token_encoder"], chars, model.config))
    np.testing.assert_allclose(encode_words(model, chars, chunk=7), full, atol=1e-6)


@pytest.mark.parametrize(
    "schedule, gate_table",
    [("layers", True), ("layers", False), ("wavefront", False)],
    ids=["layers", "layers-per-position", "wavefront"],
)
def test_the_embedder_equals_the_biLM_on_every_position(model, schedule, gate_table, monkeypatch):
    """Layer 0's input gates gathered from a table of the words' (the layers schedule, within
    MAX_GATE_TABLE_BYTES) or computed at each position."""
    model = dataclasses.replace(model, config=dataclasses.replace(model.config, lstm_schedule=schedule))
    if not gate_table:
        monkeypatch.setattr(embed, "MAX_GATE_TABLE_BYTES", 0)
    tables, original = [], Embedder._gates
    monkeypatch.setattr(Embedder, "_gates", lambda self, t: tables.append(original(self, t)) or tables[-1])
    rng = np.random.default_rng(1)
    sentences = [words_of_every_length(rng, int(n)) for n in rng.integers(0, 13, size=16)]
    table = CharTable()
    for stateful in (False, True):  # stateless: several sentences a row (packed), the state restarting at each
        got = Embedder(model, batch_size=4, max_tokens=64, stateful=stateful)(sentences)
        state = LSTMState.zeros(model.config, 4)
        for start in range(0, len(sentences), 4):
            batch = sentences[start : start + 4]
            chars = np.zeros((4, max(len(s) for s in batch) + 2, table.max_chars), np.int32)
            for i, s in enumerate(batch):
                chars[i, : len(s) + 2] = table.encode([BOS_TOKEN, *s, EOS_TOKEN])
            if not stateful:
                state = LSTMState.zeros(model.config, 4)
            layers, _, state = bilm_layers(model.params, chars, state, model.config)
            for i, s in enumerate(batch):
                np.testing.assert_allclose(got[start + i], np.asarray(layers)[:, i, 1 : len(s) + 1], atol=1e-6)
    assert tables and all((t is not None) == gate_table for t in tables)


@pytest.mark.launches
def test_a_second_embed_run_compiles_nothing(tmp_path, fixtures_dir):
    src = tmp_path / "in.txt"
    src.write_text("the river bank\n\na much longer sentence about the money in the bank\nshort\n")
    model = [
        "--options",
        str(fixtures_dir / "elmo" / "options.json"),
        "--weights",
        str(fixtures_dir / "elmo" / "lm_weights.hdf5"),
    ]
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    reports = []
    for run, extra in enumerate([[], [], ["--nocompile_cache"]]):
        args = ["embed", "--input", str(src), "--output", str(tmp_path / f"out{run}.h5"), *model, *extra]
        result = run_cli(args, env_update=env)
        assert result.returncode == 0, result.stderr
        reports.append(
            re.search(
                r"(\d+) programs in [\d.]+ s \((\d+) compiled, (\d+) from the persistent cache\)",
                result.stdout + result.stderr,
            )
        )
    first, second, uncached = ([int(g) for g in r.groups()] for r in reports)
    assert first[1] > 0 and second == [first[0], 0, first[0]] and uncached[2] == 0
    assert any((tmp_path / "cache" / "elmo_jax" / "jax").iterdir())
