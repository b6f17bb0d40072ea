"""Fits `plan`'s expected-time rates (elmo_jax/plan/rates.py) to the H200 step times measured by
`benchmarks/gpu.sh`, and checks them by leave-one-out; writes elmo_jax/plan/rates_h200.json and
prints the table for docs/PERFORMANCE.md.

    .venv/bin/python -m benchmarks.speed.plan_rates                       # the runs in MEASURED
    .venv/bin/python -m benchmarks.speed.plan_rates --add=OUT/throughput.jsonl --commit=SHA --date=YYYY-MM-DD

Each measured run's program is compiled for the H200 without one, from the commit that was
measured (a `git worktree` of it under --worktrees), as its benchmarks/speed/throughput.py built
it (the synthetic corpus, the word table of the timed batches); this checkout's plan reads its
kernels and their floors per class. --add takes a device run's throughput.jsonl (gpu.sh's) and adds
its train runs, measured at --commit on --date, to the table before fitting: a refit after each
device run. Needs elmo_jax[plan].
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT

TABLE = ROOT / "elmo_jax" / "plan" / "rates_h200.json"
PERFORMANCE = "docs/PERFORMANCE.md"
# What was measured on one H200 (docs/PERFORMANCE.md): commit, date, throughput.py's settings, step seconds.
MEASURED = [
    *(
        {"commit": "1fa3572", "date": "2026-11-30", "config": "original", "rows": rows, "dtype": "f32",
         "schedule": "layers", "cell": "xla", "measured_s": s}
        for rows, s in ((128, 30.0e-3), (256, 45.7e-3), (512, 74.4e-3))
    ),
    *(
        {"commit": "8ea964e", "date": "2026-12-04", "config": config, "rows": rows, "dtype": dtype,
         "schedule": schedule, "cell": cell, "measured_s": s}
        for config, rows, dtype, schedule, cell, s in (
            ("original", 128, "bf16", "wavefront", "xla", 11.7e-3),
            ("original", 128, "bf16", "layers", "xla", 12.2e-3),
            ("original", 128, "bf16", "wavefront", "pallas", 10.7e-3),
            ("original", 256, "bf16", "wavefront", "xla", 17.7e-3),
            ("original", 512, "bf16", "wavefront", "xla", 28.0e-3),
            ("original", 512, "bf16", "wavefront", "pallas", 25.5e-3),
            ("original", 128, "f32", "wavefront", "xla", 17.4e-3),
            ("original", 512, "f32", "wavefront", "xla", 46.6e-3),
            ("medium", 256, "bf16", "wavefront", "xla", 11.6e-3),
            ("small", 256, "bf16", "wavefront", "xla", 9.3e-3),
        )
    ),
]  # fmt: skip

# Run in a child with the measured commit's checkout as its working directory and path: its step as
# its throughput.py built it, compiled by its plan for one H200 without one. argv: JSON of a run, out.
CHILD = r"""
import json, sys
from benchmarks.common import DTYPES, size, synthetic_corpus
from elmo_jax.config import ModelConfig
from elmo_jax.plan import program
from elmo_jax.plan.targets import target
from elmo_jax.text import batcher
from experiments import elmo_medium, elmo_original, elmo_small

run, out = json.loads(sys.argv[1]), sys.argv[2]
options, vocab_size, negatives, _ = size(run["config"])
B, T = run["rows"], 20
corpus, vocab = synthetic_corpus(vocab_size, max(4 * B, 2000))
char_window = ModelConfig.from_options(options).char_cnn.widest_filter
batches = batcher.StreamBatcher(corpus, vocab, B, T, seed=0, char_window=char_window)
U = max(next(batches).chars.shape[0] for _ in range(3 + 15 + 3))  # gpu.sh: 3 warm-up, 15 timed, 3 profiled
config = {"original": elmo_original, "medium": elmo_medium, "small": elmo_small}[run["config"]].get_config()
with config.unlocked():
    config.train.compute_dtype = DTYPES[run["dtype"]]
    config.train.lstm_schedule = run["schedule"]
    config.train.lstm_cell = run["cell"]
    if "char_conv" in config.train:
        config.train.char_conv = run.get("char_conv", "xla")
batcher.round_up = lambda n, m: U  # the timed batches' word table, not the plan's largest
open(out, "w").write(program.compile_train_step(config, target("h200"), 1, B, vocab_size).hlo)
"""

# 1fa3572 has no plan of its own: its step built as its throughput.py did, compiled here.
CHILD_1FA3572 = r"""
import json, sys
import jax, numpy as np
from jax.experimental import topologies
import throughput as old
from elmo_jax.config import ModelConfig, TrainHParams
from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.train.step import init_train_state, make_train_step

