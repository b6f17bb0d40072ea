"""Corpus sources named by strings:

  demo        the built-in corpus (generated, random access)
  text:GLOB   text files, one whitespace-tokenized sentence a line (LM1B's format), each file a
              shard
  lm1b:PATH   the LM1B folder, or its .tar.gz read as a stream: the training files, or as the
              held-out split the standard test file news.en.heldout-00000-of-00050
  tfds:NAME   a prepared TFDS dataset with a `text` feature (tfds:lm1b), read with
              tfds.data_source in blocks of records; held-out = its test split

Text is read shard by shard (see shards.py); bytes that are not valid UTF-8 become U+FFFD, and a
warning counts such lines per shard.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from pathlib import Path

from elmo_jax.errors import MissingFile, UserError
from elmo_jax.text.corpus import Corpus
from elmo_jax.text.demo_corpus import DemoCorpus
from elmo_jax.text.shards import Shard, ShardedCorpus, lm1b_shards, tfds_blocks, warn_invalid_utf8

SOURCES = "'demo', 'text:GLOB', 'lm1b:PATH' or 'tfds:NAME'"


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a file; bytes that are not UTF-8 become U+FFFD, and a warning
    at the end lists the lines that had them."""
    bad = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\r\n")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("utf-8", errors="replace")
                bad.append(number)
            yield number, text
    warn_invalid_utf8(str(path), bad)


def open_corpus(source: str, split: str, seed: int = 0) -> Corpus:
    """A source string -> its corpus for `split` ("train" or "heldout"; text: ignores it)."""
    if source == "demo":
        return DemoCorpus(split, seed=seed)
    if source.startswith("text:"):
        pattern = source[len("text:") :]
        paths = sorted(Path(p) for p in glob.glob(pattern))
        if not paths:
            raise MissingFile(f"{source}: no file matches {pattern}")
        folders = [p for p in paths if p.is_dir()]
        if folders:
            raise UserError(f"{source}: {folders[0]} is a folder; name its files (text:{folders[0] / '*.txt'})")
        return ShardedCorpus(source, [Shard(p) for p in paths])
    if source.startswith("lm1b:"):
        return ShardedCorpus(f"{source} ({split})", lm1b_shards(Path(source[len("lm1b:") :]), split))
    if source.startswith("tfds:"):
        return ShardedCorpus(f"{source} ({split})", tfds_blocks(source[len("tfds:") :], split))
    raise UserError(f"unknown data source {source!r}; expected {SOURCES}")


def stream_sentences(source: str, split: str = "train") -> Iterator[list[str]]:
    """The sentences of a source one at a time, without holding the corpus in memory."""
    return open_corpus(source, split).stream()
