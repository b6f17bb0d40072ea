"""Learning side by side with the original bilm-tf training code: the same text, sizes,
vocabulary and number of batches, several seeds each, held-out perplexity of every side.

    bash ../shared/tools/bilm_tf/setup_bilmtf.sh       # once: /tmp/bilmvenv, /tmp/bilm-work
    python benchmarks/bilm_tf_learning.py --out=runs/fortunes \\
        --train=../shared/data/fortunes/train.txt --heldout=../shared/data/fortunes/heldout.txt \\
        --epochs=4 [--seeds=0,1,2] [--dropout=0.1] [--sides=bilm_tf,elmo_jax,elmo_jax_shared]
    python benchmarks/bilm_tf_learning.py --out=runs/demo20k --sentences=20000 --epochs=4

The text is --train / --heldout (one whitespace-tokenized sentence a line) or, without them,
the built-in demo corpus written out as files (its first --sentences training sentences, all
5,000 held-out ones). The vocabulary is built from the training file (`launch.py vocab`, the
same order as bilm-tf's make_vocab.py). The sides (SIDES): bilm-tf trains with
`bilm_tf_train_eval.py` (the cpu_peer sizes, the original recipe with --dropout, --epochs of its
"epochs" of int(words / (32 x 20)) batches) and evaluates as its `run_test.py` (it stops when
its first row runs out, so it scores slightly fewer positions); elmo_jax trains
`experiments/cpu_peer.py` for the same number of batches in either backward order and
evaluates every held-out position, as `launch.py eval` does. Prints markdown tables and writes
OUT/results.json (runs already there are not run again: one OUT per text and length, several
dropout rates, seeds and sides in it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from elmo_jax.text.demo_corpus import DemoCorpus  # noqa: E402

ROWS, UNROLL = 32, 20  # experiments/cpu_peer.py on one device, as bilm_tf_train_eval.py
# side -> what it runs: bilm-tf's --backward-order, or ours' config.data.backward_order
SIDES = {
    "bilm_tf": ("bilm-tf", "independent"),  # as published
    "bilm_tf_same": ("bilm-tf", "same"),  # both directions shuffled alike (not bilm-tf)
    "elmo_jax": ("elmo_jax", "independent"),
    "elmo_jax_shared": ("elmo_jax", "shared"),
}


def demo_text(out: Path, n_train: int) -> tuple[Path, Path]:
    train, heldout = out / "train.txt", out / "heldout.txt"
    for path, corpus, n in ((train, DemoCorpus("train"), n_train), (heldout, DemoCorpus("heldout"), None)):
        if not path.is_file():
            n = len(corpus) if n is None else min(n, len(corpus))
            path.write_text("".join(" ".join(corpus[i]) + "\n" for i in range(n)))
    return train, heldout


def bilm_tf_steps(train: Path, epochs: int) -> int:
    """bilm-tf's run length: epochs x int(words / (rows x unroll)) batches."""
    with open(train, encoding="utf-8", errors="replace") as f:
        words = sum(len(line.split()) for line in f)
    return epochs * (words // (ROWS * UNROLL))


def last_json(command: list[str], log: Path) -> dict:
    """Runs `command`, its output into `log`; its last stdout line parsed as JSON."""
    print("$", " ".join(command), flush=True)
    with open(log, "w") as f:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=f, text=True, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    log.with_suffix(".stdout").write_text(done.stdout)
    if done.returncode != 0 or not lines:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}; see {log}")
    return json.loads(lines[-1])


