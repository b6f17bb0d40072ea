"""The host's half of `train`: an LM1B-layout folder of text shards turned into batches on the
devices by the train loop's own data path (corpus, vocabulary, StreamBatcher with the backward
LM's independent order, Prefetcher, DataParallel.put_batch), on CPU devices.

    python -m benchmarks.speed.host_path [--corpus=DIR] [--shards=100] [--tokens=20000000]
        [--vocab=793471] [--batches=30] [--shapes=1x128,1x512,8x128,8x512] [--unroll=20]

For each shape (device groups x rows per device) it reports
  first batch   seconds from opening the corpus to the first batch: counting, tokenizing (or
                reading the token cache: "warm" is a second start with the cache filled)
  steady        tokens/s of finished batches put on the devices, the prefetcher alone, after
                the first few batches (a token = one position of one row)
  input-bound   the share of time a device would have had nothing to do for want of a batch
                (train's figure, TrainWindow), against a stand-in for the device step that takes
                the plan's H200 step time for the shape (STAND_IN_MS) and lets the host run
                meanwhile, as a GPU does (benchmarks/common.py, StandInDevice)
The process keeps freed memory as `train` does (elmo_jax/host_memory.py). The corpus (Zipfian
words of English-like lengths over a vocabulary of --vocab words, and 2% of word types outside it)
is generated once into --corpus (default: a folder in the system's temp folder). The last line is
JSON.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.common import LETTER_P, LETTERS  # noqa: E402
from elmo_jax.text.shards import LM1B_DIR  # noqa: E402
from elmo_jax.text.vocab import SPECIAL_TOKENS  # noqa: E402

# The plan's H200 step (bfloat16, the original size) per shape, docs/PERFORMANCE.md (2026-12-04/05).
STAND_IN_MS = {(1, 128): 5.97, (1, 512): 14.08, (8, 128): 8.4, (8, 512): 18.6}


def make_corpus(
    folder: Path, shards: int, tokens: int, vocab_size: int, seed: int = 0, heldout_tokens: int | None = None
) -> Path:
    """Writes LM1B's layout under `folder` (training shards, a held-out file of `heldout_tokens`,
    by default a quarter of a shard's, vocab.txt) unless it is there; returns the folder."""
    if (folder / "vocab.txt").is_file():
        return folder
    rng = np.random.default_rng(seed)
    n_types = int(vocab_size * 1.02)
    ranks = np.arange(1, n_types + 1)
    lengths = np.clip(np.round(2.0 + 1.3 * np.log10(ranks) + rng.normal(0, 1.5, n_types)), 1, 16).astype(int)
    letters = rng.choice(LETTERS, size=int(lengths.sum()), p=LETTER_P / LETTER_P.sum())
    text = "".join(letters)
    ends = np.cumsum(lengths)
    # A number after the letters keeps the words distinct.
    words = np.array([f"{text[e - n : e]}{i}" for i, (n, e) in enumerate(zip(lengths, ends))], dtype=object)
    p = 1.0 / ranks
    p /= p.sum()
    root = folder / LM1B_DIR
    train = root / "training-monolingual.tokenized.shuffled"
    heldout = root / "heldout-monolingual.tokenized.shuffled"
    for d in (train, heldout):
        d.mkdir(parents=True, exist_ok=True)

    def write(path: Path, n_tokens: int) -> None:
        sentence_lengths = np.clip(np.round(np.exp(rng.normal(3.0, 0.5, n_tokens // 20))), 1, 120).astype(int)
        sentence_lengths = sentence_lengths[np.cumsum(sentence_lengths) <= n_tokens]
        ids = rng.choice(n_types, size=int(sentence_lengths.sum()), p=p)
        cuts = np.cumsum(sentence_lengths)[:-1]
        path.write_text("".join(" ".join(s) + "\n" for s in np.split(words[ids], cuts)))

    for s in range(shards):
        write(train / f"news.en-{s + 1:05d}-of-00100", tokens // shards)
    write(heldout / "news.en.heldout-00000-of-00050", heldout_tokens or max(tokens // shards // 4, 1000))
    # The vocabulary: the special tokens and the `vocab_size` most frequent words (the rest are
    # out of it), most frequent first.
    vocab = list(SPECIAL_TOKENS) + list(words[: vocab_size - len(SPECIAL_TOKENS)])
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder


def open_batcher(corpus_dir: Path, groups: int, rows: int, unroll: int):
    from elmo_jax.text.batcher import StreamBatcher
    from elmo_jax.text.sources import open_corpus
    from elmo_jax.text.vocab import Vocabulary
    from elmo_jax.train.parallel import DataParallel

    parallel = DataParallel(groups)
    corpus = open_corpus(f"lm1b:{corpus_dir}", "train")
    vocab = Vocabulary.load(corpus_dir / "vocab.txt")
    batch_size = groups * rows
    batcher = StreamBatcher(
        corpus,
        vocab,
        batch_size,
        unroll,
        seed=0,
        rows=parallel.local_rows(batch_size),
        table_multiple=parallel.local_size,
        fixed_table=parallel.fixed_table,
        groups=groups,
        char_window=7,  # the original size's widest filter
        backward_order="independent",
    )
    return batcher, parallel


def first_batch(corpus_dir: Path, groups: int, rows: int, unroll: int) -> float:
    start = time.perf_counter()
    batcher, _ = open_batcher(corpus_dir, groups, rows, unroll)
    next(batcher)
    return time.perf_counter() - start


def steady(corpus_dir: Path, groups: int, rows: int, unroll: int, batches: int) -> float:
    """Tokens/s of batches on the devices, from the prefetcher alone."""
    import jax

    from elmo_jax.train.prefetch import Prefetcher

    batcher, parallel = open_batcher(corpus_dir, groups, rows, unroll)
    prefetch = Prefetcher(batcher, parallel.put_batch)
    try:
        for _ in range(5):
            batch, _ = next(prefetch)
        jax.block_until_ready(batch)
        start = time.perf_counter()
        for _ in range(batches):
            batch, _ = next(prefetch)
        jax.block_until_ready(batch)
        elapsed = time.perf_counter() - start
    finally:
        prefetch.close()
    return batches * groups * rows * unroll / elapsed


def input_bound(corpus_dir: Path, groups: int, rows: int, unroll: int, batches: int, step_ms: float) -> float:
    """The share of time a device taking `step_ms` a step would have had nothing to do, fed by
    this host (train's loop: one step in flight, the previous step's numbers read after the next
    dispatch; TrainWindow's input-bound figure)."""
    from benchmarks.common import StandInDevice
    from elmo_jax.train.metrics import TrainWindow
    from elmo_jax.train.prefetch import Prefetcher

    class Unwritten:
        def write(self, step, kind, values):
            self.values = values

    batcher, parallel = open_batcher(corpus_dir, groups, rows, unroll)
    prefetch, record = Prefetcher(batcher, parallel.put_batch), Unwritten()
    window, device = TrainWindow(record, batches, "sampled"), StandInDevice(step_ms / 1000)  # type: ignore[arg-type]
    try:
        for _ in range(10):  # lets the queue settle at the rate that holds
            next(prefetch)
        window.restart()
        pending = None
        for _ in range(batches):
            with window.waiting_for_input():
                next(prefetch)
            out = device.step()
            window.dispatched(out)
            if pending is not None:
                pending.block_until_ready()  # as the train loop reads the previous step's numbers
            pending = out
            window.add({"loss": 0.0, "loss_forward": 0.0, "loss_backward": 0.0, "grad_norm": 0.0, "tokens": 0})
        pending.block_until_ready()
        window.log(batches, 0.0)
    finally:
        window.close()
        prefetch.close()
    return record.values["input_bound"]


def main() -> None:
    from elmo_jax.host_memory import keep_freed_memory

    keep_freed_memory()  # as `train` does (elmo_jax/commands/process.py): freed memory reused, not faulted in again
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--vocab", type=int, default=793_471)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--shapes", default="1x128,1x512,8x128,8x512")
    parser.add_argument("--unroll", type=int, default=20)
    args = parser.parse_args()
    default = Path(tempfile.gettempdir()) / f"elmo_jax_host_path_{args.shards}_{args.tokens}_{args.vocab}"
    corpus_dir = make_corpus(args.corpus or default, args.shards, args.tokens, args.vocab)
    cache = corpus_dir / "token_cache"
    os.environ["ELMO_JAX_TOKEN_CACHE"] = str(cache)
    results = []
    for shape in args.shapes.split(","):
        groups, rows = map(int, shape.split("x"))
        shutil.rmtree(cache, ignore_errors=True)
        cold = first_batch(corpus_dir, groups, rows, args.unroll)
        warm = first_batch(corpus_dir, groups, rows, args.unroll)
        rate = steady(corpus_dir, groups, rows, args.unroll, args.batches)
        ms = STAND_IN_MS.get((groups, rows), 10.0)
        share = input_bound(corpus_dir, groups, rows, args.unroll, args.batches, ms)
        print(
            f"{groups} x {rows} rows: first batch {cold:.1f} s cold, {warm:.1f} s warm; steady {rate:,.0f} tokens/s; "
            f"input-bound {100 * share:.1f}% against a {ms} ms step",
            flush=True,
        )
        results.append(
            {"groups": groups, "rows": rows, "first_batch_cold_s": cold, "first_batch_warm_s": warm}
            | {"tokens_per_sec": rate, "stand_in_ms": ms, "input_bound": share}
        )
    print(json.dumps({"cpus": os.cpu_count(), "tokens": args.tokens, "vocab": args.vocab, "results": results}))


if __name__ == "__main__":
    main()
