"""What the benchmarks share: the model sizes they run (read from experiments/), text to feed
them (Zipfian sentences with a real text's repeat rate; a synthetic frequency-ordered corpus with
its vocabulary) and a timer.

Run every benchmark from the repository root as a module: `python -m benchmarks.speed.throughput
--config=original ...` (benchmarks/README.md).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from elmo_jax.settings import TrainSettings
from elmo_jax.text.corpus import InMemory
from elmo_jax.text.vocab import SPECIAL_TOKENS, Vocabulary
from experiments import cpu_peer, elmo_medium, elmo_original, elmo_small

ROOT = Path(__file__).resolve().parent.parent

# The sizes a benchmark takes by --config: its experiment, and the vocabulary size of the data it
# stands for (cpu_peer: the comparison with bilm-tf's code; the published sizes: LM1B's).
EXPERIMENTS = {"cpu_peer": cpu_peer, "small": elmo_small, "medium": elmo_medium, "original": elmo_original}
VOCAB_SIZES = {"cpu_peer": 5_000, **dict.fromkeys(("small", "medium", "original"), TrainSettings.n_tokens_vocab)}
DTYPES = {"f32": "float32", "bf16": "bfloat16"}


class StandInDevice:
    """A device that runs the steps dispatched to it one after another, each taking `step_s`,
    while the host goes on, as a GPU's stream does (XLA:CPU runs a program on the calling thread:
    elmo_jax/host_memory.py): to measure the host's input path against an accelerator's step
    time on a machine without one. A step's output (`StandInOutput`) is ready once it has run."""

    def __init__(self, step_s: float):
        self.step_s, self.free_at = step_s, time.monotonic()

    def step(self) -> StandInOutput:
        self.free_at = max(self.free_at, time.monotonic()) + self.step_s
        return StandInOutput(self.free_at)


class StandInOutput:
    def __init__(self, ready_at: float):
        self.ready_at = ready_at

    def is_ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    def block_until_ready(self) -> StandInOutput:
        time.sleep(max(self.ready_at - time.monotonic(), 0.0))
        return self


def size(name: str) -> tuple[dict, int, int, int]:
    """--config=NAME -> (model options, vocabulary size, negatives, rows per device) of its experiment."""
    config = EXPERIMENTS[name].get_config()
    t = config.train
    return config.model.to_dict(), VOCAB_SIZES[name], t.n_negative_samples_batch, t.per_device_batch_size


def synthetic_corpus(vocab_size: int, sentences: int, seed: int = 0):
    """Sentences of Zipf(1)-distributed words over `vocab_size` invented, frequency-ordered
    words of 2 to 12 letters; returns (corpus, vocabulary)."""
    rng = np.random.default_rng(seed)
    n_words = vocab_size - len(SPECIAL_TOKENS)
    letters = np.array(list("etaoinshrdlucmfwypvbgkqjxz"))
    lengths = 2 + np.minimum(np.log2(np.arange(n_words) + 2).astype(int), 10)
    words = ["".join(letters[(i // 26**k) % 26] for k in range(n)) + str(i) for i, n in enumerate(lengths)]
    p = 1.0 / np.arange(1, n_words + 1)
    ids = rng.choice(n_words, size=(sentences, 25), p=p / p.sum())

    class Synthetic(InMemory):
        name = "synthetic"

        def __len__(self):
            return sentences

        def __getitem__(self, i):
            return [words[j] for j in ids[i]]

    return Synthetic(), Vocabulary(list(SPECIAL_TOKENS) + words)


def timed(fn, *args, reps: int = 10) -> float:
    """Median seconds of fn(*args) after a compile and a warm-up call."""
    import jax  # here: a benchmark sets its XLA flags and platform before JAX starts

    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Real-looking text for the embedding benchmarks: word r (r = 1, 2, ...) of a `vocabulary`-word
# list has probability proportional to 1 / r^`exponent`, and an English-like length (frequent words
# short, rare ones longer: 1 to 16 letters, 4.3 on average); sentence lengths are log-normal around
# 22 tokens (1 to 120), the shape of news text such as LM1B's. 2,000 sentences then hold about
# 45,000 tokens of about 9,500 distinct words.
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
