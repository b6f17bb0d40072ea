"""The model a command reads: --model, a folder flag, or --options with --weights."""

from __future__ import annotations

from absl.flags import FlagValues

from elmo_jax.errors import UserError


def model_source(flags: FlagValues, folder_flag: str | None, usage: str) -> tuple[str | None, str | None, str | None]:
    """(a folder or published model, options, weights) from --model, --FOLDER_FLAG or --options
    and --weights: exactly one of the three ways (else an error ending with `usage`)."""
    folder = flags[folder_flag].value if folder_flag else None
    ways = [flags.model is not None, folder is not None, flags.options is not None or flags.weights is not None]
    alternatives = " | ".join(
        ([f"--{folder_flag}=DIR"] if folder_flag else []) + ["--model=NAME|URL", "--options=FILE --weights=FILE"]
    )
    if sum(ways) != 1 or (ways[2] and (flags.options is None or flags.weights is None)):
        raise UserError(f"give one model: {alternatives}; {usage}")
    return flags.model or folder, flags.options, flags.weights
