"""bilm-tf's inner workings on the project's two fixture models (tests/fixtures/elmo with skip
connections, tests/fixtures/bilm-tf/model without; random weights, written by
tests/reference/bilm_tf.py): for the stateful batches of 3 sentences, bilm-tf's Batcher
char ids, its token layer, every LSTM layer's output in both directions, every layer's final
(c, h) state in both directions (the graph's state variables, which the next batch starts from)
and bilm.elmo.weight_layers' mixes (assigned scalar weights and gamma; with and without layer
norm; use_top_only) are recorded in layers.hdf5. Our char ids, biLM and ScalarMix must give them
to 1e-5 (float32, atol and rtol).

The weights are scaled so that the LSTMs' cell clip and projection clip fire at a visible
fraction of positions (test_the_clips_fire checks the recorded numbers), and the sentences are
awkward: one word, an empty sentence, words over 48 bytes (one cut inside a UTF-8 character),
accents, CJK, emoji, a lone surrogate, punctuation, repeats, literal <S> and </S> tokens.

Only positions under the mask are compared where bilm-tf puts something else at padding: its
token layer at a padded slot is the char CNN of an all-zero token (ours is 0), and its
weight_layers normalise and scale padding too. Its LSTM outputs are 0 there, as ours.

layers.hdf5 exists only in the project's fixture set (`fixtures_dir`); the test that needs
only the published-format files runs on every set (`fixture_set`, conftest.py).
"""

import functools
import json
from pathlib import Path

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.config import ModelConfig
from elmo_jax.interop.bilm_hdf5 import load_weights
from elmo_jax.model.bilm import bilm_layers
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.scalar_mix import ScalarMix
from elmo_jax.text.chars import token_char_ids

MODELS = {"elmo": "sentences.json", "bilm-tf/model": "lm_embeddings_sentences.json"}
DIRECTIONS = ("forward", "backward")
TOL = {"atol": 1e-5, "rtol": 1e-5}


def sentence_chars(sentences: list[str]) -> np.ndarray:
    """Sentences -> (B, T, 50) char ids with <S> and </S> added, padded slots 0."""
    tokens = [["<S>", *s.split(), "</S>"] for s in sentences]
    chars = np.zeros((len(tokens), max(map(len, tokens)), 50), np.int32)
    for i, t in enumerate(tokens):
        chars[i, : len(t)] = token_char_ids(t)
    return chars


@functools.cache
def biLM(config: ModelConfig):
    return jax.jit(lambda p, c, s: bilm_layers(p, c, s, config))


def run_batches(folder: Path, sentences_file: str, stateful: bool = True) -> tuple[ModelConfig, list[dict]]:
    """Our biLM on the batches (batch i = the i-th sentence of each list), one stateful model
    (or, with stateful=False, a zero state before each batch)."""
    config = ModelConfig.load(folder / "options.json")
    params = load_weights(folder / "lm_weights.hdf5", config)
    sentences = json.loads((folder / sentences_file).read_text())
    state = LSTMState.zeros(config, 3)
    batches = []
    for i in range(len(sentences[0])):
        chars = sentence_chars([sentences[k][i] for k in range(3)])
        layers, mask, state = biLM(config)(params, chars, state if stateful else LSTMState.zeros(config, 3))
        lengths = [len(sentences[k][i].split()) for k in range(3)]
        batches.append({"chars": chars, "layers": np.asarray(layers), "mask": np.asarray(mask), "lengths": lengths})
        batches[-1]["state"] = jax.tree.map(np.asarray, state)
    return config, batches


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, fixtures_dir):
    """(name, config, our batches, layers.hdf5 opened) for one of the project's models."""
    folder = fixtures_dir / request.param
    config, batches = run_batches(folder, MODELS[request.param])
    with h5py.File(folder / "layers.hdf5", "r") as recorded:
        yield request.param, config, batches, recorded


def test_char_ids_are_bilm_tf_batchers(model):
    """Batcher (with a vocabulary holding <S>, </S>) encodes a literal <S> or </S> token as the
    boundary, as we do; words over 48 bytes, an empty sentence, a lone surrogate: identical."""
    _, _, batches, recorded = model
    for i, ours in enumerate(batches):
        np.testing.assert_array_equal(ours["chars"], recorded[f"batch_{i}/char_ids"][...], err_msg=f"batch {i}")


