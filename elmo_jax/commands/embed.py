"""`elmo-jax embed`: a text file, one sentence a line -> ELMo layers in HDF5."""

from __future__ import annotations

import logging

from absl.flags import FlagValues

from elmo_jax.commands.command import Command, usage_line
from elmo_jax.commands.model_flags import model_source

log = logging.getLogger("elmo_jax")


def main(flags: FlagValues) -> None:
    from elmo_jax.embed import check_input, check_shard, embed_file
    from elmo_jax.model_io import load_model
    from elmo_jax.outputs import check_output

    check_shard(flags.shard_index, flags.num_shards)  # before loading the model
    source, options, weights = model_source(flags, "workdir", usage_line("embed", COMMAND))
    check_input(flags.input)
    inputs = (flags.input, flags.workdir, options, weights)
    check_output(flags.output, flags.overwrite, inputs)  # before loading the model
    model = load_model(source, options, weights)
    n = embed_file(
        model,
        flags.input,
        flags.output,
        layers=flags.layers,
        batch_size=64 if flags.batch_size is None else flags.batch_size,
        stateful=flags.stateful,
        max_tokens=flags.max_tokens,
        max_sentence_tokens=flags.max_sentence_tokens,
        overwrite=flags.overwrite,
        devices=flags.devices,
        shard=(flags.shard_index, flags.num_shards),
    )
    log.info("embedded %d lines of %s into %s (layers: %s)", n, flags.input, flags.output, flags.layers)


COMMAND = Command(
    main,
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
)
