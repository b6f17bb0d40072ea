"""`elmo-jax plan`: the train step compiled for an accelerator without one (elmo_jax/plan/)."""

from __future__ import annotations

from pathlib import Path

from absl.flags import FlagValues

from elmo_jax import strict_json
from elmo_jax.commands.command import Command
from elmo_jax.errors import UserError


def main(flags: FlagValues) -> None:
    from elmo_jax.plan.program import quiet_accelerator_plugins

    quiet_accelerator_plugins()
    from elmo_jax.plan.program import compile_embed, compile_train_step, largest_batch
    from elmo_jax.plan.report import describe, describe_embed, estimate, estimate_embed
    from elmo_jax.plan.targets import target as find_target

    target, devices = find_target(flags.target), flags.devices or 1
    if not target.programs_read:
        raise UserError(
            f"target={target.name}: plan reads GPU programs only so far (h200, h100, a100); a TPU's compiles "
            "with libtpu, but its loops, memory and matmuls are not read yet, and a wrong estimate is worse than none",
            ("target",),
        )
    if flags.mode == "embed":
        programs = compile_embed(flags.config, target, devices, flags.batch_size or 64)
        if flags.hlo:
            Path(flags.hlo).write_text("\n\n".join(text for text, _ in programs.programs.values()))
        result = estimate_embed(programs, target)
        print("\n".join(describe_embed(result, target)))
        print(strict_json.dumps(result))
        return
    rows = flags.config.train.per_device_batch_size

    def compile_at(batch: int):
        return compile_train_step(flags.config, target, devices, batch, flags.vocab_size)

    step = compile_at(rows)
    if flags.hlo:
        Path(flags.hlo).write_text(step.hlo)
    result = estimate(step, target)
    if flags.fit:
        known = {rows: step.needs_bytes}
        result["largest_batch"] = largest_batch(
            lambda b: compile_at(b).needs_bytes, result["memory"]["capacity"], known
        )
        result["batches_compiled"] = {b: known[b] for b in sorted(known)}
    print("\n".join(describe(result, target)))
    print(strict_json.dumps(result))


COMMAND = Command(
    main,
    "The train step (or with --mode=embed the embedding programs) compiled for an accelerator without one: "
    "kernels, memory, the largest batch that fits, estimated tokens/s and the paper's run in hours (needs "
    "elmo_jax[plan]).",
    "--config=NAME|FILE --target=h200|h100|a100 [--devices=N] [--mode=embed [--batch_size=N]] "
    "[--config.SECTION.KEY=VALUE ...]",
    ("config", "target", "devices", "mode", "batch_size", "vocab_size", "fit", "hlo"),
    ("config",),
)
