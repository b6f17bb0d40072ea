import jax
import numpy as np
import pytest

from elmo_jax.config import PUBLISHED_OPTIONS, ModelConfig, published
from elmo_jax.model.bilm import init_params


@pytest.mark.parametrize("name, millions", [("small", 13.6), ("medium", 28.0), ("original", 93.6)])
def test_published_sizes_have_the_published_parameter_counts(name, millions):
    config = published(name)
    shapes = jax.eval_shape(lambda: init_params(jax.random.key(0), config, None))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    assert abs(count / 1e6 - millions) < 0.05


def test_options_round_trip(tmp_path):
    config = published("original")
    config.save(tmp_path / "options.json", {"n_tokens_vocab": 793471})
    assert ModelConfig.load(tmp_path / "options.json") == config
    assert config.to_options() == PUBLISHED_OPTIONS["original"]


def test_differences_name_the_fields():
    assert published("small").differences(published("original")) == [
        "char_cnn.n_highway: 1 != 2",
        "lstm.dim: 1024 != 4096",
        "lstm.projection_dim: 128 != 512",
    ]


def test_bad_values_are_named():
    options = {**PUBLISHED_OPTIONS["small"], "lstm": {**PUBLISHED_OPTIONS["small"]["lstm"], "dim": 0}}
    with pytest.raises(ValueError, match="lstm.dim must be positive"):
        ModelConfig.from_options(options)
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        published("huge")