run, out = json.loads(sys.argv[1]), sys.argv[2]
B, T = run["rows"], 20
options, vocab_size, negatives, _ = old.CONFIGS["original"]
config = ModelConfig.from_options(options)
corpus, vocab = old.synthetic_corpus(vocab_size, max(4 * B, 2000))
batches = StreamBatcher(corpus, vocab, B, T, seed=0)
host = [next(batches) for _ in range(3 + 15)]
U = max(len(b["chars"]) for b in host)
batch = dict(host[0], chars=np.pad(host[0]["chars"], ((0, U - len(host[0]["chars"])), (0, 0))))
hp = TrainHParams(batch_size=B, unroll_steps=T, n_tokens_vocab=vocab_size, n_negative_samples_batch=negatives)
mesh = topologies.make_mesh(topologies.get_topology_desc(**run["topology"]), (1,), ("x",))
one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
put = lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=one)
state = jax.tree.map(put, jax.eval_shape(lambda: init_train_state(jax.random.key(0), config, hp, B)))
open(out, "w").write(make_train_step(config, hp).lower(state, jax.tree.map(put, batch)).compile().as_text())
"""


def checkout(commit: str, worktrees: Path) -> Path:
    path = worktrees / commit
    if not path.is_dir():
        subprocess.run(["git", "worktree", "add", "-f", "--detach", str(path), commit], cwd=ROOT, check=True)
    return path


def compile_run(run: dict, worktrees: Path, out: Path) -> str:
    """The measured run's program, compiled from its commit (cached in `out`)."""
    from elmo_jax.plan.targets import target

    if out.is_file():
        return out.read_text()
    tree = checkout(run["commit"], worktrees)
    old = run["commit"] == "1fa3572"
    child = CHILD_1FA3572 if old else CHILD
    arg = json.dumps({**run, "topology": target("h200").topology(1)})
    path = f"{tree}:{tree / 'benchmarks'}" if old else str(tree)
    env = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1"}
    done = subprocess.run(
        [sys.executable, "-c", child, arg, str(out)], cwd=tree, env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"compiling {run} failed:\n{done.stderr[-3000:]}")
    return out.read_text()


def name_of(run: dict) -> str:
    extra = f", {run['char_conv']} char CNN" if run.get("char_conv") else ""
    return (
        f"{run['date']} {run['commit']} {run['config']} {run['dtype']} {run['rows']} {run['schedule']} "
        f"{run['cell']} cell{extra}"
    )


def added_runs(path: Path, commit: str, date: str) -> list[dict]:
    """The train runs of a gpu.sh throughput.jsonl."""
    runs = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("mode") == "train":
            runs.append(
                {
                    "commit": commit,
                    "date": date,
                    "config": r["config"],
                    "rows": r["per_device_batch"],
                    "dtype": r["dtype"],
                    "schedule": r["lstm_schedule"],
                    "cell": r.get("lstm_cell", "xla"),
                    "char_conv": r.get("char_conv", "xla"),
                    "measured_s": r["step_time_s"],
                }
            )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worktrees", type=Path, default=Path(tempfile.gettempdir()) / "elmo_jax_plan_rates")
    parser.add_argument("--add", type=Path, help="a device run's throughput.jsonl (benchmarks/gpu.sh)")
    parser.add_argument("--commit", help="--add: the commit it measured")
    parser.add_argument("--date", help="--add: the day it was measured")
    args = parser.parse_args()

    from elmo_jax.plan.kernels import Program
    from elmo_jax.plan.program import quiet_accelerator_plugins
    from elmo_jax.plan.rates import features, fit, leave_one_out

    quiet_accelerator_plugins()
    from elmo_jax.plan.targets import target

    h200 = target("h200")
    known = json.loads(TABLE.read_text())["runs"] if TABLE.is_file() else []
    runs = [dict(r) for r in MEASURED] + [r["run"] for r in known if r["run"] not in MEASURED]
    if args.add:
        if not (args.commit and args.date):
            parser.error("--add needs --commit and --date")
        runs += [r for r in added_runs(args.add, args.commit, args.date) if r not in runs]
    args.worktrees.mkdir(parents=True, exist_ok=True)
    table = []
    for run in runs:
        out = args.worktrees / f"{name_of(run).replace(' ', '_')}.hlo"
        kernels = Program(compile_run(run, args.worktrees, out), h200.platform).kernels()
        local = [k for k in kernels if k.kind != "collective"]
        floor = sum(k.runs * k.seconds(h200) for k in local)
        x = features(kernels, h200)
        table.append(
            {"name": name_of(run), "run": run, "measured_s": run["measured_s"], "floor_s": floor, "features": x}
        )
        print(f"{name_of(run)}: measured {run['measured_s'] * 1e3:.1f} ms, floor {floor * 1e3:.2f} ms", flush=True)
    rates = fit(table)
    loo = leave_one_out(table)
    dates = sorted({r["run"]["date"] for r in table})
    TABLE.write_text(
        json.dumps(
            {
                "target": "h200",
                "fitted": datetime.date.today().isoformat(),
                "measured_on": dates,
                "command": "python -m benchmarks.speed.plan_rates",
                "rates": rates,
                "leave_one_out": loo,
                "runs": table,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"\nrates (multipliers of the floors; s a launch, s a step): {json.dumps(rates)}")
    print(f"written to {TABLE.relative_to(ROOT)}; the table for {PERFORMANCE}:\n")
    print(markdown(loo))


def markdown(loo: list[dict]) -> str:
    lines = [
        "| run | measured | floor | floor error | expected (fitted without it) | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in loo:
        lines.append(
            f"| {r['name']} | {r['measured_s'] * 1e3:.1f} ms | {r['floor_s'] * 1e3:.1f} ms | "
            f"{r['floor_s'] / r['measured_s'] - 1:+.0%} | {r['expected_s'] * 1e3:.1f} ms | {r['error']:+.1%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
