"""Peak host memory of `launch.py embed` on a training workdir with a large vocabulary: what
restoring a checkpoint for inference costs.

    python -m benchmarks.speed.embed_memory [--config=elmo_original] [--vocab=100000] [--checkout=DIR ...] [--repeats=2]

Trains one step of the given size on a synthetic text whose vocabulary has `--vocab` words (so
the checkpoint holds the softmax table and its Adagrad accumulators, V x P each), then runs
`launch.py embed` of 100 sentences on it, once per checkout (default: this one; pass an older
`git worktree` to compare), as a child process, and reports each one's peak resident memory
(ru_maxrss). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT


def write_corpus(path: Path, vocab: int, sentences: int = 2_000, seed: int = 0) -> None:
    """Sentences of 10-30 words in which every one of `vocab` words appears at least once."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    order = rng.permutation(vocab)
    lines, used = [], 0
    while used < vocab or len(lines) < sentences:
        n = int(rng.integers(10, 31))
        if used < vocab:
            ids, used = order[used : used + n], used + n
        else:
            ids = rng.integers(0, vocab, n)
        lines.append(" ".join(words[i] for i in ids))
    path.write_text("\n".join(lines) + "\n")


def peak_rss_mb(command: list[str], cwd: Path) -> float:
    """Runs `command` to completion; its own peak resident set in MB (os.wait4's rusage)."""
    child = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    return usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="elmo_original", help="experiments/NAME.py")
    parser.add_argument("--vocab", type=int, default=100_000)
    parser.add_argument("--checkout", action="append", help="an elmo_jax tree whose launch.py embeds (repeatable)")
    parser.add_argument("--repeats", type=int, default=2, help="embed runs per checkout, alternating")
    args = parser.parse_args()
    checkouts = args.checkout or [str(ROOT)]
    tmp = Path(tempfile.mkdtemp(prefix="embed_memory_"))
    workdir, text = tmp / "run", tmp / "train.txt"
    write_corpus(text, args.vocab)
    train = [
        sys.executable,
        "launch.py",
        "train",
        f"--config=experiments/{args.config}.py",
        f"--workdir={workdir}",
        f"--config.data.train=text:{text}",
        "--config.data.heldout=",
        "--config.data.min_count=1",
        "--config.train.per_device_batch_size=2",
        "--config.train.unroll_steps=4",
        "--config.train.max_steps=1",
    ]
    done = subprocess.run(train, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"training the workdir failed:\n{done.stderr[-3000:]}")
    checkpoint_mb = sum(f.stat().st_size for f in (workdir / "checkpoints").rglob("*") if f.is_file()) / 2**20
    sentences = tmp / "sentences.txt"
    sentences.write_text("\n".join(text.read_text().splitlines()[:100]) + "\n")
    embed = [
        sys.executable,
        "launch.py",
        "embed",
        f"--workdir={workdir}",
        f"--input={sentences}",
        f"--output={tmp / 'out.hdf5'}",
        "--layers=top",
        "--overwrite",
        "--nocompile_cache",
    ]
    peaks = {c: [] for c in checkouts}
    for _ in range(args.repeats):
        for checkout in checkouts:
            peaks[checkout].append(peak_rss_mb(embed, Path(checkout)))
    print(f"{args.config} workdir, {args.vocab:,} words, checkpoint {checkpoint_mb:,.0f} MB on disk")
    for checkout, mb in peaks.items():
        print(f"  launch.py embed of {checkout}: peak RSS {', '.join(f'{m:,.0f}' for m in mb)} MB")
    result = {"config": args.config, "vocab": args.vocab, "checkpoint_mb": checkpoint_mb, "peak_rss_mb": peaks}
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
