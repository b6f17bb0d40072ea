"""The command line behind launch.py: `python launch.py COMMAND --flag=value ...`.

Commands: train (from an experiment config), eval (a workdir's latest checkpoint).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import ml_collections
from absl import flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment file (experiments/NAME.py); override fields with --config.a.b=value.", lock_config=True)
flags.DEFINE_string("workdir", None, "Run folder: config.json, vocab.txt, checkpoints/, metrics.jsonl, tensorboard/.")
flags.DEFINE_string("data", None, "eval: held-out source (demo, text:GLOB); default: the run's config.data.heldout.")
flags.DEFINE_integer("max_sentences", 0, "eval: evaluate only the first N sentences (0 = all).")
flags.DEFINE_integer("batch_size", 64, "eval: rows per batch.")

log = logging.getLogger("elmo_jax")


def _config_keys(config: ml_collections.ConfigDict, prefix: str = "config.") -> list[str]:
    keys = []
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            keys += _config_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def _load_experiment(path: str) -> ml_collections.ConfigDict:
    spec = importlib.util.spec_from_file_location("experiment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing; an unknown --config.x override fails listing the valid keys."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        message = f"{Path(argv[0]).name}: {e}"
        bad = [a.split("=")[0].lstrip("-") for a in argv[1:] if a.startswith("--config.")]
        config_path = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), None)
        if bad and config_path and Path(config_path).is_file():
            valid = _config_keys(_load_experiment(config_path))
            unknown = [b for b in bad if b not in valid]
            if unknown:
                message = f"{Path(argv[0]).name}: unknown config key(s) {', '.join(unknown)}. Valid keys:\n  " + "\n  ".join(valid)
        sys.exit(message)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stdout, force=True)
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _require(*names: str) -> None:
    missing = [f"--{n}" for n in names if getattr(FLAGS, n) is None]
    if missing:
        sys.exit(f"launch.py: {' '.join(missing)} required")


def cmd_train() -> None:
    from elmo_jax.train.loop import train

    _require("config", "workdir")
    print(FLAGS.config)
    result = train(FLAGS.config, FLAGS.workdir)
    if result:
        print(json.dumps(result))


def cmd_eval() -> None:
    from elmo_jax.train.evaluate_run import evaluate_workdir

    _require("workdir")
    result = evaluate_workdir(FLAGS.workdir, FLAGS.data, FLAGS.max_sentences or None, FLAGS.batch_size)
    print(json.dumps(result))


COMMANDS = {"train": cmd_train, "eval": cmd_eval}


def main(argv: list[str]) -> None:
    _setup_logging()
    if len(argv) != 2 or argv[1] not in COMMANDS:
        sys.exit(f"usage: launch.py COMMAND [--flags]; COMMAND is one of: {', '.join(COMMANDS)}")
    COMMANDS[argv[1]]()
