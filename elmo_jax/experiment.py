"""The experiment config: one ml_collections ConfigDict per run (see experiments/*.py).

  model  options.json's `lstm` and `char_cnn`, exactly (ModelConfig.from_options reads it)
  train  the recipe (ELMO_SPEC.md section 5) and the loop's cadence
  data   source strings (`demo`, `text:GLOB`, `lm1b:PATH`) and the vocabulary file
"""

from __future__ import annotations

import dataclasses

import ml_collections

from elmo_jax.config import PUBLISHED_OPTIONS, ModelConfig, TrainHParams


def base_config(model_options: dict) -> ml_collections.ConfigDict:
    """Defaults: the original bilm-tf recipe on the built-in demo corpus. Experiments override."""
    config = ml_collections.ConfigDict()
    config.model = ml_collections.ConfigDict(model_options)

    config.train = ml_collections.ConfigDict()
    config.train.per_device_batch_size = 128  # rows per step per device; the global batch is this x devices
    config.train.devices = 0  # devices in the data-parallel mesh; 0 = all (of all processes)
    config.train.compute_dtype = "float32"  # or "bfloat16": matmul operands; params and cell state stay float32
    config.train.shard_softmax = False  # shard the softmax table by rows over the devices (huge vocabularies)
    config.train.unroll_steps = 20  # window T
    config.train.sample_softmax = True  # False: train with the full softmax over the whole vocabulary
    config.train.n_negative_samples_batch = 8192  # candidates per direction and step (sampled softmax)
    config.train.dropout = 0.1
    config.train.all_clip_norm_val = 10.0
    config.train.learning_rate = 0.2
    config.train.initial_accumulator_value = 1.0
    config.train.n_epochs = 10.0  # passes over the training data; the run length derives from it
    config.train.max_steps = 0  # > 0 caps the run
    config.train.seed = 0
    config.train.scan_unroll = 1  # jax.lax.scan unroll of the LSTM time loop
    config.train.log_every = 100
    config.train.eval_every = 1000  # held-out evaluation; 0 = only at the end
    config.train.eval_sentences = 2000  # sentences per periodic evaluation; 0 = all
    config.train.eval_batch_size = 64  # rows in all, split over the devices
    config.train.checkpoint_every = 1000
    config.train.keep_checkpoints = 3
    config.train.init_from = ""  # fine-tuning: a workdir or model folder whose weights (and architecture) start the run

    config.data = ml_collections.ConfigDict()
    config.data.train = "demo"
    config.data.heldout = "demo"  # "" = no held-out evaluation
    config.data.vocab = ""  # "" = build from the training data (min_count) into the workdir
    config.data.min_count = 1
    config.lock()
    return config


LM1B = "lm1b:data/1-billion-word-language-modeling-benchmark-r13output"


def published_config(size: str) -> ml_collections.ConfigDict:
    """A published size (small, medium, original) with bilm-tf's recipe on LM1B (ELMO_SPEC.md
    sections 5 and 6): its training files, and its standard test file for held-out evaluation.
    Point the data fields at your copy (folder or .tar.gz) with --config.data.*."""
    config = base_config(PUBLISHED_OPTIONS[size])
    with config.unlocked():
        config.data.train = LM1B
        config.data.heldout = LM1B
        config.data.min_count = 3  # LM1B words seen >= 3 times: bilm-tf's 793,471-line vocabulary
    return config


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    model = ModelConfig.from_options(config.model.to_dict(), source="config.model")
    model = dataclasses.replace(model, compute_dtype=config.train.compute_dtype)
    model.validate("config.train")
    return model


def train_hparams(config: ml_collections.ConfigDict, vocab_size: int) -> TrainHParams:
    t = config.train
    if t.sample_softmax and vocab_size <= t.n_negative_samples_batch:
        raise ValueError(
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
