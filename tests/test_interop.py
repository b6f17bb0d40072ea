"""bilm-tf weights in and out, the embedding API and the embed command."""

import json
import logging
import re
import time

import h5py
import jax
import numpy as np
import pytest
from float32_tolerance import ulps

from elmo_jax.config import ModelConfig
from elmo_jax.embed import Embedder, embed_file, token_embeddings
from elmo_jax.interop.bilm_hdf5 import expected_shapes, load_weights
from elmo_jax.model.scalar_mix import ScalarMix
from elmo_jax.model_io import export_model, load_model, save_imported


@pytest.fixture(scope="module")
def elmo_fixture(fixtures_dir):
    return fixtures_dir / "elmo"


def leaves_equal(a, b):
    la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (path, x), (_, y) in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


def test_import_export_import_is_bitwise_identical(tmp_path, elmo_fixture):
    original = load_model(options=elmo_fixture / "options.json", weights=elmo_fixture / "lm_weights.hdf5")
    save_imported(original, tmp_path / "imported")
    imported = load_model(tmp_path / "imported")
    leaves_equal(original.params, imported.params)
    export_model(imported, tmp_path / "exported")
    again = load_model(options=tmp_path / "exported" / "options.json", weights=tmp_path / "exported" / "weights.hdf5")
    leaves_equal(original.params, again.params)
    assert again.config == original.config
    # The exported file is the original file: same datasets, shapes and values.
    with h5py.File(elmo_fixture / "lm_weights.hdf5") as want, h5py.File(tmp_path / "exported" / "weights.hdf5") as got:
        names = set(expected_shapes(original.config))
        assert names == {n for n in _datasets(got)} <= {n for n in _datasets(want)}
        for name in names:
            np.testing.assert_array_equal(got[name][...], want[name][...])
            assert got[name].dtype == np.float32


def _datasets(f):
    out = []
    f.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_stateful_embedder_reproduces_the_fixture_protocol(fixture_set):
    elmo_fixture = fixture_set / "elmo"
    model = load_model(options=elmo_fixture / "options.json", weights=elmo_fixture / "lm_weights.hdf5")
    sentences = json.loads((elmo_fixture / "sentences.json").read_text())
    embedder = Embedder(model, batch_size=3, stateful=True)
    P = model.config.lstm.projection_dim
    for i in range(len(sentences[0])):
        out = embedder([sentences[k][i].split() for k in range(3)])
        for k in range(3):
            with h5py.File(elmo_fixture / f"lm_embeddings_{k}.hdf5") as f:
                want = f[str(i)][...]
            top = out[k][-1]
            np.testing.assert_allclose(np.stack([top[:, :P], top[:, P:]]), want, atol=1e-5, rtol=1e-5)


def test_token_cache_matches_the_fixture(fixture_set):
    elmo_fixture = fixture_set / "elmo"
    model = load_model(options=elmo_fixture / "options.json", weights=elmo_fixture / "lm_weights.hdf5")
    words = (elmo_fixture / "vocab_test.txt").read_text().split("\n")
    with h5py.File(elmo_fixture / "elmo_token_embeddings.hdf5") as f:
        np.testing.assert_allclose(
            token_embeddings(model, words, batch_size=128), f["embedding"][...], atol=1e-5, rtol=1e-5
        )


def test_stateless_vectors_do_not_depend_on_the_batch(elmo_fixture):
    model = load_model(options=elmo_fixture / "options.json", weights=elmo_fixture / "lm_weights.hdf5")
    embedder = Embedder(model, batch_size=4)
    alone = embedder([["the", "river", "bank"]])[0]
    together = embedder([["a", "much", "longer", "sentence", "about", "money"], ["the", "river", "bank"]])[1]
    np.testing.assert_allclose(alone, together, atol=ulps(alone))  # other batch shapes round differently
    assert alone.shape == (3, 3, 32)
    np.testing.assert_allclose(embedder([["the", "river", "bank"]])[0], alone, atol=0)  # no state kept


