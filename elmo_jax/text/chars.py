"""Character ids of tokens (docs/MODEL.md section 2), vectorised with numpy.

A token becomes `max_characters_per_token` ids: begin-of-word, its UTF-8 bytes (cut at
max - 2 bytes, possibly inside a multi-byte character), end-of-word, then padding characters;
every id is shifted by +1 so that 0 marks a padded slot (a slot holding no token at all).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
UNK_TOKEN = "<UNK>"

# Raw (unshifted) special character ids.
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
MAX_CHARS = 50


def token_char_ids(tokens: list[str], max_chars: int = MAX_CHARS) -> np.ndarray:
    """Tokens -> (n, max_chars) int32 char ids, +1 shifted (never 0)."""
    n = len(tokens)
    # A sentence boundary is one special character (set below), not its literal bytes.
    data = [b"\0" if t in (BOS_TOKEN, EOS_TOKEN) else t.encode("utf-8", "ignore")[: max_chars - 2] for t in tokens]
    lengths = np.fromiter((len(b) for b in data), dtype=np.int64, count=n)
    out = np.full((n, max_chars), PAD_CHAR + 1, dtype=np.int32)
    out[:, 0] = BOW_CHAR + 1
    flat = np.frombuffer(b"".join(data), dtype=np.uint8).astype(np.int32) + 1
    rows = np.repeat(np.arange(n), lengths)
    starts = np.cumsum(lengths) - lengths
    cols = np.arange(len(flat)) - np.repeat(starts, lengths) + 1
    out[rows, cols] = flat
    out[np.arange(n), lengths + 1] = EOW_CHAR + 1
    for token, char in ((BOS_TOKEN, BOS_CHAR), (EOS_TOKEN, EOS_CHAR)):
        special = np.fromiter((t == token for t in tokens), dtype=bool, count=n)
        out[special, 1] = char + 1
    return out


class TokenIds(Protocol):
    """How a model's tokens become ids: `encode` gives each token `width` ids, never all 0 (0 marks
    a padded slot): `lead` ids (a word id), then its characters'; `bos` / `eos` are the tokens
    put around each sentence; `pad` is the id that fills a row after a token's characters (so
    trailing columns can be cut, `char_columns`), or None where rows are not padded that way."""

    @property
    def width(self) -> int: ...

    @property
    def lead(self) -> int: ...

    @property
    def bos(self) -> str: ...

    @property
    def eos(self) -> str: ...

    @property
    def pad(self) -> int | None: ...

    def encode(self, tokens: list[str]) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class ByteChars:
    """bilm-tf's token ids: `token_char_ids` (UTF-8 bytes, 5 special characters)."""

    max_chars: int = MAX_CHARS
    bos: str = BOS_TOKEN
    eos: str = EOS_TOKEN
    pad: int | None = PAD_CHAR + 1
    lead: int = 0

    @property
    def width(self) -> int:
        return self.max_chars

    def encode(self, tokens: list[str]) -> np.ndarray:
        return token_char_ids(tokens, self.max_chars)


class CharTable:
    """Caches the ids of every token seen, so repeated words are encoded once (`TokenIds`:
    bilm-tf's char ids by default).

    `ids(tokens)` gives each token a row number; `tokens[row]` is the token of a row.
    """

    def __init__(self, token_ids: TokenIds | int | None = None):
        if token_ids is None or isinstance(token_ids, int):  # an int: bilm-tf's ids of that many characters
            token_ids = ByteChars() if token_ids is None else ByteChars(token_ids)
        self.token_ids: TokenIds = token_ids
        self.max_chars = self.token_ids.width
        self.tokens: list[str] = []
        self._row: dict[str, int] = {}
        self._table = np.zeros((1024, self.max_chars), dtype=np.int32)

    def ids(self, tokens: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(tokens) if t not in self._row]
        if new:
            start = len(self._row)
            if start + len(new) > len(self._table):
                grown = np.zeros((max(2 * len(self._table), start + len(new)), self.max_chars), np.int32)
                grown[:start] = self._table[:start]
                self._table = grown
            self._table[start : start + len(new)] = self.token_ids.encode(new)
            self._row.update((t, start + i) for i, t in enumerate(new))
            self.tokens += new
        return np.fromiter(map(self._row.__getitem__, tokens), dtype=np.int64, count=len(tokens))

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """Row numbers (any shape) -> char ids (shape + (max_chars,))."""
        return self._table[rows]

    def encode(self, tokens: list[str]) -> np.ndarray:
        """Tokens -> (n, max_chars) char ids, through the cache."""
        return self.lookup(self.ids(tokens))


def check_sentences(sentences) -> None:
    """Raises TypeError unless `sentences` is a list (or tuple) of token lists: a string, or a
    list of strings, would otherwise be read one character per token."""
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, (list, tuple)):
        raise TypeError(
            "sentences must be a list of token lists, such as [['the', 'river', 'bank']], "
            f"got {type(sentences).__name__}" + (" (split it: [text.split()])" if isinstance(sentences, str) else "")
        )
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, (str, bytes)) or not isinstance(sentence, (list, tuple)):
            raise TypeError(
                f"sentences[{i}] is a {type(sentence).__name__}, not a list of tokens; pass "
                f"[text.split() for text in texts] for strings, or [tokens] for one sentence"
            )
        bad = next((t for t in sentence if not isinstance(t, str)), None)
        if bad is not None:
            raise TypeError(f"sentences[{i}] holds a {type(bad).__name__} ({bad!r}); tokens must be strings")


def batch_to_ids(sentences: list[list[str]], max_chars: int = MAX_CHARS) -> np.ndarray:
    """Token lists -> (B, T, max_chars) int32 char ids, T the longest sentence, padded slots 0:
    AllenNLP's `batch_to_ids` (no `<S>`/`</S>`; `elmo_jax.Elmo` adds them)."""
    return sentence_ids(sentences, ByteChars(max_chars))


def sentence_ids(sentences: list[list[str]], token_ids: TokenIds) -> np.ndarray:
    """Token lists -> (B, T, token_ids.width) int32 ids, T the longest sentence, padded slots 0
    (no sentence boundaries): `batch_to_ids` for any model's `TokenIds`."""
    check_sentences(sentences)
    T = max((len(s) for s in sentences), default=0)
    out = np.zeros((len(sentences), T, token_ids.width), np.int32)
    table = CharTable(token_ids)
    for i, sentence in enumerate(sentences):
        out[i, : len(sentence)] = table.encode(list(sentence))
    return out
