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
markdown tables (per run; per setting: median and range over seeds), writes OUT/results.json
(runs already there are not run again) and OUT/batch_size.png (held-out perplexity against
training tokens, the median of each setting's seeds).
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
    report(results)
    plot(results, args.out / "batch_size.png")


def settings_of(results: dict) -> dict[str, list[dict]]:
    """Results by setting (ROWS:RULE[:wN]), seeds together, in the order first run."""
    by_setting: dict[str, list[dict]] = {}
    for key, result in results.items():
        by_setting.setdefault(key.split(" seed=")[0], []).append(result)
    return by_setting


def report(results: dict) -> None:
    print("| rows:rule | seed | tokens | forward | backward | average |")
    print("|---|---|---|---|---|---|")
    for key, r in results.items():
        spec, seed = key.split(" seed=")
        print(
            f"| {spec} | {seed} | {r['train_tokens']:,} | {r['forward_perplexity']:.1f} | "
            f"{r['backward_perplexity']:.1f} | {r['perplexity']:.1f} |"
        )
    print()
    print("| rows:rule | seeds | forward median (range) | backward median (range) | average median (range) |")
    print("|---|---|---|---|---|")
    for spec, runs in settings_of(results).items():
        cells = []
        for field in ("forward_perplexity", "backward_perplexity", "perplexity"):
            values = [r[field] for r in runs]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f} - {max(values):.1f})")
        print(f"| {spec} | {len(runs)} | " + " | ".join(cells) + " |")


def plot(results: dict, output: Path) -> None:
    """Each setting's median held-out perplexity (average of both LMs) against training tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for spec, runs in settings_of(results).items():
        n = min(len(r["curve"]) for r in runs)
        tokens = [runs[0]["curve"][i][0] for i in range(n)]
        for ax, column, title in ((axes[0], 1, "forward LM"), (axes[1], 2, "backward LM")):
            median = [statistics.median(r["curve"][i][column] for r in runs) for i in range(n)]
            ax.plot(tokens, median, marker=".", label=f"{spec} (n={len(runs)})")
            ax.set_title(f"held-out perplexity, {title} (median over seeds)")
    for ax in axes:
        ax.set_xlabel("training tokens")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    print(f"curves: {output}")


if __name__ == "__main__":
    main()
