"""A long training run watched from outside: host memory, open files, threads and step time
over tens of thousands of steps, with checkpoints, held-out evaluations and a resume half-way.

    python -m benchmarks.robustness.soak [--steps=20000] [--config=demo] [--workdir=DIR]

Runs `launch.py train` for steps/2, then again on the same workdir to --steps (a resume), and
each time the run logs a window (config.train.log_every steps) reads the process's RSS,
threads (/proc/PID/status) and file descriptors (/proc/PID/fd) and the window's step time
(metrics.jsonl). Prints, for each of the two processes, the values after warm-up (its first
1,000 steps left out) and at its end (medians of 5 samples), their least-squares slopes per
10,000 steps, and the programs compiled after warm-up (a new batch shape); the last line is
JSON. Every sample is in WORKDIR/soak_samples.jsonl. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT

WARM_UP = 1000  # steps of each process left out of the slopes (compiles, caches, first saves)
EDGE = 5  # samples whose median is the value at the start and at the end
MEASURES = {"rss_mib": "host RSS (MiB)", "fds": "open descriptors", "threads": "threads", "step_ms": "step time (ms)"}


def process_sample(pid: int) -> dict[str, float] | None:
    """RSS (MiB), threads and open descriptors of a live process; None once it has ended."""
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return {"rss_mib": int(status["VmRSS"].split()[0]) / 1024, "threads": int(status["Threads"]), "fds": fds}


def new_train_records(metrics: Path, seen: int) -> tuple[list[dict], int]:
    """The train records of metrics.jsonl after its first `seen` lines, and the new line count."""
    if not metrics.is_file():
        return [], seen
    text = metrics.read_text()
    lines = text.splitlines()
    complete = len(lines) if text.endswith("\n") else len(lines) - 1  # a line being written waits
    records = [json.loads(line) for line in lines[seen:complete]]
    return [r for r in records if r["kind"] == "train"], complete


def watch(command: list[str], metrics: Path, log: Path) -> list[dict]:
    """Runs `command` to its end, sampling it at every logged train window."""
    samples, (_, seen) = [], new_train_records(metrics, 0)  # a resumed run's earlier records are not its own
    with open(log, "a") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            records, seen = new_train_records(metrics, seen)
            sample = process_sample(proc.pid) if records else None
            if sample is not None:
                last, compiles = records[-1], log.read_text().count("compiled jit(")
                samples.append(
                    {"step": last["step"], **sample, "step_ms": 1000 * last["step_time_s"], "compiles": compiles}
                )
                with open(log.with_name("soak_samples.jsonl"), "a") as f:
                    f.write(json.dumps(samples[-1]) + "\n")
            time.sleep(0.5)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {proc.returncode}; see {log}")
    return samples


def slope_per_10k(samples: list[dict], key: str) -> float:
    """Least-squares slope of `key` against the step, per 10,000 steps."""
    xs, ys = [s["step"] for s in samples], [s[key] for s in samples]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    return 10_000 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if var else 0.0


def summary(samples: list[dict]) -> dict:
    first_step = samples[0]["step"]
    kept = [s for s in samples if s["step"] >= first_step + WARM_UP] or samples
    return {
        "steps": [kept[0]["step"], kept[-1]["step"]],
        "samples": len(kept),
        **{
            key: {
                "start": statistics.median(s[key] for s in kept[:EDGE]),
                "end": statistics.median(s[key] for s in kept[-EDGE:]),
                "slope_per_10k_steps": slope_per_10k(kept, key),
            }
            for key in MEASURES
        },
        "compiles": kept[-1]["compiles"] - samples[0]["compiles"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--config", default="demo")
    parser.add_argument("--workdir", default=None, help="default: a new temporary folder")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="elmo_soak_"))
    workdir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(ROOT / "launch.py"),
        "train",
        f"--config={args.config}",
        f"--workdir={workdir}",
        "--config.train.n_epochs=1000",
        "--config.train.checkpoint_every=500",
        "--config.train.eval_every=1000",
        "--config.train.eval_sentences=500",
    ]
    began = time.monotonic()
    parts = []
    for steps in (args.steps // 2, args.steps):
        samples = watch(
            [*command, f"--config.train.max_steps={steps}"], workdir / "metrics.jsonl", workdir / "soak.log"
        )
        parts.append(summary(samples))
    print(f"soak: {args.config}, {args.steps:,} steps in two processes, {time.monotonic() - began:.0f} s; {workdir}")
    names = " | ".join(f"{name} start -> end (per 10k steps)" for name in MEASURES.values())
    print(f"| process | steps | {names} | compiles |")
    print("|---" * (3 + len(MEASURES)) + "|")
    for n, part in enumerate(parts, start=1):
        cells = [
            f"{part[k]['start']:.4g} -> {part[k]['end']:.4g} ({part[k]['slope_per_10k_steps']:+.3g})" for k in MEASURES
        ]
        print(f"| {n} | {part['steps'][0]:,}-{part['steps'][1]:,} | " + " | ".join(cells) + f" | {part['compiles']} |")
    print(json.dumps({"config": args.config, "steps": args.steps, "processes": parts}))


if __name__ == "__main__":
    main()
