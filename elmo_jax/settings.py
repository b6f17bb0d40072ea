"""Every setting of an experiment's `train` and `data` sections, declared once: its default, what
it may be and one line of help. The experiment config (elmo_jax/experiment.py), its checks, the
command line's `--config.train.KEY=VALUE` overrides, `elmo-jax train --help`, the saved
config.json and the train step all read them from here (the model's options.json fields are
ModelConfig's, elmo_jax/config.py).

`TrainSettings` is also what the train step reads (`hp`): the `train` section as typed values, plus
the vocabulary's size, which the data decides.
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from elmo_jax.errors import UserError

COMPUTE_DTYPES = ("float32", "bfloat16")
# How the LSTM layers share the time loop (model/lstm.py): "wavefront" (all layers in one loop),
# "layers" (one loop per layer), "auto" (layers on CPU, where it was measured faster for the
# published sizes, wavefront on accelerators).
LSTM_SCHEDULES = ("auto", "wavefront", "layers")
# The LSTM cell's elementwise work in training: XLA's fusions, or our Pallas kernels (elmo_jax/model/cell_kernels.py).
LSTM_CELLS = ("auto", "xla", "pallas", "fused")
# The char CNN's convolutions and max over positions: XLA's, or our Pallas kernels (elmo_jax/model/char_kernels.py).
CHAR_CONVS = ("auto", "xla", "pallas")
# The sampled softmax's logits: XLA's (in device memory), or our Pallas kernels (elmo_jax/model/softmax_kernels.py).
SOFTMAX_KERNELS = ("auto", "xla", "pallas")
# The backward LM's order of sentences in training (elmo_jax/text/batcher.py).
BACKWARD_ORDERS = ("independent", "shared")
# How the learning rate follows the global batch (docs/TRAINING.md, "Batch size and learning rate"):
# not at all (the paper's recipe), by the square root of the batch's ratio to the reference, or by the ratio.
LR_BATCH_SCALINGS = ("none", "sqrt", "linear")
# The paper's global batch: 3 GPUs x 128 rows.
RECIPE_GLOBAL_BATCH = 384


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a setting may be: `ok(value)`, and `allowed` saying it in words."""

    ok: Callable[[Any], bool]
    allowed: str


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def count(minimum: int) -> Rule:
    return Rule(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum, f"an integer >= {minimum}")


def one_of(choices: tuple[str, ...]) -> Rule:
    return Rule(lambda v: v in choices, f"one of {choices}")


POSITIVE = Rule(lambda v: _is_number(v) and math.isfinite(v) and v > 0, "a finite number in (0, inf)")
BOOL = Rule(lambda v: isinstance(v, bool), "true or false")
TEXT = Rule(lambda v: isinstance(v, str), "a string")


def setting(default: Any, rule: Rule, help: str) -> Any:
    """A field of a settings dataclass: its default, its Rule and its help."""
    return dataclasses.field(default=default, metadata={"rule": rule, "help": help})