def run_side(side: str, args, train: Path, heldout: Path, vocab: Path, seed: int, steps: int) -> dict:
    program, order = SIDES[side]
    name = f"{side}_dropout{args.dropout}_seed{seed}"
    folder, log = args.out / side / f"dropout{args.dropout}_seed{seed}", args.out / f"{name}.log"
    if program == "bilm-tf":
        command = [args.bilm_python, str(Path(args.bilm_tools) / "bilm_tf_train_eval.py")]
        command += [f"--train={train}", f"--heldout={heldout}", f"--vocab={vocab}", f"--epochs={args.epochs}"]
        command += [f"--out={folder}", f"--seed={seed}", f"--dropout={args.dropout}", f"--backward-order={order}"]
        result = last_json(command, log)
        if result["steps"] != steps:
            sys.exit(f"{name}: bilm-tf ran {result['steps']} steps, expected {steps}")
        return result
    command = [sys.executable, "launch.py", "train", "--config=experiments/cpu_peer.py", f"--workdir={folder}"]
    command += [f"--config.data.train=text:{train}", f"--config.data.heldout=text:{heldout}"]
    command += [f"--config.data.vocab={vocab}", f"--config.data.backward_order={order}"]
    command += [f"--config.train.max_steps={steps}", f"--config.train.n_epochs={args.epochs + 1}"]
    command += [f"--config.train.seed={seed}", f"--config.train.dropout={args.dropout}"]
    command += ["--config.train.eval_every=0", "--config.train.devices=1"]
    return {**last_json(command, log), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--train", help="training text (default: the demo corpus's first --sentences)")
    parser.add_argument("--heldout", help="held-out text (with --train)")
    parser.add_argument("--sentences", type=int, default=200_000, help="training sentences of the demo corpus")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=1, help="bilm-tf epochs (ours: the same number of batches)")
    parser.add_argument("--sides", default="bilm_tf,elmo_jax,elmo_jax_shared", help=f"some of {', '.join(SIDES)}")
    parser.add_argument("--bilm-python", default="/tmp/bilmvenv/bin/python")
    parser.add_argument("--bilm-tools", default=str(ROOT.parent / "shared" / "tools" / "bilm_tf"))
    args = parser.parse_args()
    sides = args.sides.split(",")
    if unknown := set(sides) - set(SIDES):
        parser.error(f"--sides: unknown {sorted(unknown)}; choose from {', '.join(SIDES)}")
    if (args.train is None) != (args.heldout is None):
        parser.error("--train and --heldout go together")
    args.out = Path(args.out).absolute()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.train:
        train, heldout = Path(args.train).absolute(), Path(args.heldout).absolute()
    else:
        train, heldout = demo_text(args.out, args.sentences)
    vocab = args.out / "vocab.txt"
    if not vocab.is_file():
        last_json(
            [sys.executable, "launch.py", "vocab", f"--data=text:{train}", f"--output={vocab}"], args.out / "vocab.log"
        )
    steps = bilm_tf_steps(train, args.epochs)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for seed in map(int, args.seeds.split(",")):
        row = results.setdefault(f"dropout={args.dropout} seed={seed}", {})
        for side in sides:
            if side not in row:
                row[side] = run_side(side, args, train, heldout, vocab, seed, steps)
                results_path.write_text(json.dumps(results, indent=1) + "\n")
    report(results)


def report(results: dict) -> None:
    """Per run: each side's perplexity (forward / backward); per dropout rate: each side's mean
    (range) and its ratio to bilm-tf's mean."""
    sides = [s for s in SIDES if any(s in row for row in results.values())]
    print("| run | " + " | ".join(sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for key, row in results.items():
        cells = [
            f"{r['perplexity']:.2f} ({r['forward_perplexity']:.2f} / {r['backward_perplexity']:.2f})" if r else "-"
            for r in (row.get(side) for side in sides)
        ]
        print(f"| {key} | " + " | ".join(cells) + " |")
    print()
    print("| dropout | " + " | ".join(f"{side}: mean (range), / bilm_tf" for side in sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for setting in dict.fromkeys(key.split(" seed=")[0] for key in results):
        rows = [row for key, row in results.items() if key.startswith(setting + " ")]
        means = {}
        cells = []
        for side in sides:
            values = [row[side]["perplexity"] for row in rows if side in row]
            if not values:
                cells.append("-")
                continue
            means[side] = statistics.mean(values)
            ratio = f", {means[side] / means['bilm_tf']:.3f}" if "bilm_tf" in means else ""
            cells.append(f"{means[side]:.2f} ({min(values):.2f} - {max(values):.2f}, n={len(values)}){ratio}")
        print(f"| {setting.split('=')[1]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
