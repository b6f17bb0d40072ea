"""Real-looking text for embedding benchmarks: sentences whose words follow Zipf's law.

Word r (r = 1, 2, ...) of a `vocabulary`-word list has probability proportional to
1 / r^`exponent`, and an English-like length (frequent words short, rare ones longer: 1 to 16
letters, 4.3 on average); sentence lengths are log-normal around 22 tokens (1 to 120), the
shape of news text such as LM1B's. 2,000 sentences then hold about 45,000 tokens of about 9,500
distinct words.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LETTERS = np.array(list("etaoinshrdlucmfwypvbgkqjxz"))
LETTER_P = np.array(
    [
        12.7,
        9.1,
        8.2,
        7.5,
        7.0,
        6.7,
        6.3,
        6.1,
        6.0,
        4.3,
        4.0,
        2.8,
        2.8,
        2.4,
        2.4,
        2.2,
        2.0,
        2.0,
        1.9,
        1.5,
        1.0,
        0.8,
        0.15,
        0.15,
        0.1,
        0.07,
    ]
)


def zipf_sentences(
    n_sentences: int, seed: int = 0, vocabulary: int = 100_000, exponent: float = 1.1
) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocabulary + 1)
    lengths = np.clip(np.round(2.0 + 1.3 * np.log10(ranks) + rng.normal(0, 1.5, vocabulary)), 1, 16).astype(int)
    words, seen = [], set()
    for n in lengths:
        while True:
            word = "".join(rng.choice(LETTERS, size=n, p=LETTER_P / LETTER_P.sum()))
            if word not in seen:
                break
            n += 1  # short words run out: a longer one
        seen.add(word)
        words.append(word)
    p = 1.0 / ranks**exponent
    sentence_lengths = np.clip(np.round(np.exp(rng.normal(3.0, 0.5, n_sentences))), 1, 120).astype(int)
    ids = rng.choice(vocabulary, size=int(sentence_lengths.sum()), p=p / p.sum())
    out, start = [], 0
    for n in sentence_lengths:
        out.append([words[i] for i in ids[start : start + n - 1]] + ["."])
        start += n
    return out


def write_zipf_file(path: str | Path, n_sentences: int, seed: int = 0) -> list[list[str]]:
    sentences = zipf_sentences(n_sentences, seed)
    Path(path).write_text("".join(" ".join(s) + "\n" for s in sentences))
    return sentences
