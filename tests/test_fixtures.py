"""The bilm-tf fixtures (the project's and the extra set, conftest.py): our biLM gives the numbers
the original TensorFlow code computed."""

import json

import h5py
import jax
import numpy as np
import pytest

from elmo_jax.config import ModelConfig
from elmo_jax.interop.bilm_hdf5 import load_weights
from elmo_jax.model.bilm import bilm_layers
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.token_encoder import encode_tokens
from elmo_jax.text.chars import token_char_ids

CASES = {"elmo": "sentences.json", "bilm-tf/model": "lm_embeddings_sentences.json"}


def batch_chars(sentences):
    tokens = [["<S>", *s.split(), "</S>"] for s in sentences]
    chars = np.zeros((len(tokens), max(map(len, tokens)), 50), np.int32)
    for i, t in enumerate(tokens):
        chars[i, : len(t)] = token_char_ids(t)
    return chars, [len(t) - 2 for t in tokens]


@pytest.mark.parametrize("case", list(CASES))
def test_stateful_top_layer_matches_tensorflow(fixture_set, case):
    folder = fixture_set / case
    config = ModelConfig.load(folder / "options.json")
    params = load_weights(folder / "lm_weights.hdf5", config)
    sentences = json.loads((folder / CASES[case]).read_text())
    run = jax.jit(lambda p, c, s: bilm_layers(p, c, s, config))
    state = LSTMState.zeros(config, 3)
    P = config.lstm.projection_dim
    expected = [h5py.File(folder / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    for i in range(len(sentences[0])):  # batch i = the i-th sentence of each of the 3 lists, ONE stateful model
        chars, lengths = batch_chars([sentences[k][i] for k in range(3)])
        layers, _, state = run(params, chars, state)
        for k in range(3):
            top = np.asarray(layers[-1, k, 1 : lengths[k] + 1])
            got = np.stack([top[:, :P], top[:, P:]])
            np.testing.assert_allclose(got, expected[k][str(i)][...], atol=1e-5, rtol=1e-5)


def test_token_layer_matches_tensorflow(fixture_set):
    folder = fixture_set / "elmo"
    config = ModelConfig.load(folder / "options.json")
    params = load_weights(folder / "lm_weights.hdf5", config)
    words = (folder / "vocab_test.txt").read_text().split("\n")
    got = jax.jit(lambda p, c: encode_tokens(p, c, config))(params["token_encoder"], token_char_ids(words))
    with h5py.File(folder / "elmo_token_embeddings.hdf5", "r") as f:
        np.testing.assert_allclose(got, f["embedding"][...], atol=1e-5, rtol=1e-5)
