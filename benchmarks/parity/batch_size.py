"""Does a bigger batch learn as well per token? The same text and the same number of tokens at
several global batches and learning-rate rules, several seeds each; held-out perplexity (full
softmax, every position, forward and backward) along the way and at the end.

    python -m benchmarks.parity.batch_size --out=runs/batch_size \\
        --train=$SHARED/data/fortunes/train.txt --heldout=$SHARED/data/fortunes/heldout.txt \\
        --epochs=4 --seeds=0,1,2 --runs=32:none,128:none,128:sqrt,128:linear,512:none,512:sqrt

Each run is `launch.py train --config=experiments/cpu_peer.py` on one device at ROWS rows a step
(--runs: ROWS:RULE[:wWARMUP], RULE one of none / sqrt / linear, the train setting
lr_batch_scaling with lr_reference_batch = --reference rows, the recipe's batch in this study),
learning rate --lr, --epochs passes over the text, evaluated on the whole held-out text every
--eval_tokens training tokens (so at the same tokens for every batch) and at the end. Prints
markdown tables (per run; per setting: median and range over seeds, and how many LMs came apart,
a full softmax worse than a uniform guess, with the median of the others), writes
OUT/results.json (runs already there are not run again) and OUT/batch_size.png (held-out
perplexity against training tokens, the median of each setting's LMs, and the share come apart).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.parity.bilm_tf_learning import last_json
from elmo_jax.curves import read_metrics

UNROLL = 20  # experiments/cpu_peer.py's window


def parse_run(spec: str) -> tuple[int, str, int]:
    """ "512:sqrt:w50" -> (rows 512, rule "sqrt", warm-up 50 steps)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and not parts[2].startswith("w")):
        raise ValueError(f"--runs: {spec!r} is not ROWS:RULE[:wWARMUP]")
    return int(parts[0]), parts[1], int(parts[2][1:]) if len(parts) == 3 else 0


def train_command(args, vocab: Path, workdir: Path, rows: int, rule: str, warmup: int, seed: int) -> list[str]:
    return [
        *(sys.executable, "launch.py", "train", "--config=experiments/cpu_peer.py", f"--workdir={workdir}"),
        *(f"--config.data.train=text:{args.train}", f"--config.data.heldout=text:{args.heldout}"),
        *(f"--config.data.vocab={vocab}", f"--config.train.per_device_batch_size={rows}"),
        *(f"--config.train.learning_rate={args.lr}", f"--config.train.lr_batch_scaling={rule}"),
        *(f"--config.train.lr_reference_batch={args.reference}", f"--config.train.warmup_steps={warmup}"),
        *(f"--config.train.n_epochs={args.epochs}", f"--config.train.seed={seed}"),
        *(
            f"--config.train.eval_every={max(1, args.eval_tokens // (rows * UNROLL))}",
            "--config.train.eval_sentences=0",
        ),
        *("--config.train.devices=1", f"--config.train.log_every={max(1, 12_800 // rows)}"),
        "--config.train.checkpoint_every=100000",
    ]


def run(args, vocab: Path, spec: str, seed: int) -> dict:
    """One training run -> its final held-out result and its held-out curve [(tokens, fwd, bwd, avg)]."""
    rows, rule, warmup = parse_run(spec)
    name = f"{spec.replace(':', '_')}_seed{seed}"
    workdir = args.out / name
    command = train_command(args, vocab, workdir, rows, rule, warmup, seed)
    print("$", " ".join(command), flush=True)
    with open(args.out / f"{name}.log", "w") as log:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=os.environ)
    if done.returncode == 0:
        final = json.loads(done.stdout.strip().splitlines()[-1])
    else:  # diverged (the run's divergence check stopped it) or failed: the log says which
        print(f"failed ({done.returncode}): see {args.out / name}.log", flush=True)
        final = {"forward_perplexity": math.inf, "backward_perplexity": math.inf, "perplexity": math.inf}
        final["failed"] = open(args.out / f"{name}.log").read().strip().splitlines()[-1][:300]
    metrics = read_metrics(workdir / "metrics.jsonl")
    curve = [
        (r["step"] * rows * UNROLL, r["forward_perplexity"], r["backward_perplexity"], r["perplexity"])
        for r in metrics["eval"]
    ]
    steps = max((r["step"] for r in metrics["train"] + metrics["eval"]), default=0)
    return {**final, "steps": steps, "train_tokens": steps * rows * UNROLL, "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--train", required=True, help="training text, one whitespace-tokenized sentence a line")
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--runs", default="32:none,128:none,128:sqrt,128:linear,512:none,512:sqrt,512:linear")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=float, default=4.0)
    parser.add_argument("--lr", type=float, default=0.2, help="the learning rate at --reference rows")
    parser.add_argument("--reference", type=int, default=32, help="the recipe's rows in this study")
    parser.add_argument("--eval_tokens", type=int, default=163_840, help="training tokens between evaluations")
    args = parser.parse_args()
    for spec in args.runs.split(","):
        parse_run(spec)
    args.out = Path(args.out).absolute()
    args.out.mkdir(parents=True, exist_ok=True)
    args.train, args.heldout = Path(args.train).absolute(), Path(args.heldout).absolute()
    vocab = args.out / "vocab.txt"
    if not vocab.is_file():
        last_json(
            [sys.executable, "launch.py", "vocab", f"--data=text:{args.train}", f"--output={vocab}"],
            args.out / "vocab.log",
        )
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for seed in map(int, args.seeds.split(",")):
        for spec in args.runs.split(","):
            key = f"{spec} seed={seed}"
            if key not in results:
                results[key] = run(args, vocab, spec, seed)
                results_path.write_text(json.dumps(results, indent=1) + "\n")
    vocab_size = len(vocab.read_text().splitlines())
    report(results, vocab_size)
    plot(results, vocab_size, args.out / "batch_size.png")


