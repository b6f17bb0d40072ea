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


def test_bilm_tf_training_char_count_is_the_same_table_with_a_padding_row():
    """bilm-tf's training files say n_characters 261 (raw ids, the in-word padding id 260 the
    last row); read as our 262-row layout, that padding id (261 shifted) has a row of its own."""
    from elmo_jax.model.token_encoder import encode_tokens as encode
    from elmo_jax.text.chars import encode_tokens

    cnn = PUBLISHED_OPTIONS["small"]["char_cnn"]
    options = {**PUBLISHED_OPTIONS["small"], "char_cnn": {**cnn, "n_characters": 261, "filters": [[1, 4], [2, 4]]}}
    config = ModelConfig.from_options(options)
    assert config.char_cnn.n_characters == 262 and config.to_options()["char_cnn"]["n_characters"] == 262
    params = init_params(jax.random.key(0), config, None)["token_encoder"]
    assert params["char_embed"].shape == (262, 16) and not params["char_embed"][0].any()
    chars = encode_tokens(["a", "bb"])
    assert chars.max() == 261  # the in-word padding id: the table's last row
    moved = {**params, "char_embed": params["char_embed"].at[261].add(1.0)}
    assert not np.allclose(encode(moved, chars, config), encode(params, chars, config))
    # A 261-row table would have JAX clamp id 261 onto row 260 (end of word) without a word.
    with pytest.raises(ValueError, match="char_embed has 261 rows; the char ids need 262"):
        encode({**params, "char_embed": params["char_embed"][1:]}, chars, config)


@pytest.mark.parametrize("value", [263, 256, "261", True])
def test_other_char_counts_are_refused(value):
    options = {**PUBLISHED_OPTIONS["small"], "char_cnn": {**PUBLISHED_OPTIONS["small"]["char_cnn"], "n_characters": value}}
    with pytest.raises(ValueError, match=r"char_cnn.n_characters must be 262 \(or 261"):
        ModelConfig.from_options(options)
