"""The commands of `elmo-jax` (also `python -m elmo_jax` and `python launch.py`):
`elmo-jax COMMAND --flag=value ...`; `elmo-jax COMMAND --help` lists a command's flags.

Flags are absl's, spelled with underscores; a hyphenated spelling, a flag of another command, an
unknown command or a missing required flag is one line on stderr with the usage, exit status 2.
Outputs never clobber (elmo_jax/outputs.py): an existing one is refused unless --overwrite.
Errors the user can fix (files, flags, settings, formats) are one line on stderr with exit
status 2; a run that cannot go on (divergence, a failed save, a full disk) one line with exit
status 1; --verbose (or ELMO_JAX_TRACEBACK=1) shows their tracebacks. Only bugs show them
unasked.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import logging
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from elmo_jax import strict_json
from elmo_jax.errors import RunFailed, UserError
from elmo_jax.experiment import experiment_file, packaged_experiments
from elmo_jax.plan.targets import TARGETS
from elmo_jax.progress import log_handler

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment: a packaged one by name (listed below) or a config file's path; override any field with "
    "--config.a.b=value.",
    lock_config=True,
)
flags.DEFINE_string("workdir", None, "Run folder: config.json, vocab.txt, checkpoints/, metrics.jsonl, tensorboard/.")
flags.DEFINE_string(
    "data", None, "A source: demo, text:GLOB, lm1b:PATH or tfds:NAME (eval: default the run's config.data.heldout)."
)
flags.DEFINE_integer("min_count", 1, "Keep words seen at least this many times (3 gives LM1B's 793,471 lines).")
flags.DEFINE_integer("max_sentences", 0, "Evaluate only the first N sentences, for a quick estimate (0 = all).")
flags.DEFINE_integer(
    "batch_size", None, "eval: rows per batch (default: the run's config.train.eval_batch_size); embed: sentences "
    "per batch (default 64)."
)  # fmt: skip
flags.DEFINE_string(
    "model", None, "A published model by name (small, medium, original, original_5.5b) or the URL of its "
    "..._options.json: downloaded once into $ELMO_JAX_MODEL_CACHE (default $XDG_CACHE_HOME/elmo_jax/models)."
)  # fmt: skip
flags.DEFINE_string("options", None, "bilm-tf options.json.")
flags.DEFINE_string("weights", None, "bilm-tf weights.hdf5.")
flags.DEFINE_string(
    "output", None, "vocab: the vocabulary file; import, export: the model folder; embed: the HDF5 file; plot: the "
    "PNG (default WORKDIR/training_curves.png)."
)  # fmt: skip
flags.DEFINE_string("input", None, "Text file, one whitespace-tokenized sentence a line.")
flags.DEFINE_enum("layers", "all", ["all", "top", "average"], "Which layers to write.")
flags.DEFINE_bool("stateful", False, "Carry the LSTM state from batch to batch (bilm-tf, AllenNLP).")
flags.DEFINE_integer("max_tokens", 8192, "Positions (rows x length) per round of rows; a longer line runs alone.")
flags.DEFINE_integer("max_sentence_tokens", 100_000, "A line with more tokens is refused (not one sentence).")
flags.DEFINE_integer(
    "devices", None, "embed: split each batch's rows over the first N local devices (default: all of them); plan: "
    "the number of devices of the target (default 1)."
)  # fmt: skip
flags.DEFINE_enum("target", "h200", list(TARGETS), "The accelerator to compile for (without having one).")
flags.DEFINE_integer("vocab_size", 793_471, "Words in the softmax table (default: LM1B's, bilm-tf's vocabulary).")
flags.DEFINE_bool("fit", True, "Also find the largest per-device batch that fits the target's memory (compiles more).")
flags.DEFINE_string("hlo", None, "Also write the compiled program's text to this file.")
flags.DEFINE_integer(
    "num_shards", 1, "Embed only every line i with i % num_shards == shard_index (one process per host)."
)
flags.DEFINE_integer("shard_index", 0, "Which share of the lines this process embeds: 0 .. num_shards - 1.")
flags.DEFINE_bool("overwrite", False, "Replace an existing output (whole, atomically).")
flags.DEFINE_bool(
    "compile_cache",
    True,
    "Keep compiled programs in $XDG_CACHE_HOME/elmo_jax/jax (default ~/.cache/...), so a second run of the same "
    "model compiles nothing.",
)
flags.DEFINE_bool("verbose", False, "Show the traceback of an error (also: ELMO_JAX_TRACEBACK=1).")
flags.DEFINE_string("coordinator", None, "Multi-process runs: HOST:PORT of process 0, or auto (JAX's detection).")
flags.DEFINE_integer("num_processes", None, "Multi-process runs: the number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-process runs: this process's index, 0 .. num_processes - 1.")
flags.DEFINE_integer(
    "coordinator_timeout", 300, "Multi-process runs: seconds to wait for the coordinator and the other processes."
)

log = logging.getLogger("elmo_jax")

COMMON_FLAGS = ("compile_cache", "verbose", "coordinator", "num_processes", "process_id", "coordinator_timeout")
RENAMED = {"out": "output"}  # flags of earlier releases
QUOTE = "'"  # around absl's string defaults


@dataclasses.dataclass(frozen=True)
class Command:
    run: Callable[[], None]
    summary: str
    usage: str  # the flags after the command name
    flags: tuple[str, ...]
    required: tuple[str, ...] = ()


def _prog() -> str:
    """How the user called us: elmo-jax, python -m elmo_jax or launch.py."""
    name = Path(sys.argv[0]).name
    return "python -m elmo_jax" if name in ("__main__.py", "cli.py") else name


def _usage(command: str) -> str:
    return f"usage: {_prog()} {command} {COMMANDS[command].usage}"


def _fail(message: str, status: int = 2) -> None:
    print(message, file=sys.stderr)
    sys.exit(status)


def _flag_name(arg: str) -> str | None:
    """--name=value / --name / -name -> name; None for a value."""
    if not arg.startswith("-") or arg in ("-", "--") or arg[1:2].isdigit():
        return None
    return arg.lstrip("-").split("=", 1)[0]


def _check_flag_names(command: str, args: list[str]) -> None:
    """A hyphenated spelling, an old name, or a flag of another command: one line, exit 2."""
    ours = {name for c in COMMANDS.values() for name in c.flags} | set(COMMON_FLAGS)
    allowed = set(COMMANDS[command].flags) | set(COMMON_FLAGS)
    hint = f"{_prog()} {command} --help lists its flags"
    for name in filter(None, map(_flag_name, args)):
        bare = name[2:] if name.startswith("no") and name[2:] in ours else name
        if bare.startswith("config.") and "config" in allowed:
            continue
        if "-" in bare and bare.replace("-", "_") in ours:
            _fail(f"{_prog()} {command}: --{name}: flags are spelled with underscores: --{name.replace('-', '_')}")
        if bare in RENAMED and RENAMED[bare] in allowed:
            _fail(f"{_prog()} {command}: --{bare} is now --{RENAMED[bare]}")
        if (bare in ours or bare.startswith("config.")) and bare not in allowed:
            _fail(f"{_prog()} {command}: --{bare} is not a flag of {command}; {hint}")


def _resolve_config(args: list[str]) -> list[str]:
    """--config=NAME of a packaged experiment -> its file (a path stays as it is)."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("--config="):
            out[i] = "--config=" + experiment_file(arg.split("=", 1)[1])
        elif arg == "--config" and i + 1 < len(out):
            out[i + 1] = experiment_file(out[i + 1])
    return out


