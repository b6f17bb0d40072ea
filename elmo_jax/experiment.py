"""The experiment config: one ml_collections ConfigDict per run (see experiments/*.py, installed
as the package elmo_jax.experiments and named by `experiment_file`).

model  options.json's `lstm` and `char_cnn`, exactly (ModelConfig.from_options reads it)
train  the recipe (docs/MODEL.md section 5), how the step computes and the loop's cadence
data   source strings (`demo`, `text:GLOB`, `lm1b:PATH`), the vocabulary file and the backward
       LM's order of sentences
Every `train` and `data` setting, its default, range and help, is declared in elmo_jax/settings.py.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path

import ml_collections

from elmo_jax import settings
from elmo_jax.config import PUBLISHED_OPTIONS, ModelConfig
from elmo_jax.errors import UserError
from elmo_jax.settings import ComputeSettings, DataSettings, TrainSettings


def base_config(model_options: dict) -> ml_collections.ConfigDict:
    """Defaults: the original bilm-tf recipe on the built-in demo corpus. Experiments override."""
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(model_options)
    config.train = ml_collections.ConfigDict({**settings.defaults(TrainSettings), **settings.defaults(ComputeSettings)})
    config.data = ml_collections.ConfigDict(settings.defaults(DataSettings))
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
            f"config={name_or_path}: not a packaged experiment ({', '.join(sorted(packaged))}) nor a config file",
            ("config",),
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


def validate(config: ml_collections.ConfigDict) -> None:
    """Every setting in its range before any work: raises UserError naming the key, the value
    and what it may be."""
    for section in settings.SECTIONS:
        settings.check(section, config[section])
    model_config(config)


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    model = ModelConfig.from_options(config.model.to_dict(), source="config.model")
    model = dataclasses.replace(model, **{name: config.train[name] for name in settings.names(ComputeSettings)})
    model.validate("config.train")
    return model


def train_settings(config: ml_collections.ConfigDict, vocab_size: int) -> TrainSettings:
    """config.train for a vocabulary of `vocab_size` words, as the train step reads it."""
    t = config.train
    if t.sample_softmax and vocab_size <= t.n_negative_samples_batch:
        raise UserError(
            f"config.train.n_negative_samples_batch={t.n_negative_samples_batch} must be smaller "
            f"than the vocabulary ({vocab_size} words): for a vocabulary this small, "
            f"--config.train.sample_softmax=false (the full softmax), or fewer samples"
        )
    return TrainSettings.of(t, vocab_size)
