"""`elmo-jax plot`: the training curves of a workdir as a PNG."""

from __future__ import annotations

import logging

from absl.flags import FlagValues

from elmo_jax.commands.command import Command

log = logging.getLogger("elmo_jax")


def main(flags: FlagValues) -> None:
    from elmo_jax.curves import plot_curves
    from elmo_jax.outputs import check_output

    if flags.output is not None:
        check_output(flags.output, flags.overwrite)  # before reading the metrics
    log.info("training curves: %s", plot_curves(flags.workdir, flags.output, flags.overwrite))


COMMAND = Command(
    main,
    "The training curves of a workdir (loss, held-out perplexity) as a PNG; needs matplotlib.",
    "--workdir=DIR [--output=FILE] [--overwrite]",
    ("workdir", "output", "overwrite"),
    ("workdir",),
)