def _help(command: str | None) -> str:
    width = 100
    if command is None:
        lines = [f"usage: {_prog()} COMMAND [--flags]", "", "commands:"]
        lines += [f"  {name:8s} {c.summary}" for name, c in COMMANDS.items()]
        lines += ["", f"{_prog()} COMMAND --help lists the flags of COMMAND."]
        return "\n".join(lines)

    def describe(name: str) -> list[str]:
        flag = FLAGS[name]
        spelled = f"--[no]{name}" if isinstance(flag, flags.BooleanFlag) else f"--{name}"
        default = "" if flag.default is None or name == "config" else f" (default: {flag.default_as_str.strip(QUOTE)})"
        text = textwrap.wrap(flag.help + default, width - 28)
        return [f"  {spelled:24s}  {text[0]}"] + [" " * 28 + t for t in text[1:]]

    c = COMMANDS[command]
    lines = [_usage(command), "", textwrap.fill(c.summary, width), "", "flags:"]
    for name in c.flags:
        lines += describe(name)
    lines += ["", "flags of every command:"]
    for name in COMMON_FLAGS:
        lines += describe(name)
    if "config" in c.flags:
        lines += ["", "packaged experiments: " + ", ".join(sorted(packaged_experiments()))]
    return "\n".join(lines)


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
    """The command and its flags, checked before anything is imported or run."""
    args = argv[1:]
    command = args[0] if args and not args[0].startswith("-") else None
    if any(a in ("-h", "--help", "-help", "--helpshort", "--helpfull") for a in args):
        print(_help(command if command in COMMANDS else None))
        sys.exit(0)
    if command is None:
        _fail(f"{_prog()}: no command; {_help(None).splitlines()[0]} (COMMAND: {', '.join(COMMANDS)})")
    if command not in COMMANDS:
        _fail(f"{_prog()}: unknown command {command!r}; usage: {_prog()} COMMAND [--flags] ({', '.join(COMMANDS)})")
    _check_flag_names(command, args[1:])
    try:
        args = _resolve_config(args)
    except UserError as e:
        _fail(f"{_prog()} {command}: {e}")
    try:
        rest = FLAGS([argv[0], *args])
    except Exception as e:  # flag values, or the experiment file's own code (a SyntaxError names its line)
        _fail(f"{_prog()} {command}: {_flag_error(e, args)}")
    if len(rest) != 2:
        _fail(f"{_prog()} {command}: unexpected arguments {' '.join(rest[2:])}; {_usage(command)}")
    missing = [f"--{n}" for n in COMMANDS[command].required if not FLAGS[n].present]
    if missing:
        _fail(f"{_prog()} {command}: {' and '.join(missing)} required; {_usage(command)}")
    return rest


