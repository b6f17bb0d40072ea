"""The downstream API: `batch_to_ids`, the `Elmo` NNX module (and its linen bridge), params as JAX
arrays whatever file they came from, bilm-tf's file names, and the Embedder's batching."""

import json
import shutil

import flax.linen as nn
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from float32_tolerance import ulps

from elmo_jax import Elmo, batch_to_ids
from elmo_jax.elmo import with_sentence_boundaries
from elmo_jax.embed import Embedder, _jitted_token_encoder, token_embeddings
from elmo_jax.errors import UserError
from elmo_jax.model.bilm import bilm_layers
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.scalar_mix import Frozen
from elmo_jax.model_io import load_model, model_options


@pytest.fixture(scope="module")
def elmo_dir(fixtures_dir):
    return fixtures_dir / "elmo"


@pytest.fixture(scope="module")
def model(elmo_dir):
    return load_model(elmo_dir)


@pytest.fixture(scope="module")
def sentences(elmo_dir):
    return json.loads((elmo_dir / "sentences.json").read_text())


def test_batch_to_ids_pads_with_zeros_and_spells_the_characters():
    ids = batch_to_ids([["a", "<S>"], [], ["a" + "é" * 30]])
    assert ids.shape == (3, 2, 50) and ids.dtype == np.int32
    # begin-of-word 258, the bytes, end-of-word 259, then padding 260: all + 1; "<S>" is char 256.
    np.testing.assert_array_equal(ids[0, 0, :4], [259, ord("a") + 1, 260, 261])
    np.testing.assert_array_equal(ids[0, 1, :4], [259, 257, 260, 261])
    assert not ids[1].any() and not ids[2, 1].any()  # padded slots are all 0
    assert list(ids[2, 0, 47:]) == [0xA9 + 1, 0xC3 + 1, 260]  # 48 bytes kept: cut inside the 24th "é"
    assert batch_to_ids([]).shape == (0, 0, 50)


