"""Corpus sources named by strings: `demo` (the built-in corpus) and `text:GLOB` (one
whitespace-tokenized sentence a line, LM1B's format)."""

from __future__ import annotations

import glob
import logging
import time
from pathlib import Path
from typing import Iterator

from elmo_jax.text.batcher import Corpus
from elmo_jax.text.demo_corpus import DemoCorpus

log = logging.getLogger(__name__)


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
    if bad:
        shown = ", ".join(map(str, bad[:20])) + (", ..." if len(bad) > 20 else "")
        log.warning("%s: %d line(s) not valid UTF-8, decoded with replacement characters (lines %s)", path, len(bad), shown)


class TextCorpus:
    """Sentences from text files, read once into memory; empty lines are skipped.

    Bytes that are not valid UTF-8 become U+FFFD; a warning counts such lines per file.
    """

    def __init__(self, paths: list[Path], name: str):
        self.name = name
        self.sentences: list[list[str]] = []
        for path in paths:
            for _, line in read_lines(path):
                words = line.split()
                if words:
                    self.sentences.append(words)
        if not self.sentences:
            raise ValueError(f"{name}: no sentences in {', '.join(map(str, paths))} (the files are empty)")

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, i: int) -> list[str]:
        return self.sentences[i]


def _text_paths(source: str) -> list[Path]:
    pattern = source[len("text:") :]
    paths = sorted(Path(p) for p in glob.glob(pattern))
    if not paths:
        raise FileNotFoundError(f"{source}: no file matches {pattern}")
    return paths


def stream_sentences(source: str, split: str = "train") -> Iterator[list[str]]:
    """The non-empty sentences of a source one at a time, in order, without holding the corpus
    in memory; logs progress (share of the bytes read, ETA) after each file."""
    if source == "demo":
        corpus = DemoCorpus(split)
        yield from (corpus[i] for i in range(len(corpus)))
        return
    if not source.startswith("text:"):
        raise ValueError(f"unknown data source {source!r}; expected 'demo' or 'text:GLOB'")
    paths = _text_paths(source)
    total, done, start = sum(p.stat().st_size for p in paths), 0, time.monotonic()
    for path in paths:
        for _, line in read_lines(path):
            words = line.split()
            if words:
                yield words
        done += path.stat().st_size
        elapsed = time.monotonic() - start
        eta = elapsed * (total - done) / max(done, 1)
        log.info("%s: read %d of %d file(s), %.1f%% of %.1f MB, ETA %.0fs", source, paths.index(path) + 1, len(paths), 100 * done / max(total, 1), total / 1e6, eta)


def open_corpus(source: str, split: str, seed: int = 0) -> Corpus:
    """`demo` -> the demo corpus's `split` ("train" or "heldout"); `text:GLOB` -> TextCorpus."""
    if source == "demo":
        return DemoCorpus(split, seed=seed)
    if source.startswith("text:"):
        return TextCorpus(_text_paths(source), name=source)
    raise ValueError(f"unknown data source {source!r}; expected 'demo' or 'text:GLOB'")