def _flag_error(error: Exception, args: list[str]) -> str:
    """absl's message, or for an unknown --config.x override the list of valid keys."""
    message = str(error) if isinstance(error, flags.Error) else f"{type(error).__name__}: {error}"
    bad = [a.split("=")[0].lstrip("-") for a in args if a.startswith("--config.")]
    config_path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if bad and config_path and Path(config_path).is_file():
        valid = _config_keys(_load_experiment(config_path))
        unknown = [b for b in bad if b not in valid]
        if unknown:
            return f"unknown config key(s) {', '.join(unknown)}. Valid keys:\n  " + "\n  ".join(valid)
    return message


def _not_an_orbax_thread_error(record: logging.LogRecord) -> bool:
    """Orbax logs a failed asynchronous save from each of its threads, with tracebacks; the
    error also reaches the training loop, which reports it in one line."""
    return not (record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname)


def _setup_logging() -> None:
    handler = log_handler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    handler.addFilter(_not_an_orbax_thread_error)
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    for noisy in ("absl", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cmd_train() -> None:
    from elmo_jax.train.loop import train

    try:
        FLAGS.config.keys()
    except OSError as e:  # ml_collections keeps a config file that failed to load as an error object
        reason = [line.strip() for line in str(e).splitlines() if line.strip()][-1]
        raise UserError(
            f"--config={FLAGS['config'].config_filename}: cannot be loaded ({reason}); "
            f"packaged experiments: {', '.join(sorted(packaged_experiments()))}"
        ) from None
    print(FLAGS.config)
    result = train(FLAGS.config, FLAGS.workdir)
    if result:
        print(strict_json.dumps(result))


def cmd_eval() -> None:
    from elmo_jax.train.evaluate_run import evaluate_workdir

    result = evaluate_workdir(FLAGS.workdir, FLAGS.data, FLAGS.max_sentences or None, FLAGS.batch_size)
    print(strict_json.dumps(result))


def _model_flags(command: str, folder_flag: str | None) -> tuple[str | None, str | None, str | None]:
    """(a folder or published model, options, weights) from --model, --FOLDER_FLAG or --options
    and --weights: exactly one of the three ways."""
    folder = FLAGS[folder_flag].value if folder_flag else None
    ways = [FLAGS.model is not None, folder is not None, FLAGS.options is not None or FLAGS.weights is not None]
    alternatives = " | ".join(
        ([f"--{folder_flag}=DIR"] if folder_flag else []) + ["--model=NAME|URL", "--options=FILE --weights=FILE"]
    )
    if sum(ways) != 1 or (ways[2] and (FLAGS.options is None or FLAGS.weights is None)):
        raise UserError(f"give one model: {alternatives}; {_usage(command)}")
    return FLAGS.model or folder, FLAGS.options, FLAGS.weights


def cmd_import() -> None:
    from elmo_jax.model_io import load_model, save_imported

    source, options, weights = _model_flags("import", None)
    model = load_model(source, options, weights)
    inputs = (options, weights) if source is None else ()
    save_imported(model, FLAGS.output, FLAGS.overwrite, inputs)
    log.info(
        "imported %s into %s (embedding-only: the file holds no softmax)",
        source or f"{options} + {weights}",
        FLAGS.output,
    )


def cmd_export() -> None:
    from elmo_jax.model_io import export_model, load_model

    export_model(load_model(FLAGS.workdir), FLAGS.output, FLAGS.overwrite, (FLAGS.workdir,))
    log.info(
        "exported %s to %s (options.json, weights.hdf5%s)",
        FLAGS.workdir,
        FLAGS.output,
        ", vocab.txt" if (Path(FLAGS.output) / "vocab.txt").is_file() else "",
    )


def cmd_embed() -> None:
    from elmo_jax.embed import embed_file
    from elmo_jax.model_io import load_model
    from elmo_jax.outputs import check_output

    source, options, weights = _model_flags("embed", "workdir")
    inputs = (FLAGS.input, FLAGS.workdir, options, weights)
    check_output(FLAGS.output, FLAGS.overwrite, inputs, "--output")  # before loading the model
    model = load_model(source, options, weights)
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
        devices=FLAGS.devices,
        shard=(FLAGS.shard_index, FLAGS.num_shards),
    )
    log.info("embedded %d lines of %s into %s (layers: %s)", n, FLAGS.input, FLAGS.output, FLAGS.layers)