def settings_of(results: dict) -> dict[str, list[dict]]:
    """Results by setting (ROWS:RULE[:wN]), seeds together, in the order first run."""
    by_setting: dict[str, list[dict]] = {}
    for key, result in results.items():
        by_setting.setdefault(key.split(" seed=")[0], []).append(result)
    return by_setting


def lms(runs: list[dict], at: int | None = None) -> list[float]:
    """The held-out perplexities of every LM (forward and backward of each seed): at the end, or
    at the `at`-th evaluation of each run."""
    if at is None:
        return [r[f] for r in runs for f in ("forward_perplexity", "backward_perplexity")]
    return [r["curve"][at][column] for r in runs for column in (1, 2)]


def came_apart(perplexity: float, vocab_size: int) -> bool:
    """Worse than a uniform guess over the vocabulary (or not finite): a full softmax that has come
    apart (docs/BILM_TF_COMPARISON.md), not a slow learner."""
    return not perplexity < vocab_size


def report(results: dict, vocab_size: int) -> None:
    print("| rows:rule | seed | tokens | forward | backward | average |")
    print("|---|---|---|---|---|---|")
    for key, r in results.items():
        spec, seed = key.split(" seed=")
        print(
            f"| {spec} | {seed} | {r['train_tokens']:,} | {r['forward_perplexity']:,.1f} | "
            f"{r['backward_perplexity']:,.1f} | {r['perplexity']:,.1f} |"
        )
    print()
    print(
        "| rows:rule | seeds | forward median (range) | backward median (range) | average median | LMs come apart "
        "| the others: median (range) |"
    )
    print("|---|---|---|---|---|---|---|")
    for spec, runs in settings_of(results).items():
        cells = []
        for field in ("forward_perplexity", "backward_perplexity"):
            values = [r[field] for r in runs]
            cells.append(f"{statistics.median(values):,.1f} ({min(values):,.1f} - {max(values):,.1f})")
        cells.append(f"{statistics.median(r['perplexity'] for r in runs):,.1f}")
        every = lms(runs)
        sound = [v for v in every if not came_apart(v, vocab_size)]
        cells.append(f"{len(every) - len(sound)} of {len(every)}")
        cells.append(f"{statistics.median(sound):.1f} ({min(sound):.1f} - {max(sound):.1f})" if sound else "-")
        print(f"| {spec} | {len(runs)} | " + " | ".join(cells) + " |")


def plot(results: dict, vocab_size: int, output: Path) -> None:
    """Per setting, against training tokens: the median held-out perplexity of its LMs (both
    directions of every seed), and the share of them that have come apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for spec, runs in settings_of(results).items():
        n = min(len(r["curve"]) for r in runs)
        if n == 0:
            continue
        tokens = [runs[0]["curve"][i][0] for i in range(n)]
        median = [statistics.median(lms(runs, i)) for i in range(n)]
        apart = [sum(came_apart(v, vocab_size) for v in lms(runs, i)) / (2 * len(runs)) for i in range(n)]
        (line,) = left.plot(tokens, median, marker=".", label=f"{spec} ({len(runs)} seeds)")
        right.plot(tokens, apart, marker=".", color=line.get_color(), label=spec)
    left.set_title("held-out perplexity (full softmax): median of forward and backward LMs over seeds")
    left.set_yscale("log")
    right.set_title(f"share of LMs come apart (perplexity > {vocab_size:,}, the vocabulary)")
    right.set_ylim(-0.02, 1.02)
    for ax in (left, right):
        ax.set_xlabel("training tokens")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    print(f"curves: {output}")


if __name__ == "__main__":
    main()
