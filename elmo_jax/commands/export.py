"""`elmo-jax export`: a workdir or model folder -> bilm-tf options.json + weights.hdf5 (+ vocab.txt)."""

from __future__ import annotations

import logging
from pathlib import Path

from absl.flags import FlagValues

from elmo_jax.commands.command import Command

log = logging.getLogger("elmo_jax")


def main(flags: FlagValues) -> None:
    from elmo_jax.model_io import export_model, load_model
    from elmo_jax.outputs import check_output

    check_output(flags.output, flags.overwrite, (flags.workdir,), folder=True)  # before loading the model
    export_model(load_model(flags.workdir), flags.output, flags.overwrite, (flags.workdir,))
    log.info(
        "exported %s to %s (options.json, weights.hdf5%s)",
        flags.workdir,
        flags.output,
        ", vocab.txt" if (Path(flags.output) / "vocab.txt").is_file() else "",
    )


COMMAND = Command(
    main,
    "A workdir or model folder -> bilm-tf options.json + weights.hdf5 (+ vocab.txt).",
    "--workdir=DIR --output=DIR [--overwrite]",
    ("workdir", "output", "overwrite"),
    ("workdir", "output"),
)
