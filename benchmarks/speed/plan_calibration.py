"""`elmo-jax plan`'s estimate of the code that `benchmarks/gpu.sh` measured on an H200 on
2026-11-30 (1fa3572, float32), beside what was measured (docs/PERFORMANCE.md).

    git worktree add /tmp/cal1fa 1fa3572
    .venv/bin/python -m benchmarks.speed.plan_calibration --checkout=/tmp/cal1fa

Each batch size is compiled for the H200 without one in a child process that imports the old
checkout's elmo_jax and builds its step as its own benchmarks/speed/throughput.py did (the same
synthetic corpus and batcher, the distinct-word table padded to the largest of the 18 batches
that run timed); this checkout's plan reads the compiled program. Needs elmo_jax[plan].
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# 2026-11-30 on one H200, float32 (TF32 matmuls), original size, T = 20: rows -> step seconds.
MEASURED = {128: 30.0e-3, 256: 45.7e-3, 512: 74.4e-3}

# Run in the child, in the old checkout's API, with it (and its benchmarks/) on PYTHONPATH:
# compile its step, write its text.
CHILD = r"""
import json, sys
import jax, numpy as np
from jax.experimental import topologies
import throughput as old
from elmo_jax.config import ModelConfig, TrainHParams
from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.train.step import init_train_state, make_train_step

args = json.loads(sys.argv[2])
B, T, out = args["rows"], 20, args["out"]
options, vocab_size, negatives, _ = old.CONFIGS["original"]
config = ModelConfig.from_options(options)
corpus, vocab = old.synthetic_corpus(vocab_size, max(4 * B, 2000))
batches = StreamBatcher(corpus, vocab, B, T, seed=0)
host = [next(batches) for _ in range(3 + 15)]  # gpu.sh: --steps=15, 3 warm-up batches
U = max(len(b["chars"]) for b in host)
batch = dict(host[0], chars=np.pad(host[0]["chars"], ((0, U - len(host[0]["chars"])), (0, 0))))
hp = TrainHParams(batch_size=B, unroll_steps=T, n_tokens_vocab=vocab_size, n_negative_samples_batch=negatives)
mesh = topologies.make_mesh(topologies.get_topology_desc(**args["topology"]), (1,), ("x",))
one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
put = lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=one)
state = jax.tree.map(put, jax.eval_shape(lambda: init_train_state(jax.random.key(0), config, hp, B)))
compiled = make_train_step(config, hp).lower(state, jax.tree.map(put, batch)).compile()
stats = compiled.memory_analysis()
memory = {k: int(getattr(stats, k + "_size_in_bytes")) for k in ("argument", "output", "alias", "temp")}
open(out + ".hlo", "w").write(compiled.as_text())
json.dump({"memory": memory, "words": U}, open(out + ".json", "w"))
"""


def compile_old(checkout: Path, rows: int, topology: dict, out: str) -> dict:
    path = f"{checkout}{os.pathsep}{checkout / 'benchmarks'}"
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
    arg = json.dumps({"rows": rows, "topology": topology, "out": out})
    done = subprocess.run([sys.executable, "-c", CHILD, str(checkout), arg], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"compiling {checkout} at {rows} rows failed:\n{done.stderr[-3000:]}")
    return json.loads(Path(out + ".json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, required=True, help="a worktree of 1fa3572")
    parser.add_argument("--batches", default="128,256,512")
    args = parser.parse_args()

    from elmo_jax.plan.program import CompiledStep, quiet_accelerator_plugins

    quiet_accelerator_plugins()
    from elmo_jax.plan.report import estimate
    from elmo_jax.plan.targets import target

    h200 = target("h200")
    print("rows | measured step | estimate (compute / memory / launches floors) | estimate / measured")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in map(int, args.batches.split(",")):
            out = f"{tmp}/{rows}"
            child = compile_old(args.checkout, rows, h200.topology(1), out)
            step = CompiledStep(Path(out + ".hlo").read_text(), child["memory"], rows, 20, 1, "layers", 0.0)
            r = estimate(step, h200)
            r["distinct_words"] = child["words"]
            measured = MEASURED.get(rows)
            r["measured_step_s"] = measured
            results.append(r)
            print(
                f"{rows} | {measured * 1e3 if measured else float('nan'):.1f} ms | {r['step_s'] * 1e3:.1f} ms "
                f"({r['compute_floor_s'] * 1e3:.1f} / {r['memory_floor_s'] * 1e3:.1f} / {r['launches_s'] * 1e3:.1f}), "
                f"{r['kernels']['per_step']:,} kernels, {r['hbm_bytes'] / 1e9:.1f} GB | "
                f"{r['step_s'] / measured if measured else float('nan'):.2f}",
                flush=True,
            )
    print(json.dumps([{k: v for k, v in r.items() if k != "top_kernels"} for r in results]))


if __name__ == "__main__":
    main()
