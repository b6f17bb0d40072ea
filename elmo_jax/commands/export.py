"""`elmo-jax export`: a workdir or model folder -> bilm-tf options.json + weights.hdf5 (+ vocab.txt),
or an ELMoForManyLangs model -> their folder."""

from __future__ import annotations

import logging

from absl.flags import FlagValues

from elmo_jax.commands.command import Command

log = logging.getLogger("elmo_jax")


def main(flags: FlagValues) -> None:
    from elmo_jax.model_io import export_layout, export_model, load_model
    from elmo_jax.outputs import check_output

    layout = export_layout(flags.workdir)
    check_output(flags.output, flags.overwrite, (flags.workdir,), folder=layout)  # before loading the model
    written = export_model(load_model(flags.workdir), flags.output, flags.overwrite, (flags.workdir,))
    log.info("exported %s to %s: %s", flags.workdir, flags.output, ", ".join(written))


COMMAND = Command(
    main,
    "A workdir or model folder -> bilm-tf options.json + weights.hdf5 (+ vocab.txt); an ELMoForManyLangs "
    "model -> their folder.",
    "--workdir=DIR --output=DIR [--overwrite]",
    ("workdir", "output", "overwrite"),
    ("workdir", "output"),
)