def test_batch_to_ids_gives_the_ids_behind_the_fixtures(fixture_set):
    """The TF fixtures were computed from these ids: the first batch (zero state) and the token
    layer of the fixture vocabulary come out of Elmo fed with batch_to_ids."""
    elmo_dir = fixture_set / "elmo"
    model = load_model(elmo_dir)
    sentences = json.loads((elmo_dir / "sentences.json").read_text())
    elmo = Elmo(model, dropout=0.0)
    batch = [sentences[k][0].split() for k in range(3)]
    out = elmo(batch_to_ids(batch))
    P = model.config.lstm.projection_dim
    for k, tokens in enumerate(batch):
        with h5py.File(elmo_dir / f"lm_embeddings_{k}.hdf5") as f:
            want = f["0"][...]
        top = np.asarray(out["lstm_outputs2"][k, : len(tokens)])
        np.testing.assert_allclose(np.stack([top[:, :P], top[:, P:]]), want, atol=1e-5, rtol=1e-5)
    words = (elmo_dir / "vocab_test.txt").read_text().split("\n")
    word_emb = elmo(batch_to_ids([[w] for w in words]))["word_emb"][:, 0]
    with h5py.File(elmo_dir / "elmo_token_embeddings.hdf5") as f:
        np.testing.assert_allclose(np.asarray(word_emb), f["embedding"][...], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("wrong", ["the river bank", ["the river bank"], [["the", 3]], None])
def test_a_string_where_token_lists_belong_is_an_error(model, wrong):
    with pytest.raises(TypeError, match="list of token|tokens must be strings"):
        batch_to_ids(wrong)
    with pytest.raises(TypeError, match="list of token|tokens must be strings"):
        Embedder(model)(wrong)


def test_elmo_refuses_what_is_not_char_ids(model):
    elmo = Elmo(model, dropout=0.0)
    with pytest.raises(TypeError, match=r"char ids \(B, T, 50\), not lists: use batch_to_ids"):
        elmo([["the", "bank"]])
    with pytest.raises(ValueError, match=r"integer char ids \(B, T, 50\) from batch_to_ids, got float32 \(2, 3, 50\)"):
        elmo(np.zeros((2, 3, 50), np.float32))
    with pytest.raises(ValueError, match=r"got int32 \(3, 50\)"):
        elmo(batch_to_ids([["the", "river", "bank"]])[0])


def test_elmo_matches_the_embedder_with_every_output(model):
    batch = [["the", "river", "bank"], ["a", "much", "longer", "sentence", "about", "money", "."], []]
    elmo = Elmo(model, num_output_representations=2, dropout=0.0, scalar_mix_parameters=[0.0, 1.0, -1.0])
    out = elmo(batch_to_ids(batch))
    want = Embedder(model, batch_size=4)(batch)
    weights = np.exp([0.0, 1.0, -1.0]) / np.exp([0.0, 1.0, -1.0]).sum()
    P = model.config.lstm.projection_dim
    assert out["mask"].shape == (3, 7) and out["default"].shape == (3, 2 * P)
    for i, tokens in enumerate(batch):
        n, layers = len(tokens), want[i]
        np.testing.assert_array_equal(np.asarray(out["mask"][i]), np.arange(7) < n)
        for rep in out["elmo_representations"]:
            np.testing.assert_allclose(rep[i, :n], np.einsum("l,ltd->td", weights, layers), atol=1e-6)
            assert not np.asarray(rep[i, n:]).any()
        np.testing.assert_allclose(out["word_emb"][i, :n], layers[0, :, :P], atol=1e-6)
        np.testing.assert_allclose(out["lstm_outputs1"][i, :n], layers[1], atol=1e-6)
        np.testing.assert_allclose(out["lstm_outputs2"][i, :n], layers[2], atol=1e-6)
        mean = np.einsum("l,ltd->td", weights, layers).mean(0) if n else np.zeros(2 * P)
        np.testing.assert_allclose(out["default"][i], mean, atol=1e-6)


def test_sentence_boundaries_and_layer_norm_as_allennlp(model):
    batch = [["the", "bank"], ["a", "long", "river", "bank"]]
    kept = Elmo(model, dropout=0.0, do_layer_norm=True, keep_sentence_boundaries=True)(batch_to_ids(batch))
    plain = Elmo(model, dropout=0.0, keep_sentence_boundaries=True)(batch_to_ids(batch))
    mask = np.asarray(kept["mask"])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    # AllenNLP normalises each layer over all valid elements, the boundaries included.
    layers = [np.concatenate([plain["word_emb"]] * 2, -1), plain["lstm_outputs1"], plain["lstm_outputs2"]]
    normed = [(x - x[mask].mean()) / np.sqrt(x[mask].var() + 1e-13) for x in map(np.asarray, layers)]
    np.testing.assert_allclose(kept["elmo"], np.mean(normed, 0), atol=1e-4)
    stripped = Elmo(model, dropout=0.0, do_layer_norm=True)(batch_to_ids(batch))
    np.testing.assert_allclose(stripped["elmo"][1], np.asarray(kept["elmo"])[1, 1:-1], atol=1e-6)
    np.testing.assert_allclose(stripped["elmo"][0, :2], np.asarray(kept["elmo"])[0, 1:3], atol=1e-6)


def grads_by_part(grads) -> dict:
    parts = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(grads)):
        parts.setdefault(path[0].key, []).append(float(jnp.abs(leaf).max()))
    return parts


def test_frozen_by_default_trainable_on_request_and_jit_friendly(model):
    ids = batch_to_ids([["the", "river", "bank"], ["money"]])

    def loss(elmo):
        return jnp.sum(elmo(ids)["elmo"] ** 2)

    frozen = Elmo(model, dropout=0.5)
    assert set(grads_by_part(nnx.grad(loss)(frozen))) == {"mixes"}
    everything = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.Any(nnx.Param, Frozen)))(frozen)
    assert max(grads_by_part(everything)["bilm"]) == 0.0  # no gradient reaches frozen weights
    trainable = Elmo(model, dropout=0.5, requires_grad=True)
    parts = grads_by_part(nnx.grad(loss)(trainable))
    assert set(parts) == {"mixes", "bilm"} and min(parts["bilm"]) >= 0 and max(parts["bilm"]) > 0

    optimizer = nnx.Optimizer(trainable, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(elmo, optimizer):
        value, grads = nnx.value_and_grad(loss)(elmo)
        optimizer.update(elmo, grads)
        return value

    before = jax.tree.map(jnp.copy, nnx.state(trainable, nnx.Param))
    step(trainable, optimizer)
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), before, nnx.state(trainable, nnx.Param))
    assert all(jax.tree.leaves(moved))

    # Dropout only in training mode; a plain jax.jit closing over the module in eval mode.
    train_out = [np.asarray(frozen(ids)["elmo"]) for _ in range(2)]
    assert not np.allclose(train_out[0], train_out[1])
    frozen.eval()
    closed = jax.jit(lambda x: frozen(x)["elmo"])
    np.testing.assert_allclose(closed(ids), Elmo(model, dropout=0.0)(ids)["elmo"], atol=1e-6)


