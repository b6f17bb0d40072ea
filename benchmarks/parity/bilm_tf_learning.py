"""Learning side by side with the original bilm-tf training code: the same text, sizes,
vocabulary and number of batches, several seeds each, held-out perplexity of every side.

    bash $SHARED/tools/bilm_tf/setup_bilmtf.sh       # once: /tmp/bilmvenv, /tmp/bilm-work
    python -m benchmarks.parity.bilm_tf_learning --out=runs/fortunes \\
        --train=$SHARED/data/fortunes/train.txt --heldout=$SHARED/data/fortunes/heldout.txt \\
        --epochs=4 [--seeds=0,1,2] [--dropout=0.1] [--sides=bilm_tf,elmo_jax,elmo_jax_shared]
    python -m benchmarks.parity.bilm_tf_learning --out=runs/demo20k --sentences=20000 --epochs=4

The text is --train / --heldout (one whitespace-tokenized sentence a line) or, without them,
the built-in demo corpus written out as files (its first --sentences training sentences, all
5,000 held-out ones). The vocabulary is built from the training file (`launch.py vocab`, the
same order as bilm-tf's make_vocab.py). The sides (SIDES): bilm-tf trains with
`bilm_tf_train_eval.py` (the cpu_peer sizes, the original recipe with --dropout, --epochs of its
"epochs" of int(words / (32 x 20)) batches) and evaluates as its `run_test.py`; elmo_jax trains
`experiments/cpu_peer.py` for the same number of batches in either backward order. Both sides'
models are compared as `launch.py eval` scores them, on every held-out position: bilm-tf's last
checkpoint is read into our params (tests/bilm_tf_fixture.py's variable names) and evaluated
here. bilm-tf's own test stops when its first row runs out of sentences, so it leaves out the
rest of the other rows' last sentences (about 8% of fortunes' positions), and long sentences are
the likeliest to be cut: its own number is also reported, and on fortunes it is about 3% lower
than the same model scored on every position. Prints markdown tables and writes
OUT/results.json (runs already there are not run again: one OUT per text and length, several
dropout rates, seeds and sides in it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT
from elmo_jax import experiment
from elmo_jax.text.demo_corpus import DemoCorpus
from elmo_jax.text.sources import open_corpus
from elmo_jax.text.vocab import Vocabulary
from elmo_jax.train.evaluate import evaluate
from experiments import cpu_peer
from tests.bilm_tf_fixture import params_from_tf

ROWS, UNROLL = 32, 20  # experiments/cpu_peer.py on one device, as bilm_tf_train_eval.py
# side -> what it runs: bilm-tf's --backward-order, or ours' config.data.backward_order
SIDES = {
    "bilm_tf": ("bilm-tf", "independent"),  # as published
    "bilm_tf_same": ("bilm-tf", "same"),  # both directions shuffled alike (not bilm-tf)
    "elmo_jax": ("elmo_jax", "independent"),
    "elmo_jax_shared": ("elmo_jax", "shared"),
}


# In bilm-tf's venv: the lm/ variables of the checkpoint argv[1] into the npz argv[2] ("/" -> "|").
DUMP_CHECKPOINT = """
import sys, numpy as np, tensorflow as tf
reader = tf.train.load_checkpoint(sys.argv[1])
names = [n for n in reader.get_variable_to_shape_map() if n.startswith("lm/") and "Adagrad" not in n]
np.savez(sys.argv[2], **{n.replace("/", "|"): reader.get_tensor(n) for n in names})
"""


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


def last_json(command: list[str], log: Path, env: dict | None = None) -> dict:
    """Runs `command` (`env` added to the environment), its output into `log`; its last stdout
    line parsed as JSON."""
    shown = " ".join("<program>" if "\n" in part else part for part in command)  # `python -c` sources
    print("$", shown, flush=True)
    with open(log, "w") as f:
        done = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=f, text=True, cwd=ROOT, env={**os.environ, **(env or {})}
        )
    lines = done.stdout.strip().splitlines()
    log.with_suffix(".stdout").write_text(done.stdout)
    if done.returncode != 0 or not lines:
        sys.exit(f"failed ({done.returncode}): {shown}; see {log}")
    return json.loads(lines[-1])


def bilm_tf_flags(
    train: Path, heldout: Path, vocab: Path, epochs: int, folder: Path, seed: int, dropout: float, order: str
):
    """bilm_tf_train_eval.py's flags for one run; `order` is its --backward-order."""
    return [
        *(f"--train={train}", f"--heldout={heldout}", f"--vocab={vocab}", f"--epochs={epochs}"),
        *(f"--out={folder}", f"--seed={seed}", f"--dropout={dropout}", f"--backward-order={order}"),
    ]


