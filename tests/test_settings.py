"""Every setting validated before any work; weight files read only from themselves; user
errors on the command line are one line with exit status 2."""

import json

import h5py
import pytest
from cli import assert_one_line_error, run_cli
from test_training_run import tiny_config

from elmo_jax.config import ModelConfig
from elmo_jax.errors import UserError, as_flags
from elmo_jax.experiment import base_config, model_config, train_settings, validate
from elmo_jax.interop.bilm_hdf5 import load_weights
from elmo_jax.settings import ComputeSettings, TrainSettings, names
from elmo_jax.train.loop import train
from elmo_jax.workdir import Workdir


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("train.dropout", 2.0, "in [0, 1)"),
        ("train.dropout", -0.5, "in [0, 1)"),
        ("train.dropout", 1.0, "in [0, 1)"),
        ("train.n_negative_samples_batch", 0, "an integer >= 1"),
        ("train.keep_checkpoints", 0, "an integer >= 1"),
        ("train.eval_batch_size", 0, "an integer >= 1"),
        ("train.unroll_steps", 0, "an integer >= 1"),
        ("train.log_every", 0, "an integer >= 1"),
        ("train.checkpoint_every", -1, "an integer >= 1"),
        ("train.learning_rate", float("inf"), "a finite number in (0"),
        ("train.learning_rate", 0.0, "a finite number in (0"),
        ("train.initial_accumulator_value", 0.0, "a finite number in (0"),
        ("train.all_clip_norm_val", float("nan"), "a finite number in (0"),
        ("train.n_epochs", 0.0, "a finite number in (0"),
        ("train.per_device_batch_size", 0, "an integer >= 1"),
        ("train.lstm_schedule", "diagonal", "one of ('auto'"),
        ("train.lr_batch_scaling", "cubic", "one of ('none'"),
        ("train.lr_reference_batch", 0, "an integer >= 1"),
        ("train.warmup_steps", -1, "an integer >= 0"),
        ("data.min_count", 0, "an integer >= 1"),
        ("data.train", "", "a source"),
    ],
)
def test_bad_settings_are_refused_before_any_work(tmp_path, text_data, key, value, allowed):
    config = tiny_config(text_data)
    section, name = key.split(".")
    with config.unlocked():
        config[section][name] = value
    with pytest.raises(UserError) as error:
        validate(config)
    assert str(error.value).startswith(f"config.{key}={value!r}: must be {allowed}")
    with pytest.raises(UserError):
        train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the workdir was made


@pytest.mark.parametrize("ours", ["pallas", "fused"])
def test_the_pallas_cell_needs_the_wavefront_of_several_layers(text_data, ours):
    """The Pallas cell (with the gates' matmul fused or not) is the wavefront's (its loop runs
    all layers at once): asked for with another schedule, it is refused by name, not silently
    replaced by XLA's cell."""
    config = tiny_config(text_data)
    with config.unlocked():
        config.train.lstm_cell = ours
    with pytest.raises(
        UserError, match=f"lstm_cell '{ours}' runs in the wavefront schedule: it needs lstm_schedule 'wavefront', named"
    ):
        validate(config)
    with config.unlocked():
        config.train.lstm_schedule = "wavefront"
    validate(config)


# config.json as elmo_jax wrote it for the demo experiment before every setting had one home
# (commit 3a78e93; the vocabulary and environment records left out).
SAVED_DEMO = json.loads(
    """
    {"model": {"char_cnn": {"activation": "relu", "embedding": {"dim": 8}, "filters": [[1, 16], [2, 16],
    [3, 32], [4, 32]], "max_characters_per_token": 50, "n_characters": 262, "n_highway": 1}, "lstm":
    {"cell_clip": 3, "dim": 128, "n_layers": 2, "proj_clip": 3, "projection_dim": 64,
    "use_skip_connections": true}}, "train": {"all_clip_norm_val": 10.0, "checkpoint_every": 500,
    "compute_dtype": "float32", "devices": 1, "divergence_factor": 2.0, "dropout": 0.0,
    "eval_batch_size": 64, "eval_every": 1000, "eval_sentences": 500, "init_from": "",
    "initial_accumulator_value": 1.0, "keep_checkpoints": 3, "learning_rate": 0.2, "log_every": 100,
    "lstm_schedule": "auto", "max_steps": 0, "n_epochs": 1.3, "n_negative_samples_batch": 1024,
    "per_device_batch_size": 32, "sample_softmax": true, "scan_unroll": 1, "seed": 0, "shard_softmax":
    false, "unroll_steps": 20}, "data": {"backward_order": "independent", "heldout": "demo",
    "min_count": 1, "train": "demo", "vocab": ""}}
    """
)


@pytest.mark.parametrize("predated", [(), (("train", "sample_softmax"), ("train", "divergence_factor"))])
def test_config_json_of_earlier_versions_loads_as_it_ran(tmp_path, predated):
    """A saved run config loads to the values it ran with; fields it predates take their defaults."""
    saved = json.loads(json.dumps(SAVED_DEMO))
    for section, name in predated:
        del saved[section][name]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = Workdir(tmp_path).saved_config()
    validate(config)
    want = base_config(SAVED_DEMO["model"]).to_dict()  # settings added since (lstm_cell): their defaults
    assert config.to_dict() == {section: {**want[section], **values} for section, values in SAVED_DEMO.items()}
    hp = train_settings(config, 5000)
    compute = {name: saved["train"].pop(name) for name in names(ComputeSettings) if name in saved["train"]}
    assert hp == TrainSettings(**saved["train"], n_tokens_vocab=5000)  # each saved key is still a setting
    model = model_config(config)
    assert ComputeSettings(**compute) == ComputeSettings(
        **{name: getattr(model, name) for name in names(ComputeSettings)}
    )
    assert (hp.per_device_batch_size, hp.dropout, hp.n_epochs, hp.sample_softmax) == (32, 0.0, 1.3, True)