def test_the_linen_bridge(elmo_dir):
    ids = batch_to_ids([["the", "river", "bank"], ["money"]])

    class Classifier(nn.Module):
        @nn.compact
        def __call__(self, char_ids):
            out = nnx.bridge.ToLinen(Elmo, args=(str(elmo_dir),), kwargs={"dropout": 0.0})(char_ids)
            return nn.Dense(2)(out["default"])

    variables = Classifier().init(jax.random.key(0), ids)
    assert set(variables) == {"params", "frozen"}
    assert set(variables["params"]["ToLinen_0"]) == {"mixes"}
    grads = jax.grad(lambda p: Classifier().apply({**variables, "params": p}, ids).sum())(variables["params"])
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads["ToLinen_0"])) > 0


def test_params_are_jax_arrays_whatever_the_file(model):
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(model.params))
    chars = with_sentence_boundaries(batch_to_ids([["the", "bank"]]))
    layers = jax.jit(lambda c: bilm_layers(model.params, c, LSTMState.zeros(model.config, 1), model.config)[0])(chars)
    assert layers.shape[:2] == (3, 1)


def test_bilm_tf_published_file_names_load(tmp_path, elmo_dir, model):
    folder = tmp_path / "published"
    folder.mkdir()
    shutil.copy(elmo_dir / "options.json", folder / "elmo_2x4096_512_2048cnn_2xhighway_options.json")
    shutil.copy(elmo_dir / "lm_weights.hdf5", folder / "elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5")
    loaded = load_model(folder)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, model.params)
    assert model_options(folder) == model.config.to_options()
    shutil.copy(elmo_dir / "lm_weights.hdf5", folder / "lm_weights.hdf5")
    with pytest.raises(
        UserError, match=r"several \*weights.hdf5 files \(elmo_2x4096.*_weights.hdf5, lm_weights.hdf5\)"
    ):
        load_model(folder)
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        load_model(tmp_path / "nowhere")


def test_embedder_cuts_long_inputs_and_keeps_their_order(model, sentences):
    batch = [s.split() for group in sentences for s in group]  # 30 sentences
    one_by_one = [Embedder(model, batch_size=1)([s])[0] for s in batch[:5]]
    many = Embedder(model, batch_size=4, max_tokens=64)(batch)
    assert len(many) == 30
    for want, got in zip(one_by_one, many):
        np.testing.assert_allclose(got, want, atol=ulps(want))  # other batch shapes round differently
    stateful = Embedder(model, batch_size=3, stateful=True)(batch[:6])
    again = Embedder(model, batch_size=3, stateful=True)
    in_two = again(batch[:3]) + again(batch[3:6])
    for a, b in zip(stateful, in_two):
        np.testing.assert_array_equal(a, b)


def test_token_embeddings_compile_once_per_rows_bucket(model, elmo_dir):
    words = (elmo_dir / "vocab_test.txt").read_text().split("\n")
    first = token_embeddings(model, words[:60], batch_size=128)
    compiled = _jitted_token_encoder(model.config)._cache_size()
    again = token_embeddings(model, words[60:120], batch_size=128)
    assert _jitted_token_encoder(model.config)._cache_size() == compiled
    np.testing.assert_allclose(again[:5], token_embeddings(model, words[60:65], batch_size=128), atol=1e-6)
    assert first.shape == again.shape == (60, model.config.lstm.projection_dim)