def test_embed_file_layout_order_and_bad_bytes(tmp_path, elmo_fixture, caplog):
    model = load_model(options=elmo_fixture / "options.json", weights=elmo_fixture / "lm_weights.hdf5")
    lines = [b"the river bank", b"", b"a much longer sentence about the money in the bank", b"bad \xff byte", b"short"]
    src = tmp_path / "in.txt"
    src.write_bytes(b"\n".join(lines) + b"\n")
    with caplog.at_level(logging.WARNING):
        assert embed_file(model, src, tmp_path / "all.hdf5", "all", batch_size=2, chunk_sentences=3) == 5
    assert "1 line(s) not valid UTF-8" in caplog.text and "lines 4" in caplog.text
    embedder = Embedder(model, batch_size=2)
    with h5py.File(tmp_path / "all.hdf5") as f:
        index = json.loads(f["sentence_to_index"][0])
        assert index["the river bank"] == "0" and index["short"] == "4" and index[""] == "1"
        assert f["1"].shape == (3, 0, 32)
        for i, line in enumerate(lines):
            tokens = line.decode("utf-8", errors="replace").split()
            if tokens:
                np.testing.assert_allclose(f[str(i)][...], embedder([tokens])[0], atol=1e-5)
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="elmo_jax.embed"):
        embed_file(model, src, tmp_path / "top.hdf5", "top", batch_size=2)
    took = time.monotonic() - began
    reported = re.search(r"5 sentences, 17 tokens in ([\d.]+) s: ([\d.]+) sentences/s, \d+ tokens/s", caplog.text)
    assert reported and float(reported[1]) <= took + 0.1 and float(reported[2]) >= 5 / took - 0.1
    embed_file(model, src, tmp_path / "avg.hdf5", "average", batch_size=2)
    with (
        h5py.File(tmp_path / "all.hdf5") as a,
        h5py.File(tmp_path / "top.hdf5") as t,
        h5py.File(tmp_path / "avg.hdf5") as m,
    ):
        np.testing.assert_allclose(t["2"][...], a["2"][-1], atol=1e-6)
        np.testing.assert_allclose(m["2"][...], a["2"][...].mean(0), atol=1e-6)
        assert t["1"].shape == (0, 32)


def test_bad_weight_files_name_the_dataset_and_shapes(tmp_path, elmo_fixture):
    config = ModelConfig.load(elmo_fixture / "options.json")
    broken = tmp_path / "broken.hdf5"
    with h5py.File(elmo_fixture / "lm_weights.hdf5") as src, h5py.File(broken, "w") as dst:
        for name in _datasets(src):
            if name != "CNN_high_1/W_carry":
                dst.create_dataset(name, data=src[name][...])
    with pytest.raises(ValueError, match=r"missing dataset CNN_high_1/W_carry \(expected shape \(124, 124\)\)"):
        load_weights(broken, config)
    with h5py.File(broken, "a") as f:
        f.create_dataset("CNN_high_1/W_carry", data=np.zeros((124, 12), np.float32))
    with pytest.raises(ValueError, match=r"CNN_high_1/W_carry has shape \(124, 12\), expected \(124, 124\)"):
        load_weights(broken, config)


def test_bad_options_name_the_field(tmp_path, elmo_fixture):
    options = json.loads((elmo_fixture / "options.json").read_text())
    del options["lstm"]["projection_dim"]
    (tmp_path / "o.json").write_text(json.dumps(options))
    with pytest.raises(ValueError, match=r"o.json: missing field lstm.projection_dim"):
        ModelConfig.load(tmp_path / "o.json")
    options = json.loads((elmo_fixture / "options.json").read_text())
    options["char_cnn"]["activation"] = "gelu"
    (tmp_path / "o.json").write_text(json.dumps(options))
    with pytest.raises(ValueError, match=r'o.json: char_cnn.activation is "gelu"; it must be one of'):
        ModelConfig.load(tmp_path / "o.json")


def test_scalar_mix_with_and_without_layer_norm():
    rng = np.random.default_rng(0)
    layers = rng.normal(size=(3, 2, 4, 5)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    mix = ScalarMix(3, initial_scalar_parameters=[0.1, -0.2, 0.3])
    mix.gamma[...] = 1.7
    w = np.exp([0.1, -0.2, 0.3]) / np.exp([0.1, -0.2, 0.3]).sum()
    np.testing.assert_allclose(mix(layers), 1.7 * np.einsum("l,lbtd->btd", w, layers), rtol=1e-5)
    normed = []
    for layer in layers:
        valid = layer[mask]
        normed.append((layer - valid.mean()) / np.sqrt(valid.var() + 1e-13))
    mix.do_layer_norm = True
    np.testing.assert_allclose(
        mix(layers, mask), 1.7 * np.einsum("l,lbtd->btd", w, np.stack(normed)), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(ScalarMix(3)(layers), layers.mean(0), rtol=1e-5)
    with pytest.raises(ValueError, match="ScalarMix of 3 layers got 2 initial scalar parameters"):
        ScalarMix(3, initial_scalar_parameters=[0.0, 1.0])
