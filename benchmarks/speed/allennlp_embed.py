"""Embedding a file: `launch.py embed` against AllenNLP's `_ElmoBiLm`, whole processes, back to back.

    bash $SHARED/tools/allennlp/setup_refvenv.sh          # once: /tmp/refvenv
    python -m benchmarks.speed.allennlp_embed [--sentences=2000] [--size=small] [--out=/tmp/embed_vs_allennlp] \\
        [--reference_python=/tmp/refvenv/bin/python] [--baseline=PATH_TO_AN_OLDER_CHECKOUT]

Writes a model of the published size (random weights, exported in bilm-tf's format, which both
load) and a file of Zipfian sentences (benchmarks/common.py), then times, each as a whole
process from its start to its exit:

- `launch.py embed --layers=all` with an empty compilation cache, then again with the cache
  the first run filled (`--compile_cache`, in OUT/cache);
- with --baseline, the same two runs of another checkout (its own cache; for before/after);
- AllenNLP 2.10.1: `_ElmoBiLm` over batches of 64 sentences (`batch_to_ids`, the states reset
  before each batch so that it is stateless like ours), writing the same HDF5 layout. The
  sentences are sorted by length first, as ours are, which spares AllenNLP most of its padding
  (`allennlp elmo`, before it was removed, batched in file order: --allennlp_file_order times that
  too).

Prints the times, the ratios and the largest difference between the outputs (ours against
AllenNLP's and against the baseline's), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from benchmarks.common import ROOT, write_zipf_file

# Run by AllenNLP's Python: argv = options, weights, input, output.
REFERENCE = """
import json, sys, time
import h5py, torch
from allennlp.modules.elmo import _ElmoBiLm, batch_to_ids
from allennlp.nn.util import remove_sentence_boundaries
options, weights, source, target, sort = sys.argv[1:5] + [sys.argv[5] == "sorted"]
bilm = _ElmoBiLm(options, weights)
lines = open(source, encoding="utf-8").read().split("\\n")[:-1]
order = sorted(range(len(lines)), key=lambda i: len(lines[i].split())) if sort else list(range(len(lines)))
forward = 0.0
with torch.no_grad(), h5py.File(target, "w") as out:
    for start in range(0, len(lines), 64):
        rows = order[start : start + 64]
        batch = [lines[i].split() for i in rows]
        bilm._elmo_lstm.reset_states()
        tick = time.perf_counter()
        result = bilm(batch_to_ids(batch))
        forward += time.perf_counter() - tick
        layers = [remove_sentence_boundaries(a, result["mask"])[0] for a in result["activations"]]
        stacked = torch.stack(layers, dim=1).numpy()  # (B, L + 1, T, 2P)
        for k, (i, tokens) in enumerate(zip(rows, batch)):
            out.create_dataset(str(i), data=stacked[k, :, : len(tokens)])
    out.create_dataset("sentence_to_index", data=[json.dumps({l: str(i) for i, l in enumerate(lines)})],
                       dtype=h5py.string_dtype())
