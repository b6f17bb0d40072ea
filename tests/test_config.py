import jax
import numpy as np
import pytest

from elmo_jax.config import PUBLISHED_OPTIONS, ModelConfig, published
from elmo_jax.errors import UserError
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


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        ("lstm", "dim", 0, r"lstm.dim is 0; it must be an integer >= 1"),
        ("lstm", "dim", 4096.0, r"lstm.dim is 4096.0; it must be an integer"),
        ("lstm", "n_layers", True, r"lstm.n_layers is true; it must be an integer"),
        ("lstm", "use_skip_connections", "false", r'lstm.use_skip_connections is "false"; it must be true or false'),
        ("lstm", "use_skip_connections", 0, r"lstm.use_skip_connections is 0; it must be true or false"),
        ("lstm", "cell_clip", -3, r"lstm.cell_clip is -3; it must be a positive number or null"),
        ("lstm", "proj_clip", "3", r'lstm.proj_clip is "3"; it must be a positive number or null'),
        ("char_cnn", "n_highway", -1, r"char_cnn.n_highway is -1; it must be an integer >= 0"),
        (
            "char_cnn",
            "filters",
            [[1, 32], [2, "32"]],
            r"char_cnn.filters is .*; it must be a non-empty list of \[width, count\]",
        ),
        ("char_cnn", "filters", [], r"char_cnn.filters is \[\]"),
        ("char_cnn", "max_characters_per_token", 5, r"filter width 6 exceeds max_characters_per_token 5"),
        ("char_cnn", "activation", "gelu", r'char_cnn.activation is "gelu"; it must be one of'),
    ],
)
def test_options_are_read_strictly_naming_source_and_field(section, key, value, message):
    options = {**PUBLISHED_OPTIONS["small"], section: {**PUBLISHED_OPTIONS["small"][section], key: value}}
    with pytest.raises(UserError, match=rf"^file.json: {message}"):
        ModelConfig.from_options(options, source="file.json")


def test_null_clips_mean_no_clip_and_unknown_sizes_are_named():
    options = {**PUBLISHED_OPTIONS["small"], "lstm": {**PUBLISHED_OPTIONS["small"]["lstm"], "cell_clip": None}}
    del options["lstm"]["proj_clip"]
    config = ModelConfig.from_options(options)
    assert config.lstm.cell_clip is None and config.lstm.proj_clip is None
    with pytest.raises(UserError, match="unknown model size 'huge'"):
        published("huge")


def test_bilm_tf_training_char_count_is_the_same_table_with_a_padding_row():
    """bilm-tf's training files say n_characters 261 (raw ids, the in-word padding id 260 the
    last row); read as our 262-row layout, that padding id (261 shifted) has a row of its own."""
    from elmo_jax.model.token_encoder import encode_tokens
    from elmo_jax.text.chars import token_char_ids

    cnn = PUBLISHED_OPTIONS["small"]["char_cnn"]
    options = {**PUBLISHED_OPTIONS["small"], "char_cnn": {**cnn, "n_characters": 261, "filters": [[1, 4], [2, 4]]}}
    config = ModelConfig.from_options(options)
    assert config.char_cnn.n_characters == 262 and config.to_options()["char_cnn"]["n_characters"] == 262
    params = init_params(jax.random.key(0), config, None)["token_encoder"]
    assert params["char_embed"].shape == (262, 16) and not params["char_embed"][0].any()
    chars = token_char_ids(["a", "bb"])
    assert chars.max() == 261  # the in-word padding id: the table's last row
    moved = {**params, "char_embed": params["char_embed"].at[261].add(1.0)}
    assert not np.allclose(encode_tokens(moved, chars, config), encode_tokens(params, chars, config))
    # A 261-row table would have JAX clamp id 261 onto row 260 (end of word) without a word.
    with pytest.raises(ValueError, match="char_embed has 261 rows; the char ids need 262"):
        encode_tokens({**params, "char_embed": params["char_embed"][1:]}, chars, config)


@pytest.mark.parametrize("value", [263, 256, "261", True])
def test_other_char_counts_are_refused(value):
    options = {
        **PUBLISHED_OPTIONS["small"],
        "char_cnn": {**PUBLISHED_OPTIONS["small"]["char_cnn"], "n_characters": value},
    }
    with pytest.raises(ValueError, match=r"char_cnn.n_characters must be 262 \(or 261"):
        ModelConfig.from_options(options)
