"""Corpus sources named by strings: `demo` (the built-in corpus) and `text:GLOB` (one
whitespace-tokenized sentence a line, LM1B's format)."""

from __future__ import annotations

import glob
import logging
from pathlib import Path

from elmo_jax.text.batcher import Corpus
from elmo_jax.text.demo_corpus import DemoCorpus

log = logging.getLogger(__name__)


class TextCorpus:
    """Sentences from text files, read once into memory; empty lines are skipped.

    Bytes that are not valid UTF-8 become U+FFFD; a warning counts such lines per file.
    """

    def __init__(self, paths: list[Path], name: str):
        self.name = name
        self.sentences: list[list[str]] = []
        for path in paths:
            data = path.read_bytes()
            bad = []
            for number, raw in enumerate(data.split(b"\n"), start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    line = raw.decode("utf-8", errors="replace")
                    bad.append(number)
                words = line.split()
                if words:
                    self.sentences.append(words)
            if bad:
                shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
                log.warning("%s: %d line(s) not valid UTF-8, decoded with replacement characters (lines %s)", path, len(bad), shown)
        if not self.sentences:
            raise ValueError(f"{name}: no sentences in {', '.join(map(str, paths))} (the files are empty)")

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, i: int) -> list[str]:
        return self.sentences[i]


def open_corpus(source: str, split: str, seed: int = 0) -> Corpus:
    """`demo` -> the demo corpus's `split` ("train" or "heldout"); `text:GLOB` -> TextCorpus."""
    if source == "demo":
        return DemoCorpus(split, seed=seed)
    if source.startswith("text:"):
        pattern = source[len("text:") :]
        paths = sorted(Path(p) for p in glob.glob(pattern))
        if not paths:
            raise FileNotFoundError(f"{source}: no file matches {pattern}")
        return TextCorpus(paths, name=source)
    raise ValueError(f"unknown data source {source!r}; expected 'demo' or 'text:GLOB'")
