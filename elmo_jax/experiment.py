"""The experiment config: one ml_collections ConfigDict per run (see experiments/*.py, installed
as the package elmo_jax.experiments and named by `experiment_file`).

model  options.json's `lstm` and `char_cnn`, exactly (ModelConfig.from_options reads it)
train  the recipe (docs/MODEL.md section 5) and the loop's cadence
data   source strings (`demo`, `text:GLOB`, `lm1b:PATH`), the vocabulary file and the backward
       LM's order of sentences
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
from pathlib import Path

import ml_collections

from elmo_jax.config import COMPUTE_DTYPES, LSTM_SCHEDULES, PUBLISHED_OPTIONS, ModelConfig, TrainHParams
from elmo_jax.errors import UserError
from elmo_jax.text.batcher import BACKWARD_ORDERS

# The defaults have one home: the recipe's in TrainHParams, how the model computes in ModelConfig.
_RECIPE = TrainHParams()
_COMPUTE = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING}


def base_config(model_options: dict) -> ml_collections.ConfigDict:
    """Defaults: the original bilm-tf recipe on the built-in demo corpus. Experiments override."""
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(model_options)

    config.train = ml_collections.ConfigDict()
    # rows per step per device; the global batch is this x devices
    config.train.per_device_batch_size = _RECIPE.batch_size
    config.train.devices = 0  # devices in the data-parallel mesh; 0 = all (of all processes)
    # "float32" or "bfloat16": matmul operands; params and cell state stay float32
    config.train.compute_dtype = _COMPUTE["compute_dtype"]
    # "wavefront" (all layers in one time loop), "layers" (a loop each); "auto": layers on CPU
    config.train.lstm_schedule = _COMPUTE["lstm_schedule"]
    config.train.shard_softmax = False  # shard the softmax table by rows over the devices (huge vocabularies)
    config.train.unroll_steps = _RECIPE.unroll_steps  # window T
    config.train.sample_softmax = _RECIPE.sample_softmax  # False: the full softmax over the whole vocabulary
    config.train.n_negative_samples_batch = _RECIPE.n_negative_samples_batch  # candidates per direction and step
    config.train.dropout = _RECIPE.dropout
    config.train.all_clip_norm_val = _RECIPE.all_clip_norm_val
    config.train.learning_rate = _RECIPE.learning_rate
    config.train.initial_accumulator_value = _RECIPE.initial_accumulator_value
    config.train.n_epochs = 10.0  # passes over the training data; the run length derives from it
    config.train.max_steps = 0  # > 0 caps the run
    config.train.seed = 0
    config.train.scan_unroll = _COMPUTE["scan_unroll"]  # unroll of the LSTM time loop
    config.train.log_every = 100
    config.train.eval_every = 1000  # held-out evaluation; 0 = only at the end
    config.train.eval_sentences = 2000  # sentences per periodic evaluation; 0 = all
    config.train.eval_batch_size = 64  # rows in all, split over the devices
    config.train.checkpoint_every = 1000
    config.train.keep_checkpoints = 3
    # stop when the loss passes this x ln(vocabulary size), or this x its lowest for 3 log
    # windows (elmo_jax/train/divergence.py); 0 = only a non-finite loss or state stops
    config.train.divergence_factor = 2.0
    config.train.init_from = ""  # fine-tuning: a workdir, model folder or published name (original) to start from

    config.data = ml_collections.ConfigDict()
    config.data.train = "demo"
    config.data.heldout = "demo"  # "" = no held-out evaluation
    config.data.vocab = ""  # "" = build from the training data (min_count) into the workdir
    config.data.min_count = 1
    # Sentences the backward LM reads in training: "independent" (its own shuffle, as bilm-tf)
    # or "shared" (the forward LM's, at the same positions); see elmo_jax/text/batcher.py
    config.data.backward_order = "independent"
    config.lock()
    return config


def packaged_experiments() -> dict[str, Path]:
    """The experiment files installed with elmo_jax (experiments/ in a source checkout), by name."""
    folder = importlib.resources.files("elmo_jax.experiments")
    return {p.name[:-3]: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".py") and p.name[0] != "_"}


def experiment_file(name_or_path: str) -> str:
    """--config's value -> a config file: a packaged experiment's name (`demo`, `elmo_small`,
    ...) or a path, returned as it is (with any `:argument` for get_config)."""
    path, colon, argument = name_or_path.partition(":")
    if "/" in path or path.endswith(".py") or Path(path).is_file():
        return name_or_path
    packaged = packaged_experiments()
    if path not in packaged:
        raise UserError(
            f"--config={name_or_path}: not a packaged experiment ({', '.join(sorted(packaged))}) nor a config file"
        )
    return f"{packaged[path]}{colon}{argument}"


LM1B = "lm1b:data/1-billion-word-language-modeling-benchmark-r13output"


def published_config(size: str) -> ml_collections.ConfigDict:
    """A published size (small, medium, original) with bilm-tf's recipe on LM1B (docs/MODEL.md
    sections 5 and 6): its training files, and its standard test file for held-out evaluation.
    Point the data fields at your copy (folder or .tar.gz) with --config.data.*."""
    config = base_config(PUBLISHED_OPTIONS[size])
    with config.unlocked():
        config.data.train = LM1B
        config.data.heldout = LM1B
        config.data.min_count = 3  # LM1B words seen >= 3 times: bilm-tf's 793,471-line vocabulary
    return config


def _count(minimum: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum, f"an integer >= {minimum}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_POSITIVE = (lambda v: _is_number(v) and math.isfinite(v) and v > 0, "a finite number in (0, inf)")


_BOOL = (lambda v: isinstance(v, bool), "true or false")
_TEXT = (lambda v: isinstance(v, str), "a string")
# What each train/data setting may be (config.model is checked by ModelConfig.from_options).
SETTINGS = {
    "train.per_device_batch_size": _count(1),
    "train.devices": _count(0),
    "train.compute_dtype": (lambda v: v in COMPUTE_DTYPES, f"one of {COMPUTE_DTYPES}"),
    "train.lstm_schedule": (lambda v: v in LSTM_SCHEDULES, f"one of {LSTM_SCHEDULES}"),
    "train.shard_softmax": _BOOL,
    "train.unroll_steps": _count(1),
    "train.sample_softmax": _BOOL,
    "train.n_negative_samples_batch": _count(1),
    "train.dropout": (lambda v: _is_number(v) and 0 <= v < 1, "in [0, 1)"),
    "train.all_clip_norm_val": _POSITIVE,
    "train.learning_rate": _POSITIVE,
    "train.initial_accumulator_value": _POSITIVE,
    "train.n_epochs": _POSITIVE,
    "train.max_steps": _count(0),
    "train.seed": _count(0),
    "train.scan_unroll": _count(1),
    "train.log_every": _count(1),
    "train.eval_every": _count(0),
    "train.eval_sentences": _count(0),
    "train.eval_batch_size": _count(1),
    "train.checkpoint_every": _count(1),
    "train.keep_checkpoints": _count(1),
    "train.divergence_factor": (
        lambda v: _is_number(v) and math.isfinite(v) and (v == 0 or v > 1),
        "0 (off) or a finite number > 1",
    ),
    "train.init_from": _TEXT,
    "data.train": (lambda v: isinstance(v, str) and v != "", "a source (demo, text:GLOB, lm1b:PATH, tfds:NAME)"),
    "data.heldout": _TEXT,
    "data.vocab": _TEXT,
    "data.min_count": _count(1),
    "data.backward_order": (lambda v: v in BACKWARD_ORDERS, f"one of {BACKWARD_ORDERS}"),
}


def validate(config: ml_collections.ConfigDict) -> None:
    """Every setting in its range before any work: raises UserError naming the key, the value
    and what it may be."""
    for key, (ok, allowed) in SETTINGS.items():
        section, name = key.split(".")
        value = config[section].get(name)
        if not ok(value):
            raise UserError(f"config.{key}={value!r}: must be {allowed}")
    model_config(config)


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    model = ModelConfig.from_options(config.model.to_dict(), source="config.model")
    t = config.train
    model = dataclasses.replace(
        model, compute_dtype=t.compute_dtype, lstm_schedule=t.lstm_schedule, scan_unroll=t.scan_unroll
    )
    model.validate("config.train")
    return model


def train_hparams(config: ml_collections.ConfigDict, vocab_size: int) -> TrainHParams:
    t = config.train
    if t.sample_softmax and vocab_size <= t.n_negative_samples_batch:
        raise UserError(
            f"config.train.n_negative_samples_batch={t.n_negative_samples_batch} must be smaller "
            f"than the vocabulary ({vocab_size} words)"
        )
    return TrainHParams(
        batch_size=t.per_device_batch_size,
        unroll_steps=t.unroll_steps,
        n_tokens_vocab=vocab_size,
        n_negative_samples_batch=t.n_negative_samples_batch,
        sample_softmax=t.sample_softmax,
        dropout=t.dropout,
        all_clip_norm_val=t.all_clip_norm_val,
        learning_rate=t.learning_rate,
        initial_accumulator_value=t.initial_accumulator_value,
    )