def elmo_jax_command(
    train: Path,
    heldout: Path,
    vocab: Path,
    epochs: int,
    workdir: Path,
    seed: int,
    dropout: float,
    order: str,
    steps: int,
):
    """Our training of one run: experiments/cpu_peer.py for `steps` batches on one device, held
    out at the end only; `order` is config.data.backward_order."""
    return [
        *(sys.executable, "launch.py", "train", "--config=experiments/cpu_peer.py", f"--workdir={workdir}"),
        *(f"--config.data.train=text:{train}", f"--config.data.heldout=text:{heldout}"),
        *(f"--config.data.vocab={vocab}", f"--config.data.backward_order={order}"),
        *(f"--config.train.max_steps={steps}", f"--config.train.n_epochs={epochs + 1}"),
        *(f"--config.train.seed={seed}", f"--config.train.dropout={dropout}"),
        *("--config.train.eval_every=0", "--config.train.devices=1"),
    ]


def every_position(args, folder: Path, steps: int, vocab: Path, heldout: Path) -> dict:
    """The model of the bilm-tf run in `folder` (its checkpoint of step `steps`) scored by our
    evaluator on every held-out position."""
    variables = folder / "variables.npz"
    checkpoint = folder / "checkpoints" / f"model.ckpt-{steps}"
    subprocess.run([args.bilm_python, "-c", DUMP_CHECKPOINT, str(checkpoint), str(variables)], check=True)
    config = experiment.model_config(cpu_peer.get_config())
    tf_variables = {k.replace("|", "/"): v for k, v in np.load(variables).items()}
    params = params_from_tf(tf_variables, config, 0.0)
    corpus = open_corpus(f"text:{heldout}", "heldout")
    return evaluate(params, corpus, Vocabulary.load(vocab), config, batch_size=64, unroll_steps=UNROLL)


def run_side(side: str, args, train: Path, heldout: Path, vocab: Path, seed: int, steps: int) -> dict:
    program, order = SIDES[side]
    name = f"{side}_dropout{args.dropout}_seed{seed}"
    folder, log = args.out / side / f"dropout{args.dropout}_seed{seed}", args.out / f"{name}.log"
    run = (train, heldout, vocab, args.epochs, folder, seed, args.dropout, order)
    if program == "bilm-tf":
        command = [args.bilm_python, str(Path(args.bilm_tools) / "bilm_tf_train_eval.py"), *bilm_tf_flags(*run)]
        result = last_json(command, log)
        if result["steps"] != steps:
            sys.exit(f"{name}: bilm-tf ran {result['steps']} steps, expected {steps}")
        return result
    return {**last_json(elmo_jax_command(*run, steps), log), "steps": steps}


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
    parser.add_argument("--bilm_python", default="/tmp/bilmvenv/bin/python")
    parser.add_argument("--bilm_tools", default=str(ROOT.parent / "shared" / "tools" / "bilm_tf"))
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
            if SIDES[side][0] == "bilm-tf" and "every_position" not in row[side]:
                folder = args.out / side / f"dropout{args.dropout}_seed{seed}"
                row[side]["every_position"] = every_position(args, folder, steps, vocab, heldout)
            results_path.write_text(json.dumps(results, indent=1) + "\n")
    report(results)


def scored(run: dict) -> dict:
    """A run's held-out result on every position (bilm-tf's model as our evaluator scores it)."""
    return run.get("every_position", run)


def report(results: dict) -> None:
    """Per run: each side's perplexity on every held-out position (forward / backward; for
    bilm-tf also its own test's number); per dropout rate: each side's mean (range) and its ratio
    to bilm-tf's mean."""
    sides = [s for s in SIDES if any(s in row for row in results.values())]
    print("| run | " + " | ".join(sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for key, row in results.items():
        cells = []
        for side in sides:
            if side not in row:
                cells.append("-")
                continue
            r = scored(row[side])
            cell = f"{r['perplexity']:.2f} ({r['forward_perplexity']:.2f} / {r['backward_perplexity']:.2f})"
            if "every_position" in row[side]:
                cell += f"; own test {row[side]['perplexity']:.2f}"
            cells.append(cell)
        print(f"| {key} | " + " | ".join(cells) + " |")
    print()
    print("| dropout | " + " | ".join(f"{side}: mean (range), / bilm_tf" for side in sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for setting in dict.fromkeys(key.split(" seed=")[0] for key in results):
        rows = [row for key, row in results.items() if key.startswith(setting + " ")]
        means = {}
        cells = []
        for side in sides:
            values = [scored(row[side])["perplexity"] for row in rows if side in row]
            if not values:
                cells.append("-")
                continue
            means[side] = statistics.mean(values)
            ratio = f", {means[side] / means['bilm_tf']:.3f}" if "bilm_tf" in means else ""
            cells.append(f"{means[side]:.2f} ({min(values):.2f} - {max(values):.2f}, n={len(values)}){ratio}")
        print(f"| {setting.split('=')[1]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