@dataclasses.dataclass(frozen=True)
class ComputeSettings:
    """config.train's settings of how the model computes (the same numbers, or within the
    compute dtype's rounding): the model reads them from `ModelConfig`, which extends this."""

    compute_dtype: str = setting(
        "float32", one_of(COMPUTE_DTYPES), "the matmuls' operands; params, cell state and log-sum-exps stay float32"
    )
    lstm_schedule: str = setting(
        "auto",
        one_of(LSTM_SCHEDULES),
        "wavefront (all LSTM layers in one time loop), layers (a loop each); auto: layers on CPU, else wavefront",
    )
    lstm_cell: str = setting(
        "auto",
        one_of(LSTM_CELLS),
        "the wavefront's training cell: xla (XLA's fusions), pallas (our Triton kernels, two a step each way, the "
        "projection's product and its transpose in them; GPUs only; measured on a GPU before those products moved "
        "in) or fused (pallas with the gates' matmul and its transpose inside the cell's kernels, the projection's "
        "transpose XLA's, the gates and their gradient's operand kept off device memory; never run on a GPU yet, "
        "tested interpreted on CPU); "
        "naming pallas or fused needs lstm_schedule=wavefront, and on GPUs rows per device, cell and projection "
        "in multiples of 16; auto: pallas on GPUs where the schedule is the wavefront of 2+ layers at such sizes, "
        "else xla",
    )
    char_conv: str = setting(
        "auto",
        one_of(CHAR_CONVS),
        "the training step's char CNN convolutions and max over positions: xla (one matmul, its result in device "
        "memory) or pallas (our kernels, Triton on GPUs, Mosaic on TPUs: the result stays on chip; never run on a "
        "device yet, tested interpreted on CPU); auto: pallas on GPUs where they fit and on TPUs, else xla",
    )
    softmax_kernel: str = setting(
        "auto",
        one_of(SOFTMAX_KERNELS),
        "the training step's sampled softmax: xla (the candidates' logits in device memory) or pallas (our kernels, "
        "Triton on GPUs, Mosaic on TPUs: only their log-sum-exp and gradient; never run on a device yet, tested "
        "interpreted on CPU); auto: pallas on TPUs and on GPUs where they compile, else xla",
    )
    scan_unroll: int = setting(1, count(1), "unroll of the LSTM time loop (the same numbers either way)")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """config.train: the recipe (bilm-tf's, docs/MODEL.md section 5), the step's layout over
    devices, and the loop's cadence (how the model computes: `ComputeSettings`)."""

    per_device_batch_size: int = setting(
        128, count(1), "rows per step per device (bilm-tf's batch_size, per GPU); the global batch is this x devices"
    )
    devices: int = setting(0, count(0), "devices in the data-parallel mesh; 0 = all (of all processes)")
    shard_softmax: bool = setting(False, BOOL, "shard the softmax table by rows over the devices (huge vocabularies)")
    unroll_steps: int = setting(20, count(1), "the window T: time steps per row and step")
    sample_softmax: bool = setting(True, BOOL, "the sampled softmax; false: the full softmax over the whole vocabulary")
    n_negative_samples_batch: int = setting(8192, count(1), "sampled softmax candidates per direction and step")
    dropout: float = setting(
        0.1, Rule(lambda v: _is_number(v) and 0 <= v < 1, "in [0, 1)"), "dropout on the LSTMs' inputs and outputs"
    )
    all_clip_norm_val: float = setting(10.0, POSITIVE, "the gradients' global norm is clipped to this")
    learning_rate: float = setting(0.2, POSITIVE, "Adagrad's learning rate (for lr_reference_batch rows a step)")
    lr_batch_scaling: str = setting(
        "none",
        one_of(LR_BATCH_SCALINGS),
        "the learning rate for the global batch: none (learning_rate as it is, the recipe), sqrt or linear "
        "(learning_rate x (global batch / lr_reference_batch), its square root or itself)",
    )
    lr_reference_batch: int = setting(
        RECIPE_GLOBAL_BATCH, count(1), "the global batch (rows) learning_rate is meant for (the paper's 3 x 128)"
    )
    warmup_steps: int = setting(
        0, count(0), "the learning rate rises linearly to its value over this many first steps; 0 = none (the recipe)"
    )
    initial_accumulator_value: float = setting(1.0, POSITIVE, "Adagrad's initial accumulator")
    n_epochs: float = setting(10.0, POSITIVE, "passes over the training data; the run's length derives from it")
    max_steps: int = setting(0, count(0), "> 0 caps the run at this many steps")
    seed: int = setting(0, count(0), "the params' initialisation, the data's shuffle and the dropout")
    log_every: int = setting(100, count(1), "steps per logged window (metrics.jsonl, TensorBoard)")
    eval_every: int = setting(1000, count(0), "steps between held-out evaluations; 0 = only at the end")
    eval_sentences: int = setting(2000, count(0), "sentences per periodic evaluation; 0 = all")
    eval_batch_size: int = setting(64, count(1), "evaluation rows in all, split over the devices")
    checkpoint_every: int = setting(1000, count(1), "steps between checkpoints")
    keep_checkpoints: int = setting(3, count(1), "checkpoints kept (the newest)")
    divergence_factor: float = setting(
        2.0,
        Rule(lambda v: _is_number(v) and math.isfinite(v) and (v == 0 or v > 1), "0 (off) or a finite number > 1"),
        "stop when the loss passes this x ln(vocabulary size), or this x its lowest for 3 log windows; "
        "0 = only a non-finite loss or state stops",
    )
    init_from: str = setting("", TEXT, "fine-tuning: a workdir, model folder or published name to start from")
    # Not a setting: the data decides it (the vocabulary's size, the softmax's rows V).
    n_tokens_vocab: int = 793_471

    @classmethod
    def of(cls, train: Mapping[str, Any], vocab_size: int) -> TrainSettings:
        """An experiment config's `train` section and its vocabulary's size."""
        return cls(**{name: train[name] for name in names(cls)}, n_tokens_vocab=vocab_size)

    @property
    def global_batch(self) -> int:
        """Rows per step over all devices (`devices` resolved: 0 means not yet known)."""
        return self.per_device_batch_size * self.devices

    def batch_learning_rate(self) -> float:
        """The learning rate for this global batch (before any warm-up): learning_rate itself when
        lr_batch_scaling is none, else scaled by the global batch's ratio to lr_reference_batch
        (its square root for sqrt)."""
        if self.lr_batch_scaling == "none":
            return self.learning_rate
        if self.devices < 1:
            raise ValueError("batch_learning_rate: devices not resolved (0); the global batch is unknown")
        ratio = self.global_batch / self.lr_reference_batch
        return self.learning_rate * (ratio if self.lr_batch_scaling == "linear" else math.sqrt(ratio))

    def options_fields(self) -> dict[str, Any]:
        """The bilm-tf options.json training fields these values fill."""
        return {
            "bidirectional": True,
            "dropout": self.dropout,
            "all_clip_norm_val": self.all_clip_norm_val,
            "batch_size": self.per_device_batch_size,
            "n_tokens_vocab": self.n_tokens_vocab,
            "unroll_steps": self.unroll_steps,
            "n_negative_samples_batch": self.n_negative_samples_batch,
            "sample_softmax": self.sample_softmax,
            "learning_rate": self.learning_rate,
        }


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """config.data: where the text comes from and the vocabulary."""

    train: str = setting(
        "demo",
        Rule(lambda v: isinstance(v, str) and v != "", "a source (demo, text:GLOB, lm1b:PATH, tfds:NAME)"),
        "the training text: demo, text:GLOB, lm1b:PATH or tfds:NAME",
    )
    heldout: str = setting("demo", TEXT, "the held-out text, a source as data.train; empty = no evaluation")
    vocab: str = setting(
        "", TEXT, "a vocabulary file; empty = built from the training text (min_count) into the workdir"
    )
    min_count: int = setting(1, count(1), "a built vocabulary keeps the words seen at least this often")
    backward_order: str = setting(
        "independent",
        one_of(BACKWARD_ORDERS),
        "the backward LM's sentences: independent (its own shuffle, as bilm-tf) or shared (the forward LM's)",
    )


