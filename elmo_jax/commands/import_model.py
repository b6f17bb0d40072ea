"""`elmo-jax import`: bilm-tf options.json + weights.hdf5, or a published model -> a model folder."""

from __future__ import annotations

import logging

from absl.flags import FlagValues

from elmo_jax.commands.command import Command, usage_line
from elmo_jax.commands.model_flags import model_source

log = logging.getLogger("elmo_jax")


def main(flags: FlagValues) -> None:
    from elmo_jax.model_io import IMPORTED, load_model, save_imported
    from elmo_jax.outputs import check_output

    source, options, weights = model_source(flags, None, usage_line("import", COMMAND))
    inputs = (options, weights) if source is None else ()
    check_output(flags.output, flags.overwrite, inputs, folder=IMPORTED)  # before loading (or downloading) the model
    model = load_model(source, options, weights)
    written = save_imported(model, flags.output, flags.overwrite, inputs)
    log.info(
        "imported %s into %s: %s (embedding-only: the file holds no softmax)",
        source or f"{options} + {weights}",
        flags.output,
        ", ".join(written),
    )


COMMAND = Command(
    main,
    "bilm-tf options.json + weights.hdf5, or a published model -> a model folder (params checkpoint).",
    "(--options=FILE --weights=FILE | --model=NAME|URL) --output=DIR [--overwrite]",
    ("options", "weights", "model", "output", "overwrite"),
    ("output",),
)
