"""The dependent loop iterations of one train step and the ops inside each loop, read from the
compiled HLO on any backend.

Compiles (without running or allocating) the real train step of a published config or
`cpu_peer` for one device, finds every while loop of the compiled program (the LSTM time loops,
forward and backward), its trip count and the ops in its body, and prints them. Loops run one
after another and each iteration waits for the last, so the sum of trip counts is the length of
the step's critical path in loop steps; the ops per iteration (kernels on an accelerator: fusions,
matmuls, copies; free ops such as tuples and bitcasts not counted) say what each of those steps
costs in launches. Compare before and after a change on this CPU; the counts on an accelerator
differ only by the backend's fusion choices. The last line is one JSON object with
`dependent_loop_iterations` (per train step), `ops_per_iteration` (the mean over the loops,
weighted by their trip counts) and every loop's details.

    python benchmarks/critical_path.py [--config=original] [--per-device-batch=128] [--dtype=bf16]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*?\s([a-z][\w\-]*)\(")
_WHILE = re.compile(r"\swhile\(.*?\bcondition=%?([\w.\-]+), body=%?([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_MATMUL = re.compile(r"\s(?:dot|convolution)\(|custom_call_target=\"__cublas|custom_call_target=\"__onednn\$matmul")
FREE_OPS = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all", "opt-barrier"}


def computations(hlo_text: str) -> dict[str, list[str]]:
    """Each computation's instruction lines, by name."""
    found, current = {}, None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = found.setdefault(header.group(1), [])
        elif line.strip() == "}":
            current = None
        elif current is not None:
            current.append(line)
    return found


def _has_matmul(name: str, comps: dict[str, list[str]], seen: set[str]) -> bool:
    """Whether computation `name` or one it calls holds a matmul or convolution."""
    seen.add(name)
    for line in comps.get(name, []):
        if _MATMUL.search(line):
            return True
        if any(callee not in seen and _has_matmul(callee, comps, seen) for callee in _CALLS.findall(line)):
            return True
    return False


def loops(hlo_text: str) -> list[dict]:
    """Every while loop: its body, trip count (None when XLA does not know it), the product of
    the trip counts of the loops it runs inside (`outer_trips`), whether its body holds a matmul
    (the LSTM time loops do; the sampler's binary searches and, on CPU, the random number
    generator's rounds do not), the JAX op it came from, and its body's ops by opcode (free ops
    left out)."""
    comps = computations(hlo_text)
    parent_of = {}
    for name, lines in comps.items():
        for line in lines:
            match = _WHILE.search(line)
            if match:
                trips, source = _TRIP_COUNT.search(line), _OP_NAME.search(line)
                parent_of[match.group(2)] = (name, int(trips.group(1)) if trips else None, source.group(1) if source else "")
    found = []
    for body, (parent, trips, source) in parent_of.items():
        ops = collections.Counter(m.group(1) for m in map(_INSTRUCTION.match, comps[body]) if m)
        outer = 1
        while parent in parent_of:
            outer *= parent_of[parent][1] or 1
            parent = parent_of[parent][0]
        found.append({"body": body, "source": source, "trip_count": trips, "outer_trips": outer,
                      "matmul": _has_matmul(body, comps, set()),
                      "ops": {op: n for op, n in sorted(ops.items()) if op not in FREE_OPS}})
    return found


def summary(found: list[dict]) -> dict:
    """The dependent iterations of the loops with matmuls per run of the program (each waits
    for the last: the recurrence), the ops per such iteration weighted by how often each body
    runs, and the iterations of the other loops."""
    recurrent = [loop for loop in found if loop["matmul"]]
    runs = [(loop["trip_count"] or 0) * loop["outer_trips"] for loop in recurrent]
    ops = [sum(loop["ops"].values()) for loop in recurrent]
    total = sum(runs)
    return {"dependent_loop_iterations": total,
            "ops_per_iteration": sum(r * n for r, n in zip(runs, ops)) / total if total else 0.0,
            "other_loop_iterations": sum((loop["trip_count"] or 0) * loop["outer_trips"] for loop in found if not loop["matmul"]),
            "loops": found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="original")
    parser.add_argument("--per-device-batch", type=int, default=128)
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--unroll-steps", type=int, default=20)
    args = parser.parse_args()

    import jax

    from elmo_jax.config import ModelConfig, TrainHParams
    from elmo_jax.text.batcher import round_up
    from elmo_jax.train.parallel import DataParallel
    from elmo_jax.train.step import init_train_state, make_train_step
    from throughput import CONFIGS, DTYPES

    options, vocab, negatives, _ = CONFIGS[args.config]
    config = ModelConfig.from_options(options)
    config = ModelConfig(config.lstm, config.char_cnn, DTYPES[args.dtype])
    B, T = args.per_device_batch, args.unroll_steps
    hp = TrainHParams(batch_size=B, unroll_steps=T, n_tokens_vocab=vocab, n_negative_samples_batch=negatives)
    parallel = DataParallel(1)
    abstract = jax.eval_shape(lambda: init_train_state(jax.random.key(0), config, hp, B, vocab))
    batch = parallel.abstract_batch(B, T, round_up(min(B * T, vocab), 8), config.char_cnn.max_characters_per_token)
    step = make_train_step(config, hp, parallel=parallel, state_shardings=parallel.state_shardings(abstract, False))
    result = summary(loops(step.lower(abstract, batch).compile().as_text()))
    for loop in sorted(result["loops"], key=lambda loop: not loop["matmul"]):
        ops = ", ".join(f"{op} {n}" for op, n in sorted(loop["ops"].items(), key=lambda kv: -kv[1]))
        outer = f" inside loops of {loop['outer_trips']} iterations" if loop["outer_trips"] > 1 else ""
        kind = "matmul loop" if loop["matmul"] else "loop"
        print(f"{kind} from {loop['source'] or loop['body']}: {loop['trip_count']} iterations{outer}, "
              f"{sum(loop['ops'].values())} ops per iteration ({ops})")
    print(f"{args.config}, {B} rows, T = {T}, {args.dtype} on {jax.devices()[0].platform}: "
          f"{result['dependent_loop_iterations']} dependent loop iterations with matmuls per train step, "
          f"{result['ops_per_iteration']:.1f} ops per iteration; {result['other_loop_iterations']} iterations of other loops")
    print(json.dumps({"config": args.config, "per_device_batch": B, "unroll_steps": T, "dtype": args.dtype,
                      "backend": jax.devices()[0].platform, **result}))


if __name__ == "__main__":
    main()