print(json.dumps({"forward_s": forward, "torch_threads": torch.get_num_threads()}))
"""


def timed(command: list[str], env: dict | None = None) -> tuple[float, str]:
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    seconds = time.perf_counter() - began
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return seconds, result.stdout + result.stderr


def max_difference(a: Path, b: Path, n: int) -> float:
    with h5py.File(a) as fa, h5py.File(b) as fb:
        return max(float(np.abs(fa[str(i)][...] - fb[str(i)][...]).max(initial=0.0)) for i in range(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--size", default="small", choices=["small", "medium", "original"])
    parser.add_argument("--out", default="/tmp/embed_vs_allennlp")
    parser.add_argument("--reference_python", default="/tmp/refvenv/bin/python")
    parser.add_argument("--baseline", default=None, help="another elmo_jax checkout to time the same way")
    parser.add_argument(
        "--allennlp_file_order", action="store_true", help="also time AllenNLP on batches in file order"
    )
    args = parser.parse_args()

    import jax

    from elmo_jax.config import PUBLISHED_OPTIONS, ModelConfig
    from elmo_jax.model.bilm import init_params
    from elmo_jax.model_io import Model, export_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = ModelConfig.from_options(PUBLISHED_OPTIONS[args.size])
    export_model(Model(config, init_params(jax.random.key(0), config, None)), out / "model", overwrite=True)
    sentences = write_zipf_file(out / "sentences.txt", args.sentences)
    tokens = sum(len(s) for s in sentences)
    distinct = len({t for s in sentences for t in s})
    print(f"{args.sentences} sentences, {tokens:,} tokens, {distinct:,} distinct words; model: {args.size}")

    model = ["--options", str(out / "model" / "options.json"), "--weights", str(out / "model" / "weights.hdf5")]
    embed = ["embed", "--input", str(out / "sentences.txt"), "--layers=all", "--overwrite", *model]
    cache = {"XDG_CACHE_HOME": str(out / "cache")}
    subprocess.run(["rm", "-rf", str(out / "cache")], check=True)
    times, logs = {}, {}
    times["ours_cold_cache"], logs["cold"] = timed(
        [sys.executable, str(ROOT / "launch.py"), *embed, f"--output={out / 'ours.h5'}"], cache
    )
    times["ours_warm_cache"], logs["warm"] = timed(
        [sys.executable, str(ROOT / "launch.py"), *embed, f"--output={out / 'ours.h5'}"], cache
    )
    if args.baseline:
        base = Path(args.baseline).resolve()
        subprocess.run(["rm", "-rf", str(out / "baseline_cache")], check=True)
        for name in ("baseline_cold_cache", "baseline_warm_cache"):
            times[name], _ = timed(
                [sys.executable, str(base / "launch.py"), *embed, f"--output={out / 'baseline.h5'}"],
                {"XDG_CACHE_HOME": str(out / "baseline_cache")},
            )
    times["allennlp"], reference_log = timed(
        [
            args.reference_python,
            "-c",
            REFERENCE,
            *model[1::2],
            str(out / "sentences.txt"),
            str(out / "allennlp.h5"),
            "sorted",
        ]
    )
    if args.allennlp_file_order:
        times["allennlp_file_order"], _ = timed(
            [
                args.reference_python,
                "-c",
                REFERENCE,
                *model[1::2],
                str(out / "sentences.txt"),
                str(out / "allennlp_file_order.h5"),
                "file",
            ]
        )
    report = {
        "sentences": args.sentences,
        "tokens": tokens,
        "distinct_words": distinct,
        "size": args.size,
        **{f"{k}_s": round(v, 2) for k, v in times.items()},
        "allennlp_forward_s": round(json.loads(reference_log.strip().splitlines()[-1])["forward_s"], 2),
        "speedup_warm": round(times["allennlp"] / times["ours_warm_cache"], 2),
        "speedup_cold": round(times["allennlp"] / times["ours_cold_cache"], 2),
        "max_abs_diff_vs_allennlp": max_difference(out / "ours.h5", out / "allennlp.h5", args.sentences),
    }
    if args.baseline:
        for name in ("cold", "warm"):
            report[f"speedup_vs_baseline_{name}"] = round(
                times[f"baseline_{name}_cache"] / times[f"ours_{name}_cache"], 2
            )
        report["max_abs_diff_vs_baseline"] = max_difference(out / "ours.h5", out / "baseline.h5", args.sentences)
    for name in ("cold", "warm"):
        line = next((l for l in logs[name].splitlines() if " tokens/s (" in l), "")
        print(f"ours ({name} cache): {times[f'ours_{name}_cache']:.1f} s; {line.split(' ', 1)[-1]}")
    if args.baseline:
        print(
            f"baseline ({args.baseline}): {times['baseline_cold_cache']:.1f} s cold, "
            f"{times['baseline_warm_cache']:.1f} s warm"
        )
    print(f"AllenNLP: {times['allennlp']:.1f} s ({report['allennlp_forward_s']:.1f} s in forward passes)")
    if args.allennlp_file_order:
        print(f"AllenNLP, batches in file order: {times['allennlp_file_order']:.1f} s")
    print(f"speed-up over AllenNLP: {report['speedup_warm']:.2f}x (warm cache), {report['speedup_cold']:.2f}x (cold)")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