def cmd_vocab() -> None:
    from elmo_jax.outputs import check_output, replacing
    from elmo_jax.text.sources import stream_sentences
    from elmo_jax.text.vocab import build_vocabulary, summary

    inputs = _source_files(FLAGS.data)
    check_output(FLAGS.output, FLAGS.overwrite, inputs, "--output")  # before counting
    vocab, stats = build_vocabulary(stream_sentences(FLAGS.data), FLAGS.min_count)
    with replacing(FLAGS.output, FLAGS.overwrite, inputs, "--output") as tmp:
        vocab.save(tmp)
    log.info("%s: %s; written to %s", FLAGS.data, summary(stats), FLAGS.output)
    print(strict_json.dumps(stats))


def cmd_plan() -> None:
    from elmo_jax.plan.program import quiet_accelerator_plugins

    quiet_accelerator_plugins()
    from elmo_jax.plan.program import compile_train_step, largest_batch
    from elmo_jax.plan.report import describe, estimate
    from elmo_jax.plan.targets import target as find_target

    target, devices = find_target(FLAGS.target), FLAGS.devices or 1
    rows = FLAGS.config.train.per_device_batch_size

    def compile_at(batch: int):
        return compile_train_step(FLAGS.config, target, devices, batch, FLAGS.vocab_size)

    step = compile_at(rows)
    if FLAGS.hlo:
        Path(FLAGS.hlo).write_text(step.hlo)
    result = estimate(step, target)
    if FLAGS.fit:
        known = {rows: step.needs_bytes}
        result["largest_batch"] = largest_batch(
            lambda b: compile_at(b).needs_bytes, result["memory"]["capacity"], known
        )
        result["batches_compiled"] = {b: known[b] for b in sorted(known)}
    print("\n".join(describe(result, target)))
    print(strict_json.dumps(result))


def cmd_plot() -> None:
    from elmo_jax.curves import plot_curves

    # The default output is the run folder's own picture, redrawn each time.
    overwrite = FLAGS.overwrite or FLAGS.output is None
    log.info("training curves: %s", plot_curves(FLAGS.workdir, FLAGS.output, overwrite))


