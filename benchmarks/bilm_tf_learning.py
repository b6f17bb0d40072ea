"""Learning side by side with the original bilm-tf training code: the same text, sizes,
vocabulary and number of batches, several seeds each, held-out perplexity of both.

    bash ../shared/tools/bilm_tf/setup_bilmtf.sh       # once: /tmp/bilmvenv, /tmp/bilm-work
    python benchmarks/bilm_tf_learning.py --out=runs/bilm_tf_learning [--seeds=0,1,2] \\
        [--sentences=200000] [--epochs=1] [--dropout=0.1]

The text is the built-in demo corpus written out as files (its first --sentences training
sentences, all 5,000 held-out ones); the vocabulary is built from the training file (`launch.py
vocab`, the same order as bilm-tf's make_vocab.py). bilm-tf trains with
`bilm_tf_train_eval.py` (the cpu_peer sizes, the original recipe with --dropout, --epochs of its
"epochs" of int(words / (32 x 20)) batches) and evaluates as its `run_test.py`; elmo_jax trains
`experiments/cpu_peer.py` for the same number of batches and evaluates at the end of training
as `launch.py eval` does (every held-out position; bilm-tf's test stops when its first row runs
out, so it scores slightly fewer). Prints a markdown table and writes OUT/results.json (runs already there
are not run again: one OUT per text and length, several dropout rates and seeds in it).
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

# bilm_tf_train_eval.py with its options' dropout (0.1, the recipe's) replaced by argv[2].
BILM_TF_WITH_DROPOUT = """
import sys
sys.path.insert(0, sys.argv[1])
import bilm_tf_train_eval as peer
options, dropout = peer.cpu_peer_options, float(sys.argv[2])
peer.cpu_peer_options = lambda *args: {**options(*args), "dropout": dropout}
sys.argv = [peer.__file__] + sys.argv[3:]
peer.main()
"""


def write_text(out: Path, n_train: int) -> tuple[Path, Path]:
    train, heldout = out / "train.txt", out / "heldout.txt"
    for path, corpus, n in ((train, DemoCorpus("train"), n_train), (heldout, DemoCorpus("heldout"), None)):
        if not path.is_file():
            n = len(corpus) if n is None else min(n, len(corpus))
            path.write_text("".join(" ".join(corpus[i]) + "\n" for i in range(n)))
    return train, heldout


def last_json(command: list[str], log: Path) -> dict:
    """Runs `command`, its output into `log`; its last stdout line parsed as JSON."""
    shown = " ".join("<BILM_TF_WITH_DROPOUT>" if part == BILM_TF_WITH_DROPOUT else part for part in command)
    print("$", shown, flush=True)
    with open(log, "w") as f:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=f, text=True, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    log.with_suffix(".stdout").write_text(done.stdout)
    if done.returncode != 0 or not lines:
        sys.exit(f"failed ({done.returncode}): {shown}; see {log}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--sentences", type=int, default=200_000, help="training sentences of the demo corpus")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=1, help="bilm-tf epochs (ours: the same number of batches)")
    parser.add_argument("--bilm-python", default="/tmp/bilmvenv/bin/python")
    parser.add_argument("--bilm-tools", default=str(ROOT.parent / "shared" / "tools" / "bilm_tf"))
    parser.add_argument("--sides", default="bilm_tf,elmo_jax")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = write_text(out, args.sentences)
    vocab = out / "vocab.txt"
    if not vocab.is_file():
        vocab_command = [sys.executable, "launch.py", "vocab", f"--data=text:{train}", f"--output={vocab}"]
        last_json(vocab_command, out / "vocab.log")
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    sides = args.sides.split(",")
    for seed in map(int, args.seeds.split(",")):
        key = f"dropout={args.dropout} seed={seed}"
        row = results.setdefault(key, {})
        if "bilm_tf" in sides and "bilm_tf" not in row:
            run = out / "bilm_tf" / f"dropout{args.dropout}_seed{seed}"
            row["bilm_tf"] = last_json(
                [
                    args.bilm_python,
                    "-c",
                    BILM_TF_WITH_DROPOUT,
                    args.bilm_tools,
                    str(args.dropout),
                    f"--train={train}",
                    f"--heldout={heldout}",
                    f"--vocab={vocab}",
                    f"--epochs={args.epochs}",
                    f"--out={run}",
                    f"--seed={seed}",
                ],
                out / f"bilm_tf_dropout{args.dropout}_seed{seed}.log",
            )
        if "elmo_jax" in sides and "elmo_jax" not in row:
            steps = row.get("bilm_tf", {}).get("steps")
            if steps is None:
                sys.exit(f"{key}: run the bilm_tf side first (its step count sets ours)")
            workdir = out / "elmo_jax" / f"dropout{args.dropout}_seed{seed}"
            trained = last_json(
                [
                    sys.executable,
                    "launch.py",
                    "train",
                    "--config=experiments/cpu_peer.py",
                    f"--workdir={workdir}",
                    f"--config.data.train=text:{train}",
                    f"--config.data.heldout=text:{heldout}",
                    f"--config.data.vocab={vocab}",
                    f"--config.train.max_steps={steps}",
                    f"--config.train.n_epochs={args.epochs + 1}",
                    f"--config.train.seed={seed}",
                    f"--config.train.dropout={args.dropout}",
                    "--config.train.eval_every=0",
                    "--config.train.devices=1",
                ],
                out / f"elmo_jax_dropout{args.dropout}_seed{seed}.log",
            )
            row["elmo_jax"] = {**trained, "steps": steps}
        results_path.write_text(json.dumps(results, indent=1) + "\n")
    report(results)


def report(results: dict) -> None:
    print("| run | bilm-tf perplexity (fwd / bwd) | elmo_jax perplexity (fwd / bwd) | ratio |")
    print("|---|---|---|---|")
    for key, row in results.items():
        cells = []
        for side in ("bilm_tf", "elmo_jax"):
            r = row.get(side)
            cells.append(
                f"{r['perplexity']:.2f} ({r['forward_perplexity']:.2f} / {r['backward_perplexity']:.2f})" if r else "-"
            )
        ratio = row["elmo_jax"]["perplexity"] / row["bilm_tf"]["perplexity"] if len(row) == 2 else None
        print(f"| {key} | {cells[0]} | {cells[1]} | {f'{ratio:.3f}' if ratio else '-'} |")
    for setting in dict.fromkeys(key.split(" seed=")[0] for key in results):
        for side in ("bilm_tf", "elmo_jax"):
            values = [
                row[side]["perplexity"] for key, row in results.items() if key.startswith(setting + " ") and side in row
            ]
            if len(values) > 1:
                print(
                    f"{setting}, {side}: mean {statistics.mean(values):.2f}, min {min(values):.2f}, "
                    f"max {max(values):.2f} over {len(values)} seeds"
                )


if __name__ == "__main__":
    main()
