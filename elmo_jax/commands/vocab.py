"""`elmo-jax vocab`: a source counted into a vocabulary file, in one streaming pass."""

from __future__ import annotations

import glob
import logging

from absl.flags import FlagValues

from elmo_jax import strict_json
from elmo_jax.commands.command import Command

log = logging.getLogger("elmo_jax")


def main(flags: FlagValues) -> None:
    from elmo_jax.outputs import check_output, replacing
    from elmo_jax.text.sources import stream_sentences
    from elmo_jax.text.vocab import build_vocabulary, summary

    inputs = _source_files(flags.data)
    check_output(flags.output, flags.overwrite, inputs)  # before counting
    vocab, stats = build_vocabulary(stream_sentences(flags.data), flags.min_count)
    with replacing(flags.output, flags.overwrite, inputs) as tmp:
        vocab.save(tmp)
    log.info("%s: %s; written to %s", flags.data, summary(stats), flags.output)
    print(strict_json.dumps(stats))


def _source_files(source: str) -> tuple[str, ...]:
    """The files or folder a text:GLOB / lm1b:PATH source reads (an output must not be one)."""
    kind, _, path = source.partition(":")
    return tuple(glob.glob(path)) if kind == "text" else (path,) if kind == "lm1b" else ()


COMMAND = Command(
    main,
    "Count a source into a vocabulary file (bilm-tf's format), in one streaming pass.",
    "--data=SOURCE --output=FILE [--min_count=N] [--overwrite]",
    ("data", "output", "min_count", "overwrite"),
    ("data", "output"),
)