# A config section's settings, in the order `help_lines` lists them.
SECTIONS: dict[str, tuple[type, ...]] = {"train": (TrainSettings, ComputeSettings), "data": (DataSettings,)}


def declared(section: type) -> list[dataclasses.Field]:
    """The settings of a settings class (TrainSettings, ComputeSettings, DataSettings), in
    declaration order: its fields with a Rule (not the data-decided n_tokens_vocab)."""
    return [f for f in dataclasses.fields(section) if "rule" in f.metadata]


def names(section: type) -> list[str]:
    return [f.name for f in declared(section)]


def rule(section: type, name: str) -> Rule:
    return next(f.metadata["rule"] for f in declared(section) if f.name == name)


def defaults(section: type) -> dict[str, Any]:
    return {f.name: f.default for f in declared(section)}


def check(name: str, values: Mapping[str, Any]) -> None:
    """Every setting of section `name` ("train" or "data") in `values` within its Rule: raises
    UserError naming the key, the value and what it may be."""
    for field in (f for section in SECTIONS[name] for f in declared(section)):
        allowed, value = field.metadata["rule"], values.get(field.name)
        if not allowed.ok(value):
            raise UserError(f"config.{name}.{field.name}={value!r}: must be {allowed.allowed}")


def help_lines(width: int) -> list[str]:
    """`  train.learning_rate=0.2  Adagrad's learning rate` for every setting, wrapped to `width`."""
    lines = []
    for name, sections in SECTIONS.items():
        for field in (f for section in sections for f in declared(section)):
            key = f"{name}.{field.name}={json.dumps(field.default)}"
            text = textwrap.wrap(field.metadata["help"], width - 40)
            lines += [f"  {key:36s}  {text[0]}"] + [" " * 40 + t for t in text[1:]]
    return lines