COMMANDS = {
    "vocab": Command(
        cmd_vocab,
        "Count a source into a vocabulary file (bilm-tf's format), in one streaming pass.",
        "--data=SOURCE --output=FILE [--min_count=N] [--overwrite]",
        ("data", "output", "min_count", "overwrite"),
        ("data", "output"),
    ),
    "train": Command(
        cmd_train,
        "Train a biLM from an experiment config, or resume the run in --workdir.",
        "--config=NAME|FILE --workdir=DIR [--config.SECTION.KEY=VALUE ...]",
        ("config", "workdir"),
        ("config", "workdir"),
    ),
    "eval": Command(
        cmd_eval,
        "Held-out perplexity (full softmax) of a workdir's latest checkpoint.",
        "--workdir=DIR [--data=SOURCE] [--max_sentences=N] [--batch_size=N]",
        ("workdir", "data", "max_sentences", "batch_size"),
        ("workdir",),
    ),
    "import": Command(
        cmd_import,
        "bilm-tf options.json + weights.hdf5, or a published model -> a model folder (params checkpoint).",
        "(--options=FILE --weights=FILE | --model=NAME|URL) --output=DIR [--overwrite]",
        ("options", "weights", "model", "output", "overwrite"),
        ("output",),
    ),
    "export": Command(
        cmd_export,
        "A workdir or model folder -> bilm-tf options.json + weights.hdf5 (+ vocab.txt).",
        "--workdir=DIR --output=DIR [--overwrite]",
        ("workdir", "output", "overwrite"),
        ("workdir", "output"),
    ),
    "embed": Command(
        cmd_embed,
        "A text file, one sentence a line -> ELMo layers in HDF5 (as `allennlp elmo` writes them).",
        "--input=FILE --output=FILE (--workdir=DIR | --model=NAME|URL | --options=FILE --weights=FILE) "
        "[--layers=all|top|average]",
        (
            "input",
            "output",
            "workdir",
            "model",
            "options",
            "weights",
            "layers",
            "batch_size",
            "max_tokens",
            "max_sentence_tokens",
            "stateful",
            "devices",
            "num_shards",
            "shard_index",
            "overwrite",
        ),
        ("input", "output"),
    ),
    "plan": Command(
        cmd_plan,
        "The train step compiled for an accelerator without one: kernels, memory, the largest batch that fits, "
        "estimated tokens/s and the paper's run in hours (needs elmo_jax[plan]).",
        "--config=NAME|FILE --target=h200|h100|a100|v5e|v5p|v6e [--devices=N] [--config.SECTION.KEY=VALUE ...]",
        ("config", "target", "devices", "vocab_size", "fit", "hlo"),
        ("config",),
    ),
    "plot": Command(
        cmd_plot,
        "The training curves of a workdir (loss, held-out perplexity) as a PNG; needs matplotlib.",
        "--workdir=DIR [--output=FILE] [--overwrite]",
        ("workdir", "output", "overwrite"),
        ("workdir",),
    ),
}


def _source_files(source: str) -> tuple[str, ...]:
    """The files or folder a text:GLOB / lm1b:PATH source reads (an output must not be one)."""
    kind, _, path = source.partition(":")
    return tuple(glob.glob(path)) if kind == "text" else (path,) if kind == "lm1b" else ()


def main(argv: list[str]) -> None:
    from elmo_jax.compile_time import use_persistent_cache  # JAX: only once the flags are good
    from elmo_jax.host_memory import keep_freed_memory

    command = argv[1]
    _setup_logging()
    keep_freed_memory()
    if FLAGS.compile_cache:
        use_persistent_cache(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "elmo_jax" / "jax")
    try:
        _run(command)
    except (UserError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        _report(command, e, 2)
    except (RunFailed, OSError) as e:
        _report(command, e, 1)
    except KeyboardInterrupt:
        _fail(f"{_prog()} {command}: interrupted", 130)


def _report(command: str, error: BaseException, status: int) -> None:
    """One line, unless --verbose or ELMO_JAX_TRACEBACK=1 asks for the traceback."""
    if FLAGS.verbose or os.environ.get("ELMO_JAX_TRACEBACK") == "1":
        raise error
    print(f"{_prog()} {command}: {error}", file=sys.stderr)
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
    COMMANDS[command].run()


def run() -> None:
    """The entry point: absl parses (parse_flags), then the command runs."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