def test_the_command_line_spells_the_arguments_of_a_library_error_as_its_flags():
    error = UserError(
        "shard_index=3, num_shards=3: bad; out.h5 exists: overwrite=True replaces it; a_shard_index=1 as written",
        ("shard_index", "overwrite"),
    )
    assert as_flags(error) == (
        "--shard_index=3, num_shards=3: bad; out.h5 exists: --overwrite replaces it; a_shard_index=1 as written"
    )
    assert as_flags(UserError("shard_index=3")) == "shard_index=3"  # no arguments named: as written


def test_negatives_must_be_fewer_than_the_vocabulary_and_the_error_says_the_fix(tmp_path, text_data):
    with pytest.raises(
        UserError,
        match=r"n_negative_samples_batch=100000 must be smaller than the vocabulary \(\d+ words\): .*"
        r"--config.train.sample_softmax=false",
    ):
        train(tiny_config(text_data, n_negative_samples_batch=100_000, max_steps=2), tmp_path)


def test_weight_files_that_point_outside_themselves_are_refused(tmp_path, fixtures_dir):
    elmo = fixtures_dir / "elmo"
    config = ModelConfig.load(elmo / "options.json")
    linked = tmp_path / "linked.hdf5"
    with h5py.File(elmo / "lm_weights.hdf5") as src, h5py.File(linked, "w") as dst:
        for name in src:
            if name != "CNN_proj":
                src.copy(src[name], dst, name)
        dst["CNN_proj"] = h5py.ExternalLink(str(elmo / "lm_weights.hdf5"), "/CNN_proj")
    with pytest.raises(UserError, match=r"linked.hdf5: CNN_proj is a ExternalLink, not data stored in the file"):
        load_weights(linked, config)


@pytest.mark.launches
def test_user_errors_are_one_line_with_exit_2(tmp_path, fixtures_dir):
    options = json.loads((fixtures_dir / "elmo" / "options.json").read_text())
    options["lstm"]["use_skip_connections"] = "false"
    (tmp_path / "options.json").write_text(json.dumps(options))
    result = run_cli(
        [
            "import",
            f"--options={tmp_path / 'options.json'}",
            f"--weights={fixtures_dir / 'elmo' / 'lm_weights.hdf5'}",
            f"--output={tmp_path / 'out'}",
        ]
    )
    assert_one_line_error(result, 2, 'options.json: lstm.use_skip_connections is "false"; it must be true or false')

    result = run_cli(
        ["train", "--config=experiments/demo.py", f"--workdir={tmp_path / 'w'}", "--config.train.dropout=2.0"]
    )
    assert_one_line_error(result, 2, "config.train.dropout=2.0: must be in [0, 1)")

    (tmp_path / "bad.py").write_text("def get_config(:\n")
    result = run_cli(["train", f"--config={tmp_path / 'bad.py'}", f"--workdir={tmp_path / 'w'}"])
    assert_one_line_error(result, 2, "SyntaxError: invalid syntax (bad.py, line 1)")
    result = run_cli(["train", f"--config={tmp_path / 'none.py'}", f"--workdir={tmp_path / 'w'}"])
    assert_one_line_error(result, 2, "none.py: cannot be loaded", "No such file")

    (tmp_path / "w2").mkdir()
    (tmp_path / "w2" / "config.json").write_text("{not json")
    (tmp_path / "w2" / "checkpoints").mkdir()
    assert_one_line_error(run_cli(["eval", f"--workdir={tmp_path / 'w2'}"]), 2, "config.json: not valid JSON")

    (tmp_path / "in.txt").write_text("the river bank\n")
    assert_one_line_error(
        run_cli(
            [
                "embed",
                f"--input={tmp_path / 'in.txt'}",
                f"--output={tmp_path / 'o.h5'}",
                f"--workdir={tmp_path / 'w2'}",
            ]
        ),
        2,
        "config.json: not valid JSON",
    )
    # Files where folders belong, and folders where files do: no raw OS error.
    (tmp_path / "a_file").write_text("x")
    result = run_cli(["train", "--config=demo", f"--workdir={tmp_path / 'a_file'}"])
    assert_one_line_error(result, 2, f"the workdir {tmp_path / 'a_file'} is (or is inside) a file, not a folder")
    result = run_cli(["vocab", f"--data=text:{tmp_path / 'w2'}", f"--output={tmp_path / 'v.txt'}"])
    assert_one_line_error(result, 2, f"{tmp_path / 'w2'} is a folder; name its files")
    result = run_cli(["import", f"--options={tmp_path}", f"--weights={tmp_path}", f"--output={tmp_path / 'o'}"])
    assert_one_line_error(result, 2, f"options file {tmp_path} is a folder, not a JSON file")

    verbose = run_cli(["eval", f"--workdir={tmp_path / 'w2'}", "--verbose"])
    assert verbose.returncode != 0 and "Traceback" in verbose.stderr