def test_every_layer_and_state_matches_bilm_tf(model):
    _, config, batches, recorded = model
    P = config.lstm.projection_dim
    for i, ours in enumerate(batches):
        g, mask, layers = recorded[f"batch_{i}"], ours["mask"], ours["layers"]
        np.testing.assert_allclose(
            layers[0, ..., :P][mask], g["token_layer"][...][mask], **TOL, err_msg=f"batch {i} token layer"
        )
        for l in range(config.lstm.n_layers):
            for d, direction in enumerate(DIRECTIONS):
                np.testing.assert_allclose(
                    layers[l + 1, ..., d * P : (d + 1) * P],
                    g[f"lstm/{direction}/layer_{l}"][...],
                    **TOL,
                    err_msg=f"batch {i} {direction} LSTM layer {l}",
                )
                for x in ("h", "c"):
                    np.testing.assert_allclose(
                        getattr(ours["state"], x)[d, l],
                        g[f"final_state/{direction}/layer_{l}/{x}"][...],
                        **TOL,
                        err_msg=f"batch {i} {direction} layer {l} final {x}",
                    )


def without_boundaries(layers: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(L + 1, B, T, D) with <S>/</S> -> (L + 1, B, T - 2, D) without them, and that mask, as
    bilm-tf's lm_embeddings and mask."""
    out = np.zeros(layers.shape[:2] + (layers.shape[2] - 2, layers.shape[3]), layers.dtype)
    mask = np.zeros(out.shape[1:3], bool)
    for b, n in enumerate(lengths):
        out[:, b, :n] = layers[:, b, 1 : n + 1]
        mask[b, :n] = True
    return out, mask


def test_weight_layers_match_bilm_tf(model):
    """bilm.elmo.weight_layers = our ScalarMix: softmax(W) (bilm-tf adds 1/L to W, which the
    softmax ignores) and gamma; layer norm over the unmasked elements of each layer (bilm-tf
    eps 1e-12, ours 1e-13); use_top_only = gamma x the top layer, with no layer norm even when
    do_layer_norm is set."""
    _, config, batches, recorded = model
    n_layers = config.lstm.n_layers + 1
    mixes = recorded["weight_layers"]
    assert set(mixes) == {"mix", "mix_layer_norm", "top_only_layer_norm"}
    for name, setting in mixes.items():
        output = setting["output"]
        top_only, layer_norm = bool(output.attrs["use_top_only"]), bool(output.attrs["do_layer_norm"])
        weights = [-1e30] * (n_layers - 1) + [0.0] if top_only else setting["W"][...].tolist()
        mix = ScalarMix(n_layers, layer_norm and not top_only, weights, trainable=False)
        mix.gamma[...] = jnp.asarray(setting["gamma"][()], jnp.float32)
        for i, ours in enumerate(batches):
            layers, mask = without_boundaries(ours["layers"], ours["lengths"])
            got = np.asarray(mix(jnp.asarray(layers), jnp.asarray(mask)))
            np.testing.assert_allclose(
                got[mask], output[f"batch_{i}"][...][mask], **TOL, err_msg=f"weight_layers {name} batch {i}"
            )


def test_the_clips_fire(model):
    """The recorded numbers show both clips at work: projected outputs of exactly +-proj_clip
    (layer 0's, which have no skip connection added) and final cells of exactly +-cell_clip."""
    _, config, batches, recorded = model
    h = np.concatenate(
        [recorded[f"batch_{i}/lstm/{d}/layer_0"][...].ravel() for i in range(len(batches)) for d in DIRECTIONS]
    )
    c = np.concatenate(
        [
            recorded[f"batch_{i}/final_state/{d}/layer_{l}/c"][...].ravel()
            for i in range(len(batches))
            for d in DIRECTIONS
            for l in range(config.lstm.n_layers)
        ]
    )
    assert np.mean(np.abs(h[h != 0]) == config.lstm.proj_clip) > 0.02
    assert np.mean(np.abs(c) == config.lstm.cell_clip) > 0.05


@pytest.mark.parametrize("case", list(MODELS))
def test_the_fixture_needs_the_carried_state(fixture_set, case):
    """Run from a zero state before each batch, batches 1..9 miss the expected top layer by far
    more than the tolerance: the fixture sees the state carried from batch to batch."""
    folder = fixture_set / case
    config, batches = run_batches(folder, MODELS[case], stateful=False)
    P = config.lstm.projection_dim
    off = []
    for i, ours in enumerate(batches[1:], start=1):
        for k in range(3):
            n = ours["lengths"][k]
            top = ours["layers"][-1, k, 1 : n + 1]
            with h5py.File(folder / f"lm_embeddings_{k}.hdf5", "r") as expected:
                off.append(np.abs(np.stack([top[:, :P], top[:, P:]]) - expected[str(i)][...]).max(initial=0.0))
    assert max(off) > 1e-2
