"""Input pipeline throughput alone: the StreamBatcher (word ids, char-table rows, the batch's
distinct words) on one CPU core, without any device work.

    python -m benchmarks.speed.input_pipeline [--batch=128] [--unroll=20] [--vocab=100000] [--batches=200]

Feeds it a synthetic Zipfian corpus (the same as benchmarks/speed/throughput.py) and prints tokens/s
(a token = one position of one row) and ms per batch; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.common import synthetic_corpus
from elmo_jax.text.batcher import StreamBatcher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    corpus, vocab = synthetic_corpus(args.vocab, 50_000)
    batcher = StreamBatcher(corpus, vocab, args.batch, args.unroll, seed=0)
    for _ in range(10):  # warm the character cache
        next(batcher)
    start = time.perf_counter()
    for _ in range(args.batches):
        next(batcher)
    elapsed = time.perf_counter() - start
    tokens_per_sec = args.batches * args.batch * args.unroll / elapsed
    print(
        f"StreamBatcher {args.batch} x {args.unroll}, vocabulary {args.vocab:,}: {tokens_per_sec:,.0f} tokens/s, "
        f"{1000 * elapsed / args.batches:.2f} ms per batch (one core)"
    )
    print(
        json.dumps(
            {
                "batch": args.batch,
                "unroll": args.unroll,
                "vocab": args.vocab,
                "tokens_per_sec": tokens_per_sec,
                "ms_per_batch": 1000 * elapsed / args.batches,
            }
        )
    )


if __name__ == "__main__":
    main()
