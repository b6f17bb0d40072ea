"""The command line behind launch.py: `python launch.py COMMAND --flag=value ...`.

Commands: vocab (count a source into a vocabulary file), train (from an experiment config), eval
(a workdir's latest checkpoint), import (bilm-tf options + weights -> params checkpoint), export
(-> bilm-tf options + weights), embed (a text file -> ELMo layers in HDF5).

Outputs never clobber (elmo_jax/outputs.py): an existing one is refused unless --overwrite.
Errors the user can fix (files, flags, settings, formats) are one line on stderr with exit
status 2; a run that cannot go on (divergence, a failed save, a full disk) one line with exit
status 1; --verbose (or ELMO_JAX_TRACEBACK=1) shows their tracebacks. Only bugs show them
unasked.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

import ml_collections
from absl import flags
from ml_collections import config_flags

from elmo_jax.compile_time import use_persistent_cache
from elmo_jax.errors import RunFailed, UserError
from elmo_jax.host_memory import keep_freed_memory

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Experiment file (experiments/NAME.py); override fields with --config.a.b=value.", lock_config=True
)
flags.DEFINE_string("workdir", None, "Run folder: config.json, vocab.txt, checkpoints/, metrics.jsonl, tensorboard/.")
flags.DEFINE_string(
    "data",
    None,
    "eval: held-out source (demo, text:GLOB, lm1b:PATH); default: the run's config.data.heldout. "
    "vocab: the source to count.",
)
flags.DEFINE_integer(
    "min-count", 1, "vocab: keep words seen at least this many times (3 gives LM1B's published 793,471 lines)."
)
flags.DEFINE_integer("max-sentences", 0, "eval: evaluate only the first N sentences, for a quick estimate (0 = all).")
flags.DEFINE_integer(
    "batch_size",
    None,
    "eval: rows per batch (default: the run's config.train.eval_batch_size); embed: sentences per batch (default 64).",
)
flags.DEFINE_string("options", None, "import, embed: bilm-tf options.json.")
flags.DEFINE_string("weights", None, "import, embed: bilm-tf weights.hdf5.")
flags.DEFINE_string("out", None, "import, export: output folder; vocab: output file.")
flags.DEFINE_string("input", None, "embed: text file, one whitespace-tokenized sentence a line.")
flags.DEFINE_string("output", None, "embed: output HDF5 file.")
flags.DEFINE_enum("layers", "all", ["all", "top", "average"], "embed: which layers to write.")
flags.DEFINE_bool("stateful", False, "embed: carry the LSTM state from batch to batch (bilm-tf, AllenNLP).")
flags.DEFINE_integer(
    "max_tokens", 8192, "embed: padded positions (sentences x length) per batch; longer lines run alone."
)
flags.DEFINE_integer("max_sentence_tokens", 100_000, "embed: a line with more tokens is refused (not one sentence).")
flags.DEFINE_bool("overwrite", False, "vocab, import, export, embed: replace an existing output (whole, atomically).")
flags.DEFINE_bool(
    "compile_cache",
    True,
    "Keep compiled programs in $XDG_CACHE_HOME/elmo_jax/jax (default ~/.cache/...), so a second run of the same "
    "model compiles nothing; --nocompile_cache turns it off.",
)
flags.DEFINE_bool("verbose", False, "Show the traceback of an error (also: ELMO_JAX_TRACEBACK=1).")
flags.DEFINE_string(
    "coordinator", None, "Multi-process runs: HOST:PORT of process 0, or auto (JAX's cluster detection)."
)
flags.DEFINE_integer("num_processes", None, "Multi-process runs: the number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-process runs: this process's index, 0 .. num_processes - 1.")
flags.DEFINE_integer(
    "coordinator_timeout", 300, "Multi-process runs: seconds to wait for the coordinator and the other processes."
)

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
    except Exception as e:  # flag values, or the experiment file's own code (a SyntaxError names its line)
        message = f"{Path(argv[0]).name}: {e if isinstance(e, flags.Error) else f'{type(e).__name__}: {e}'}"
        bad = [a.split("=")[0].lstrip("-") for a in argv[1:] if a.startswith("--config.")]
        config_path = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), None)
        if bad and config_path and Path(config_path).is_file():
            valid = _config_keys(_load_experiment(config_path))
            unknown = [b for b in bad if b not in valid]
            if unknown:
                message = (
                    f"{Path(argv[0]).name}: unknown config key(s) {', '.join(unknown)}. Valid keys:\n  "
                    + "\n  ".join(valid)
                )
        _fail(message, 2)


def _fail(message: str, status: int) -> None:
    print(message, file=sys.stderr)
    sys.exit(status)


def _not_an_orbax_thread_error(record: logging.LogRecord) -> bool:
    """Orbax logs a failed asynchronous save from each of its threads, with tracebacks; the
    error also reaches the training loop, which reports it in one line."""
    return not (record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname)


def _setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stdout, force=True
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_an_orbax_thread_error)
    for noisy in ("absl", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _require(*names: str) -> None:
    missing = [f"--{n}" for n in names if getattr(FLAGS, n) is None]
    if missing:
        raise UserError(f"{' '.join(missing)} required")


def cmd_train() -> None:
    from elmo_jax.train.loop import train

    _require("config", "workdir")
    try:
        FLAGS.config.keys()
    except OSError as e:  # ml_collections keeps a config file that failed to load as an error object
        reason = [line.strip() for line in str(e).splitlines() if line.strip()][-1]
        raise UserError(f"--config={FLAGS['config'].config_filename}: cannot be loaded ({reason})") from None
    print(FLAGS.config)
    result = train(FLAGS.config, FLAGS.workdir)
    if result:
        print(json.dumps(result))


def cmd_eval() -> None:
    from elmo_jax.train.evaluate_run import evaluate_workdir

    _require("workdir")
    result = evaluate_workdir(FLAGS.workdir, FLAGS.data, FLAGS["max-sentences"].value or None, FLAGS.batch_size)
    print(json.dumps(result))


def cmd_import() -> None:
    from elmo_jax.model_io import load_model, save_imported

    _require("options", "weights", "out")
    model = load_model(options=FLAGS.options, weights=FLAGS.weights)
    save_imported(model, FLAGS.out, FLAGS.overwrite, (FLAGS.options, FLAGS.weights))
    log.info(
        "imported %s + %s into %s (embedding-only: the file holds no softmax)", FLAGS.options, FLAGS.weights, FLAGS.out
    )


def cmd_export() -> None:
    from elmo_jax.model_io import export_model, load_model

    _require("workdir", "out")
    export_model(load_model(FLAGS.workdir), FLAGS.out, FLAGS.overwrite, (FLAGS.workdir,))
    log.info(
        "exported %s to %s (options.json, weights.hdf5%s)",
        FLAGS.workdir,
        FLAGS.out,
        ", vocab.txt" if (Path(FLAGS.out) / "vocab.txt").is_file() else "",
    )


def cmd_embed() -> None:
    from elmo_jax.embed import embed_file
    from elmo_jax.model_io import load_model
    from elmo_jax.outputs import check_output

    _require("input", "output")
    if FLAGS.workdir is None and (FLAGS.options is None or FLAGS.weights is None):
        raise UserError("give --workdir (a workdir or imported model) or --options and --weights")
    inputs = (FLAGS.input, FLAGS.workdir, FLAGS.options, FLAGS.weights)
    check_output(FLAGS.output, FLAGS.overwrite, inputs, "--output")  # before loading the model
    model = load_model(FLAGS.workdir, FLAGS.options, FLAGS.weights)
    n = embed_file(
        model,
        FLAGS.input,
        FLAGS.output,
        FLAGS.layers,
        FLAGS.batch_size or 64,
        FLAGS.stateful,
        max_tokens=FLAGS.max_tokens,
        max_sentence_tokens=FLAGS.max_sentence_tokens,
        overwrite=FLAGS.overwrite,
    )
    log.info("embedded %d lines of %s into %s (layers: %s)", n, FLAGS.input, FLAGS.output, FLAGS.layers)


def cmd_vocab() -> None:
    from elmo_jax.outputs import check_output, replacing
    from elmo_jax.text.sources import stream_sentences
    from elmo_jax.text.vocab import build_vocabulary, summary

    _require("data", "out")
    inputs = _source_files(FLAGS.data)
    check_output(FLAGS.out, FLAGS.overwrite, inputs, "--out")  # before counting
    vocab, stats = build_vocabulary(stream_sentences(FLAGS.data), FLAGS["min-count"].value)
    with replacing(FLAGS.out, FLAGS.overwrite, inputs, "--out") as tmp:
        vocab.save(tmp)
    log.info("%s: %s; written to %s", FLAGS.data, summary(stats), FLAGS.out)
    print(json.dumps(stats))


COMMANDS = {
    "vocab": cmd_vocab,
    "train": cmd_train,
    "eval": cmd_eval,
    "import": cmd_import,
    "export": cmd_export,
    "embed": cmd_embed,
}


def _source_files(source: str) -> tuple[str, ...]:
    """The files or folder a text:GLOB / lm1b:PATH source reads (an output must not be one)."""
    kind, _, path = source.partition(":")
    return tuple(glob.glob(path)) if kind == "text" else (path,) if kind == "lm1b" else ()


def main(argv: list[str]) -> None:
    _setup_logging()
    keep_freed_memory()
    if FLAGS.compile_cache:
        use_persistent_cache(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "elmo_jax" / "jax")
    if len(argv) != 2 or argv[1] not in COMMANDS:
        _fail(f"usage: launch.py COMMAND [--flags]; COMMAND is one of: {', '.join(COMMANDS)}", 2)
    try:
        _run(argv[1])
    except (UserError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        _report(argv[1], e, 2)
    except (RunFailed, OSError) as e:
        _report(argv[1], e, 1)
    except KeyboardInterrupt:
        _fail(f"launch.py {argv[1]}: interrupted", 130)


def _report(command: str, error: BaseException, status: int) -> None:
    """One line, unless --verbose or ELMO_JAX_TRACEBACK=1 asks for the traceback."""
    if FLAGS.verbose or os.environ.get("ELMO_JAX_TRACEBACK") == "1":
        raise error
    print(f"launch.py {command}: {error}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter teardown: a failed save's threads would print their own tracebacks


def _run(command: str) -> None:
    if FLAGS.coordinator is not None:
        from elmo_jax.distributed import initialize

        try:
            initialize(FLAGS.coordinator, FLAGS.num_processes, FLAGS.process_id, FLAGS.coordinator_timeout)
        except ConnectionError as e:
            raise UserError(str(e)) from None
    elif FLAGS.num_processes is not None or FLAGS.process_id is not None:
        raise UserError("--num_processes and --process_id need --coordinator=HOST:PORT (or auto)")
    COMMANDS[command]()
