"""The word vocabulary of the softmax (docs/MODEL.md section 5).

File format (bilm-tf): one token a line, id = line number; `<S>`, `</S>` and `<UNK>` must be
present (written first); the other words sorted by descending count, which the log-uniform
sampler relies on. Out-of-vocabulary targets map to `<UNK>`.
"""

from __future__ import annotations

import collections
import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from elmo_jax.errors import MissingFile, UserError
from elmo_jax.outputs import write_text
from elmo_jax.text.chars import BOS_TOKEN, EOS_TOKEN, UNK_TOKEN

SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


class Vocabulary:
    def __init__(self, words: list[str], source: str = "vocabulary"):
        self.words = list(words)
        self._id: dict[str, int] = {}
        for i, w in enumerate(self.words):
            if w in self._id:
                raise UserError(f"{source}: duplicate word {w!r} on lines {self._id[w] + 1} and {i + 1}")
            self._id[w] = i
        missing = [t for t in SPECIAL_TOKENS if t not in self._id]
        if missing:
            raise UserError(f"{source}: missing the special token(s) {', '.join(missing)}")
        self.bos, self.eos, self.unk = (self._id[t] for t in SPECIAL_TOKENS)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self._id

    @property
    def word_ids(self) -> dict[str, int]:
        """word -> id (read-only by convention)."""
        return self._id

    def id(self, word: str) -> int:
        return self._id.get(word, self.unk)

    def ids(self, tokens: Iterable[str]) -> np.ndarray:
        """Tokens -> int32 word ids, out-of-vocabulary -> `<UNK>`."""
        get, unk = self._id.get, self.unk
        return np.array([get(t, unk) for t in tokens], dtype=np.int32)

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        path = Path(path)
        if not path.is_file():
            raise MissingFile(f"vocabulary file not found: {path}")
        try:
            words = path.read_text(encoding="utf-8").split("\n")
        except UnicodeDecodeError as e:
            line = path.read_bytes()[: e.start].count(b"\n") + 1
            raise UserError(f"{path}: line {line} is not valid UTF-8") from None
        if words and words[-1] == "":
            words.pop()
        words = [w.strip() for w in words]
        if not words:
            raise UserError(f"{path}: the vocabulary file is empty")
        if "" in words:
            raise UserError(f"{path}: empty line {words.index('') + 1}")
        return cls(words, source=str(path))

    def text(self) -> str:
        """The file's contents: one word a line."""
        return "\n".join(self.words) + "\n"

    @functools.cached_property
    def sha256(self) -> str:
        """SHA-256 of the file's contents."""
        return hashlib.sha256(self.text().encode("utf-8")).hexdigest()

    def record(self) -> dict[str, int | str]:
        """Size and SHA-256 of the file's contents, to check a saved copy against."""
        return {"words": len(self), "sha256": self.sha256}

    def save(self, path: str | Path) -> None:
        """Written atomically: a kill leaves the old file or the whole new one."""
        write_text(path, self.text())

    @classmethod
    def from_counts(cls, counts: collections.Counter, min_count: int = 1) -> Vocabulary:
        """Special tokens first, then words by descending count, ties by the word itself."""
        kept = [(w, c) for w, c in counts.items() if c >= min_count and w not in SPECIAL_TOKENS]
        kept.sort(key=lambda wc: (-wc[1], wc[0]))
        return cls(list(SPECIAL_TOKENS) + [w for w, _ in kept])


def count_words(sentences: Iterable[list[str]]) -> collections.Counter:
    """Word counts over tokenized sentences, with `</S>` counted once per sentence."""
    counts: collections.Counter = collections.Counter()
    n = 0
    for sentence in sentences:
        counts.update(sentence)
        n += 1
    counts[EOS_TOKEN] += n
    return counts


def build_vocabulary(sentences: Iterable[list[str]], min_count: int = 1) -> tuple[Vocabulary, dict[str, float]]:
    """Counts a stream of sentences -> the vocabulary (words seen at least `min_count` times)
    and statistics: sentences, tokens (words, without `</S>`), types, vocabulary size, and the
    out-of-vocabulary tokens and rate."""
    counts = count_words(sentences)
    sentences_n = counts[EOS_TOKEN]
    vocab = Vocabulary.from_counts(counts, min_count)
    tokens = sum(counts.values()) - sentences_n
    oov = sum(c for w, c in counts.items() if w not in vocab and w != EOS_TOKEN)
    stats = {
        "sentences": sentences_n,
        "tokens": tokens,
        "types": len(counts) - 1,
        "vocabulary": len(vocab),
        "min_count": min_count,
        "oov_tokens": oov,
        "oov_rate": oov / max(tokens, 1),
    }
    return vocab, stats


def summary(stats: dict[str, float]) -> str:
    """build_vocabulary's statistics in one line."""
    return (
        f"{stats['sentences']:,} sentences, {stats['tokens']:,} tokens, {stats['types']:,} types; "
        f"{stats['vocabulary'] - len(SPECIAL_TOKENS):,} words seen >= {stats['min_count']} times "
        f"(+ {', '.join(SPECIAL_TOKENS)}); out-of-vocabulary tokens {100 * stats['oov_rate']:.3f}%"
    )
