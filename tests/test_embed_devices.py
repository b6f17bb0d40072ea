"""Embedding over every local device (8 CPU devices here, see conftest.py) gives the vectors of one
device, in sentence order; a multi-host job embeds one share of the lines per process."""

import json

import h5py
import jax
import numpy as np
import pytest
from tiny_models import tiny_options

from elmo_jax import Elmo, batch_to_ids
from elmo_jax.config import ModelConfig
from elmo_jax.embed import Embedder, embed_file
from elmo_jax.errors import UserError
from elmo_jax.model.bilm import init_params
from elmo_jax.model_io import Model


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.from_options(tiny_options(16, 8, 4, [[1, 4], [2, 4]]))
    return Model(config, init_params(jax.random.key(7), config, None))


def sentences(n, seed=0):
    rng = np.random.default_rng(seed)
    return [[f"w{rng.integers(40)}" for _ in range(rng.integers(1, 20))] for _ in range(n)]


@pytest.mark.parametrize("stateful", [False, True])
def test_eight_devices_give_the_vectors_of_one(model, stateful):
    assert len(jax.local_devices()) == 8
    text = sentences(27)
    eight = Embedder(model, batch_size=6, stateful=stateful, max_tokens=64)
    one = Embedder(model, batch_size=6, stateful=stateful, max_tokens=64, devices=1)
    assert eight.devices.size == 8 and one.devices.size == 1
    for call in range(2):  # stateful: the second call continues from the state the first left
        got, expected = eight(text[call:]), one(text[call:])
        assert [g.shape for g in got] == [e.shape for e in expected]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, atol=1e-6)


def test_elmo_splits_its_own_calls_over_the_devices(model):
    ids = batch_to_ids(sentences(5))
    eight, one = Elmo(model, dropout=0.0), Elmo(model, dropout=0.0, devices=1)
    got, expected = eight(ids), one(ids)
    assert len(got["elmo_representations"][0].sharding.device_set) == 8
    np.testing.assert_allclose(got["elmo_representations"][0], expected["elmo_representations"][0], atol=1e-6)
    np.testing.assert_array_equal(got["mask"], expected["mask"])
    jitted = jax.jit(lambda x: eight(x)["elmo"])(ids)  # under the caller's jit: the caller's layout
    np.testing.assert_allclose(jitted, expected["elmo"], atol=1e-6)


def test_too_many_devices_is_one_clear_error(model):
    with pytest.raises(UserError, match="devices=9: this process sees 8 device"):
        Embedder(model, devices=9)


def test_shards_of_the_lines_together_are_the_whole_file(model, tmp_path):
    lines = [" ".join(s) for s in sentences(11, seed=1)]
    lines[4] = ""
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    assert embed_file(model, src, tmp_path / "all.h5", devices=1) == 11
    counts = [embed_file(model, src, tmp_path / f"part{i}.h5", chunk_sentences=2, shard=(i, 3)) for i in range(3)]
    assert counts == [4, 4, 3]
    with h5py.File(tmp_path / "all.h5") as whole:
        seen = {}
        for i in range(3):
            with h5py.File(tmp_path / f"part{i}.h5") as part:
                numbers = sorted(int(k) for k in part if k != "sentence_to_index")
                assert numbers == list(range(i, 11, 3))
                for k in numbers:
                    np.testing.assert_allclose(part[str(k)][...], whole[str(k)][...], atol=1e-6)
                seen.update(json.loads(part["sentence_to_index"][0]))
        assert seen == json.loads(whole["sentence_to_index"][0])
    with pytest.raises(UserError, match="shard_index=3 num_shards=3: need 0 <= shard_index < num_shards"):
        embed_file(model, src, tmp_path / "bad.h5", shard=(3, 3))
