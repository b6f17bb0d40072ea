"""Every training step of bilm-tf and of elmo_jax side by side, with and without dropout: the
loss and the global gradient norm before clipping (of unroll_steps x the loss, both sides), so
their distributions over a whole run can be compared (how large the steps are, how often the
clip at all_clip_norm_val fires), with the held-out perplexity each run ends at.

    bash $SHARED/tools/bilm_tf/setup_bilmtf.sh       # once: /tmp/bilmvenv, /tmp/bilm-work
    python -m benchmarks.parity.bilm_tf_steps --out=runs/steps \\
        --train=$SHARED/data/fortunes/train.txt --heldout=$SHARED/data/fortunes/heldout.txt \\
        [--epochs=1] [--dropouts=0,0.1] [--seed=0] [--order=shared]

--order=shared runs bilm-tf with both directions shuffled alike (`--backward-order=same`) and
ours with config.data.backward_order=shared; --order=independent runs both as published. bilm-tf
records each step through two tf.py_func hooks added to its training graph (the training loss,
and the norm of the gradients clip_grads receives, after bilm-tf has merged duplicate rows);
ours logs every step (log_every=1). Both sides' models are scored on every held-out position by
our evaluator (see bilm_tf_learning.py). Writes OUT/{side}_dropout{rate}.jsonl (one record a
step) and OUT/summary.json; prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT
from benchmarks.parity.bilm_tf_learning import bilm_tf_flags, elmo_jax_command, every_position, last_json

CLIP = 10.0  # the recipe's all_clip_norm_val

# Runs bilm_tf_train_eval.py (its folder on PYTHONPATH; its flags argv[2:]) with the hooks;
# argv[1]: the records.
BILM_TF_RECORDING = """
import json, sys
import bilm_tf_train_eval as peer
import numpy as np
tf, bt = peer.tf, peer.bt
records = open(sys.argv[1], "w")
step = {}

def on_loss(loss):
    step["loss"] = float(loss)
    return np.float32(0.0)

def on_norm(norm):
    records.write(json.dumps({**step, "grad_norm": float(norm)}) + "\\n")
    records.flush()
    return np.float32(0.0)

build_loss = bt.LanguageModel._build_loss

def build_loss_recording(self, lstm_outputs):
    build_loss(self, lstm_outputs)
    if self.is_training:
        hook = tf.py_func(on_loss, [self.total_loss], tf.float32, stateful=True)
        with tf.control_dependencies([hook]):
            self.total_loss = tf.identity(self.total_loss)

clip_grads = bt.clip_grads

def clip_grads_recording(grads, options, do_summaries, global_step):
    hook = tf.py_func(on_norm, [tf.global_norm([g for g, _ in grads])], tf.float32, stateful=True)
    ret, summaries = clip_grads(grads, options, do_summaries, global_step)
    dense = next(i for i, (g, _) in enumerate(ret) if not isinstance(g, tf.IndexedSlices))
    with tf.control_dependencies([hook]):
        ret[dense] = (tf.identity(ret[dense][0]), ret[dense][1])
    return ret, summaries

bt.LanguageModel._build_loss = build_loss_recording
bt.clip_grads = clip_grads_recording
sys.argv = [peer.__file__] + sys.argv[2:]
peer.main()
"""


def bilm_tf(args, vocab: Path, dropout: float, records: Path) -> dict:
    order = "same" if args.order == "shared" else "independent"
    folder = args.out / f"bilm_tf_dropout{dropout}"
    flags = bilm_tf_flags(args.train, args.heldout, vocab, args.epochs, folder, args.seed, dropout, order)
    command = [args.bilm_python, "-c", BILM_TF_RECORDING, str(records), *flags]
    result = last_json(command, args.out / f"bilm_tf_dropout{dropout}.log", {"PYTHONPATH": args.bilm_tools})
    return {**result, **every_position(args, folder, result["steps"], vocab, args.heldout), "own_test": result}


def elmo_jax(args, vocab: Path, dropout: float, steps: int, records: Path) -> dict:
    workdir = args.out / f"elmo_jax_dropout{dropout}"
    run = (args.train, args.heldout, vocab, args.epochs, workdir, args.seed, dropout, args.order, steps)
    command = [*elmo_jax_command(*run), "--config.train.log_every=1"]
    result = last_json(command, args.out / f"elmo_jax_dropout{dropout}.log")
    with open(records, "w") as f:
        for line in (workdir / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r["kind"] == "train":
                f.write(json.dumps({"loss": r["loss"], "grad_norm": r["grad_norm"]}) + "\n")
    return result


def summarize(records: Path, result: dict) -> dict:
    """The run's numbers: per quarter of the run, the mean loss, the median and 90th percentile
    of the gradient norm, and the fraction of steps whose norm exceeded the clip."""
    steps = [json.loads(line) for line in records.read_text().splitlines()]
    loss, norm = np.array([s["loss"] for s in steps]), np.array([s["grad_norm"] for s in steps])
    quarters = np.array_split(np.arange(len(steps)), 4)
    return {
        "perplexity": result["perplexity"],
        "forward_perplexity": result["forward_perplexity"],
        "backward_perplexity": result["backward_perplexity"],
        "steps": len(steps),
        "loss": [float(loss[q].mean()) for q in quarters],
        "grad_norm_median": [float(np.median(norm[q])) for q in quarters],
        "grad_norm_p90": [float(np.percentile(norm[q], 90)) for q in quarters],
        "clipped": [float((norm[q] > CLIP).mean()) for q in quarters],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--epochs", type=int, default=1, help="bilm-tf epochs (ours: the same number of batches)")
    parser.add_argument("--dropouts", default="0,0.1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--order", default="shared", choices=["shared", "independent"])
    parser.add_argument("--bilm_python", default="/tmp/bilmvenv/bin/python")
    parser.add_argument("--bilm_tools", default=str(ROOT.parent / "shared" / "tools" / "bilm_tf"))
    args = parser.parse_args()
    args.out = Path(args.out).absolute()
    args.train, args.heldout = Path(args.train).absolute(), Path(args.heldout).absolute()
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = args.out / "vocab.txt"
    if not vocab.is_file():
        last_json(
            [sys.executable, "launch.py", "vocab", f"--data=text:{args.train}", f"--output={vocab}"],
            args.out / "vocab.log",
        )
    summary_path = args.out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    for dropout in map(float, args.dropouts.split(",")):
        for side in ("bilm_tf", "elmo_jax"):
            key = f"{side} dropout={dropout}"
            if key in summary:
                continue
            records = args.out / f"{side}_dropout{dropout}.jsonl"
            if side == "bilm_tf":
                result = bilm_tf(args, vocab, dropout, records)
                bilm_steps = result["steps"]
            else:
                steps = summary.get(f"bilm_tf dropout={dropout}", {}).get("steps") or bilm_steps
                result = elmo_jax(args, vocab, dropout, steps, records)
            summary[key] = summarize(records, result)
            summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    print(
        "| run | held-out ppl (fwd / bwd) | loss by quarter | grad norm median by quarter | p90 | clipped by quarter |"
    )
    print("|---|---|---|---|---|---|")
    for key, s in summary.items():
        cells = [
            " / ".join(f"{v:.{d}f}" for v in s[k])
            for k, d in (("loss", 3), ("grad_norm_median", 2), ("grad_norm_p90", 2), ("clipped", 2))
        ]
        ppl = f"{s['perplexity']:.2f} ({s['forward_perplexity']:.2f} / {s['backward_perplexity']:.2f})"
        print(f"| {key} | {ppl} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
