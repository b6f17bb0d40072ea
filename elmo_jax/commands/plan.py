"""`elmo-jax plan`: the train step compiled for an accelerator without one (elmo_jax/plan/)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from absl.flags import FlagValues

from elmo_jax import stop_signals, strict_json
from elmo_jax.commands.command import Command
from elmo_jax.errors import UserError

log = logging.getLogger("elmo_jax")
GB = 1e9


def main(flags: FlagValues) -> None:
    from elmo_jax.experiment import validate
    from elmo_jax.outputs import check_output, replacing
    from elmo_jax.plan.program import quiet_accelerator_plugins

    validate(flags.config)  # the settings by train's rules, before the compiler is looked for
    files = {name: getattr(flags, name) for name in ("hlo", "json") if getattr(flags, name)}
    if len(files) == 2 and Path(files["hlo"]).absolute() == Path(files["json"]).absolute():
        raise UserError(f"--hlo and --json name one file, {files['hlo']}: give each its own")
    config_file = getattr(flags["config"], "config_filename", None)  # ml_collections' config flag keeps it
    for name, path in files.items():
        check_output(path, flags.overwrite, (config_file,), name=name)  # before compiling
    quiet_accelerator_plugins()
    from elmo_jax.plan.targets import target as find_target

    target, devices = find_target(flags.target), 1 if flags.devices is None else flags.devices
    lines, result, program = (_embedding if flags.mode == "embed" else _train_step)(flags, target, devices)
    texts = {"hlo": program, "json": strict_json.dumps(result) + "\n"}
    for name, path in files.items():
        with replacing(path, flags.overwrite, name=name) as tmp:
            tmp.write_text(texts[name])
    print("\n".join(lines))
    if files:
        log.info("written: %s", ", ".join(f"{path} ({name})" for name, path in files.items()))
    if "json" not in files and not sys.stdout.isatty():  # a pipe or a file: the figures as JSON, last
        print(texts["json"], end="")
    elif "json" not in files:
        print("(--json=FILE writes every figure as JSON; so does piping the output)")


def _embedding(flags: FlagValues, target, devices: int) -> tuple[list[str], dict, str]:
    """The embedding programs' plan: its lines, its JSON, the programs' text."""
    from elmo_jax.plan.program import compile_embed
    from elmo_jax.plan.report import describe_embed, estimate_embed

    batch = 64 if flags.batch_size is None else flags.batch_size
    log.info("compiling the embedding programs for %s (%d x %s, %d sentences a batch)", flags.target, devices,
             target.name, batch)  # fmt: skip
    programs = compile_embed(flags.config, target, devices, batch)
    result = estimate_embed(programs, target)
    return describe_embed(result, target), result, "\n\n".join(text for text, _ in programs.programs.values())


def _train_step(flags: FlagValues, target, devices: int) -> tuple[list[str], dict, str]:
    """The train step's plan (and with --fit the largest batch): its lines, its JSON, the program."""
    from elmo_jax.plan.program import DoesNotFit, compile_train_step, largest_batch
    from elmo_jax.plan.report import describe, estimate

    rows = flags.config.train.per_device_batch_size
    capacity = target.memory_bytes * target.usable_memory

    def compile_at(batch: int, why: str):
        stop_signals.check()
        log.info("compiling the train step for %d x %s at %d rows a device (%s)", devices, target.name, batch, why)
        start = time.perf_counter()
        try:
            step = compile_train_step(flags.config, target, devices, batch, flags.vocab_size)
        except DoesNotFit:
            log.info("  %d rows: refused by the compiler, over %.1f GB (%.0f s)", batch, capacity / GB,
                     time.perf_counter() - start)  # fmt: skip
            raise
        fits = "fits" if step.needs_bytes <= capacity else "does not fit"
        log.info("  %d rows: needs %.2f GB of %.1f GB usable, %s (%.0f s)", batch, step.needs_bytes / GB,
                 capacity / GB, fits, time.perf_counter() - start)  # fmt: skip
        return step

    step = compile_at(rows, "the config's")

    def needs(batch: int) -> int:
        try:
            return compile_at(batch, "the search for the largest batch that fits").needs_bytes
        except DoesNotFit as e:  # libtpu refuses a program whose temporaries exceed the chip's memory,
            return e.needs_bytes + step.needs_bytes - step.memory["temp"]  # with the arguments and outputs

    result = estimate(step, target)
    if flags.fit:
        known = {rows: step.needs_bytes}
        result["largest_batch"] = largest_batch(needs, result["memory"]["capacity"], known)
        result["batches_compiled"] = {b: known[b] for b in sorted(known)}
    return describe(result, target), result, step.hlo


COMMAND = Command(
    main,
    "The train step (or with --mode=embed the embedding programs) compiled for an accelerator without one: "
    "kernels, memory, the largest batch that fits, estimated tokens/s and the paper's run in hours (needs "
    "elmo_jax[plan]).",
    "--config=NAME|FILE --target=h200|h100|a100|v5e|v5p|v6e [--devices=N] [--mode=embed [--batch_size=N]] "
    "[--json=FILE] [--config.SECTION.KEY=VALUE ...]",
    ("config", "target", "devices", "mode", "batch_size", "vocab_size", "fit", "hlo", "json", "overwrite"),
    ("config",),
)
