"""The distinct token strings of a corpus ("word types") as numbers, for batches made with whole
numpy arrays: type t < V is vocabulary word t, type V + i the i-th string outside the vocabulary.

Per type: its vocabulary id (targets; `<UNK>` outside it) and its rank in the order of the
character-id rows (the order of a batch's word table, see StreamBatcher): the rows compared
column by column as numbers, so two strings whose rows are the same (words cut at
max_chars - 2 bytes) share a rank, and one table row; per rank, its character ids.
"""

from __future__ import annotations

import operator

import numpy as np

from elmo_jax.text.chars import BOS_TOKEN, EOS_TOKEN, MAX_CHARS, ByteChars, TokenIds, token_char_ids
from elmo_jax.text.vocab import Vocabulary

# A row's order key as a string of code points: each byte itself, then the end-of-word mark;
# `<S>` and `</S>` are one special character each. The row's values shifted down by one
# (bytes 0-255, <S> 256, </S> 257, end of word 259) compare as the row does.
_END = chr(259)
CHUNK = 1 << 16  # words encoded at a time
_SPECIAL_KEYS = {BOS_TOKEN: chr(256) + _END, EOS_TOKEN: chr(257) + _END}


def order_key(token: str, max_chars: int = MAX_CHARS) -> str:
    """A string that sorts as the token's character-id row does (ties: the same row)."""
    special = _SPECIAL_KEYS.get(token)
    if special is not None:
        return special
    return token.encode("utf-8", "ignore")[: max_chars - 2].decode("latin-1") + _END


class WordTypes:
    """The vocabulary's words and the corpus's strings outside it (`oov`, in first-seen order);
    their ids as `token_ids` gives them (bilm-tf's char ids by default): `ranks` (n,) int32, each
    type's row of `chars` (n_ranks, width), uint16 for bilm-tf's, uint32 for dictionaries'."""

    def __init__(self, vocab: Vocabulary, oov: list[str], token_ids: TokenIds | None = None):
        self.strings = vocab.words + oov
        token_ids = token_ids if token_ids is not None else ByteChars()
        self.vocab_size, self.max_chars = len(vocab), token_ids.width
        n = len(self.strings)
        self.vocab_ids = np.arange(n, dtype=np.int32)  # type -> vocabulary id
        self.vocab_ids[len(vocab) :] = vocab.unk
        if not isinstance(token_ids, ByteChars):
            self._rank_rows(token_ids)
            return
        max_chars = token_ids.max_chars
        keys = [order_key(s, max_chars) for s in self.strings]
        by_key = sorted(range(n), key=keys.__getitem__)
        new = np.fromiter(map(operator.ne, [None] + [keys[t] for t in by_key[:-1]], (keys[t] for t in by_key)), bool, n)
        self.ranks = np.empty(n, np.int32)  # type -> rank of its row
        self.ranks[by_key] = np.cumsum(new) - 1
        self.n_ranks = int(new.sum())
        self.chars = np.zeros((self.n_ranks, max_chars), np.uint16)  # rank -> its char ids (+1 shifted)
        for start in range(0, n, CHUNK):
            part = slice(start, start + CHUNK)
            self.chars[self.ranks[part]] = token_char_ids(self.strings[part], max_chars)

    def _rank_rows(self, token_ids: TokenIds) -> None:
        """Ranks and rows for any other `TokenIds` (ELMoForManyLangs' dictionaries): the rows
        themselves sorted (ties: one rank), `<S>` and `</S>` read as the model's boundaries."""
        boundaries = {BOS_TOKEN: token_ids.bos, EOS_TOKEN: token_ids.eos}
        rows = np.concatenate(
            [
                token_ids.encode([boundaries.get(s, s) for s in self.strings[start : start + CHUNK]])
                for start in range(0, len(self.strings), CHUNK)
            ]
        )
        unique, inverse = np.unique(rows.reshape(len(self.strings), token_ids.width), axis=0, return_inverse=True)
        self.chars, self.ranks = unique.astype(np.uint32), inverse.reshape(-1).astype(np.int32)
        self.n_ranks = len(unique)

    def __len__(self) -> int:
        return len(self.strings)
