"""`elmo-jax plan`: the train step compiled for an accelerator without one (elmo_jax/plan/)."""

from __future__ import annotations

from pathlib import Path

from absl.flags import FlagValues

from elmo_jax import strict_json
from elmo_jax.commands.command import Command


def main(flags: FlagValues) -> None:
    from elmo_jax.experiment import validate
    from elmo_jax.plan.program import quiet_accelerator_plugins

    validate(flags.config)  # the settings by train's rules, before the compiler is looked for
    quiet_accelerator_plugins()
    from elmo_jax.plan.targets import target as find_target

    target, devices = find_target(flags.target), 1 if flags.devices is None else flags.devices
    lines, result, program = (_embedding if flags.mode == "embed" else _train_step)(flags, target, devices)
    if flags.hlo:
        Path(flags.hlo).write_text(program)
    print("\n".join(lines))
    print(strict_json.dumps(result))


def _embedding(flags: FlagValues, target, devices: int) -> tuple[list[str], dict, str]:
    """The embedding programs' plan: its lines, its JSON, the programs' text."""
    from elmo_jax.plan.program import compile_embed
    from elmo_jax.plan.report import describe_embed, estimate_embed

    programs = compile_embed(flags.config, target, devices, 64 if flags.batch_size is None else flags.batch_size)
    result = estimate_embed(programs, target)
    return describe_embed(result, target), result, "\n\n".join(text for text, _ in programs.programs.values())


def _train_step(flags: FlagValues, target, devices: int) -> tuple[list[str], dict, str]:
    """The train step's plan (and with --fit the largest batch): its lines, its JSON, the program."""
    from elmo_jax.plan.program import DoesNotFit, compile_train_step, largest_batch
    from elmo_jax.plan.report import describe, estimate

    rows = flags.config.train.per_device_batch_size

    def compile_at(batch: int):
        return compile_train_step(flags.config, target, devices, batch, flags.vocab_size)

    step = compile_at(rows)

    def needs(batch: int) -> int:
        try:
            return compile_at(batch).needs_bytes
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
    "[--config.SECTION.KEY=VALUE ...]",
    ("config", "target", "devices", "mode", "batch_size", "vocab_size", "fit", "hlo"),
    ("config",),
)
