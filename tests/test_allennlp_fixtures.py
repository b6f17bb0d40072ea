"""`elmo_jax.batch_to_ids`, `Elmo` and the stateful `Embedder` against what AllenNLP 2.10.1's
`batch_to_ids`, `Elmo` and `_ElmoBiLm` computed on the fixture model (tests/fixtures/allennlp/,
recorded by tests/reference/allennlp.py; its README.md there says what each dataset is).

Char ids must be equal; float32 outputs agree within atol = rtol = 1e-5. Our `Elmo` is stateless,
so its outputs are compared with AllenNLP modules that were fresh (zero state) for each batch;
AllenNLP's statefulness (each row's LSTM state carried into the next call) is compared with
`Embedder(stateful=True)`. The records hold the sha256 of the model files they came from: a
changed model needs the records made again (`python -m tests.reference.make`).
"""

import hashlib
import json

import h5py
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from elmo_jax import Elmo, batch_to_ids
from elmo_jax.embed import Embedder
from elmo_jax.model_io import load_model

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
SETTINGS = [(False, False), (True, False), (False, True), (True, True)]  # (do_layer_norm, keep_sentence_boundaries)


@pytest.fixture(scope="module")
def records(fixtures_dir):
    folder = fixtures_dir / "allennlp"
    with h5py.File(folder / "allennlp.hdf5", "r") as f:
        arrays = {}
        f.visititems(lambda name, obj: arrays.update({name: obj[()]}) if isinstance(obj, h5py.Dataset) else None)
    return json.loads((folder / "sentences.json").read_text()), arrays


@pytest.fixture(scope="module")
def model(fixtures_dir):
    return load_model(fixtures_dir / "elmo")


def test_the_records_come_from_this_model(records, fixtures_dir):
    meta, _ = records
    for name, digest in meta["model_sha256"].items():
        path = fixtures_dir / "elmo" / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, (
            f"{path} is not the file tests/fixtures/allennlp was recorded from: "
            "make the records again (python -m tests.reference.make)"
        )


def test_char_ids_equal_allennlps(records):
    meta, arrays = records
    batches = {"awkward": meta["awkward"]}
    batches.update({f"fresh/{i}": batch for i, batch in enumerate(meta["fresh"])})
    batches.update({f"stateful/{i}": batch for i, batch in enumerate(meta["stateful"])})
    for name, batch in batches.items():
        want = arrays[f"{name}/char_ids"]
        got = batch_to_ids(batch)
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def elmo(model, meta, do_layer_norm: bool, keep: bool) -> Elmo:
    """As the recorder's: two representations with fixed mixes, the second set afterwards."""
    mixes = meta["mixes"]
    module = Elmo(
        model,
        num_output_representations=2,
        dropout=0.0,
        do_layer_norm=do_layer_norm,
        keep_sentence_boundaries=keep,
        scalar_mix_parameters=mixes["scalar_mix_parameters"],
        devices=1,
    )
    module.mixes[1].scalar_parameters[...] = jnp.asarray(mixes["mix_1"], jnp.float32)
    module.mixes[1].gamma[...] = jnp.asarray(mixes["gamma_1"], jnp.float32)
    return module


@pytest.mark.parametrize(("do_layer_norm", "keep"), SETTINGS)
def test_elmo_equals_allennlps_fresh_module(records, model, do_layer_norm, keep):
    """Each batch went through a fresh AllenNLP `Elmo`; with boundaries kept, the layers also
    equal `_ElmoBiLm`'s activations ([token | token], forward | backward of each LSTM layer)."""
    meta, arrays = records
    module = elmo(model, meta, do_layer_norm, keep)
    for i in range(len(meta["fresh"])):
        key = f"fresh/{i}/elmo_norm{int(do_layer_norm)}_keep{int(keep)}"
        out = module(arrays[f"fresh/{i}/char_ids"])
        np.testing.assert_array_equal(np.asarray(out["mask"]), arrays[f"{key}/mask"].astype(bool), err_msg=key)
        for k in range(2):
            np.testing.assert_allclose(
                np.asarray(out["elmo_representations"][k]),
                arrays[f"{key}/representation{k}"],
                **TOLERANCE,
                err_msg=f"{key} representation {k}",
            )
        if keep and not do_layer_norm:
            activations = arrays[f"fresh/{i}/activations"]
            np.testing.assert_array_equal(np.asarray(out["mask"]), arrays[f"fresh/{i}/mask"].astype(bool))
            layers = [jnp.concatenate([out["word_emb"]] * 2, axis=-1), out["lstm_outputs1"], out["lstm_outputs2"]]
            for layer, (got, want) in enumerate(zip(layers, activations)):
                np.testing.assert_allclose(np.asarray(got), want, **TOLERANCE, err_msg=f"fresh/{i} layer {layer}")


def test_stateful_embedder_equals_allennlps_stateful_bilm(records, model):
    """One AllenNLP `_ElmoBiLm` ran the batches in turn, row i continuing from row i's state;
    `Embedder(stateful=True)` with the same batch size does the same."""
    meta, arrays = records
    batches = meta["stateful"]
    vectors = Embedder(model, batch_size=len(batches[0]), stateful=True, devices=1)(
        [sentence for batch in batches for sentence in batch]
    )
    for i, batch in enumerate(batches):
        activations = arrays[f"stateful/{i}/activations"]
        for row, sentence in enumerate(batch):
            want = activations[:, row, 1 : len(sentence) + 1]
            got = vectors[i * len(batch) + row]
            np.testing.assert_allclose(got, want, **TOLERANCE, err_msg=f"stateful batch {i} row {row}")


@pytest.mark.parametrize("do_layer_norm", [False, True])
def test_gradient_of_the_mix_equals_allennlps(records, model, do_layer_norm):
    """d mean(representation ** 2) / d (scalar parameters, gamma) of a trainable mix."""
    meta, arrays = records
    key = f"grad/norm{int(do_layer_norm)}"
    module = Elmo(model, dropout=0.0, do_layer_norm=do_layer_norm, devices=1)
    mix = module.mixes[0]
    mix.scalar_parameters[...] = jnp.asarray(meta["mixes"]["scalar_mix_parameters"], jnp.float32)
    mix.gamma[...] = jnp.asarray(meta["mixes"]["grad_gamma"], jnp.float32)
    ids = arrays[f"fresh/{meta['grad_batch']}/char_ids"]

    def loss(m):
        return jnp.mean(m(ids)["elmo_representations"][0] ** 2)

    value, grads = nnx.value_and_grad(loss)(module)
    np.testing.assert_allclose(float(value), arrays[f"{key}/loss"], **TOLERANCE)
    np.testing.assert_allclose(
        np.asarray(grads.mixes[0].scalar_parameters[...]), arrays[f"{key}/scalar_parameters"], **TOLERANCE
    )
    np.testing.assert_allclose(np.asarray(grads.mixes[0].gamma[...]), arrays[f"{key}/gamma"], **TOLERANCE)
