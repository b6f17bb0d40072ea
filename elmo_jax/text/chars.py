"""Character ids of tokens (ELMO_SPEC.md section 2), vectorised with numpy.

A token becomes `max_characters_per_token` ids: begin-of-word, its UTF-8 bytes (cut at
max - 2 bytes, possibly inside a multi-byte character), end-of-word, then padding characters;
every id is shifted by +1 so that 0 marks a padded slot (a slot holding no token at all).
"""

from __future__ import annotations

import numpy as np

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
UNK_TOKEN = "<UNK>"

# Raw (unshifted) special character ids.
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
MAX_CHARS = 50


def encode_tokens(tokens: list[str], max_chars: int = MAX_CHARS) -> np.ndarray:
    """Tokens -> (n, max_chars) int32 char ids, +1 shifted (never 0)."""
    n = len(tokens)
    # A sentence boundary is one special character (set below), not its literal bytes.
    data = [
        b"\0" if t in (BOS_TOKEN, EOS_TOKEN) else t.encode("utf-8", "ignore")[: max_chars - 2]
        for t in tokens
    ]
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


class CharTable:
    """Caches the char ids of every token seen, so repeated words are encoded once.

    `ids(tokens)` gives each token a row number; `tokens[row]` is the token of a row.
    """

    def __init__(self, max_chars: int = MAX_CHARS):
        self.max_chars = max_chars
        self.tokens: list[str] = []
        self._row: dict[str, int] = {}
        self._table = np.zeros((1024, max_chars), dtype=np.int32)

    def ids(self, tokens: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(tokens) if t not in self._row]
        if new:
            start = len(self._row)
            if start + len(new) > len(self._table):
                grown = np.zeros((max(2 * len(self._table), start + len(new)), self.max_chars), np.int32)
                grown[:start] = self._table[:start]
                self._table = grown
            self._table[start : start + len(new)] = encode_tokens(new, self.max_chars)
            self._row.update((t, start + i) for i, t in enumerate(new))
            self.tokens += new
        return np.fromiter(map(self._row.__getitem__, tokens), dtype=np.int64, count=len(tokens))

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """Row numbers (any shape) -> char ids (shape + (max_chars,))."""
        return self._table[rows]

    def encode(self, tokens: list[str]) -> np.ndarray:
        """Tokens -> (n, max_chars) char ids, through the cache."""
        return self.lookup(self.ids(tokens))
