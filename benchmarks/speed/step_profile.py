"""Where a compiled step's time goes: a `jax.profiler` trace read back op by op.

`profile_steps(fn, args_per_step)` traces a few calls of a compiled function and
`breakdown(trace_dir, hlo_text, steps)` reads the trace: every op the device ran (a kernel on
an accelerator, an XLA thunk on the CPU), its time per step, and shares by part of the model.
The parts are the `jax.named_scope`s the train step sets (lstm, token_encoder, softmax,
sampler, dropout, optimizer), found in each op's HLO metadata; ops inside a while loop with
matmuls are the LSTM time loops. Used by `benchmarks/speed/throughput.py --profile`.
"""

from __future__ import annotations

import collections
import re
import tempfile
from pathlib import Path

import jax

from elmo_jax.plan.hlo import computations, instructions, loops

PARTS = ("lstm", "token_encoder", "softmax", "sampler", "dropout", "optimizer")
LIBRARY = "library kernels"  # run inside a command buffer, under no HLO instruction's name
CONTAINERS = {"while", "call", "conditional", "async-start", "async-done", "async-update"}


def profile_steps(fn, args_per_step, trace_dir: str | None = None) -> str:
    """Runs fn(*args) for each args in `args_per_step` under a profiler trace; returns the
    folder the trace was written to."""
    trace_dir = trace_dir or tempfile.mkdtemp(prefix="step_profile_")
    jax.block_until_ready(fn(*args_per_step[0]))  # nothing left over from before the trace
    with jax.profiler.trace(trace_dir):
        for args in args_per_step:
            out = fn(*args)
        jax.block_until_ready(out)
    return trace_dir


def hlo_ops(hlo_text: str) -> dict[str, dict]:
    """Every instruction of a compiled HLO module by name: opcode, the JAX op it came from
    (op_name), its part of the model, and whether it runs inside a while loop with matmuls."""
    inside = {name for loop in loops(hlo_text) if loop["matmul"] for name in loop["computations"]}
    return {
        name: {"opcode": opcode, "op_name": source, "part": part_of(source), "in_recurrent_loop": comp in inside}
        for comp, lines in computations(hlo_text).items()
        for name, opcode, source in instructions(lines)
    }


def part_of(op_name: str) -> str:
    """The named scope an op_name lies in (`jit(train_step)/transpose(jvp(lstm))/...`)."""
    for part in PARTS:
        if re.search(rf"(^|[/(]){part}([/)]|$)", op_name):
            return part
    return "other"


def _events(trace_dir: str, module: str):
    """(op name, seconds) of each op event of `module` in the trace: from the device planes
    when there are any (their per-op line, else their stream lines), else from the host's
    threads (CPU). A kernel run inside a command buffer (a CUDA graph: its `hlo_op` names the
    buffer) is named by its kernel (an HLO instruction's name with '.' and '-' written '_')."""
    from jax.profiler import ProfileData

    path = next(Path(trace_dir).rglob("*.xplane.pb"))
    data = ProfileData.from_file(str(path))  # kept alive: its planes, lines and events point into it
    planes = list(data.planes)
    devices = [p for p in planes if p.name.startswith("/device:")]
    found = []
    for plane in devices or [p for p in planes if p.name.startswith("/host:CPU")]:
        lines = list(plane.lines)
        per_op = [line for line in lines if line.name == "XLA Ops"]
        for line in per_op or lines:
            for event in line.events:
                stats = dict(event.stats)
                name = stats.get("hlo_op") or (event.name if per_op else None)
                if name and name.startswith("command_buffer"):
                    name = event.name
                if name and module in str(stats.get("hlo_module", module)):
                    found.append((name, event.duration_ns / 1e9))
    return found


def _kernel_names(ops: dict[str, dict]) -> dict[str, str]:
    """HLO instruction name by the name of the kernel it compiles to ('.' and '-' as '_')."""
    return {re.sub(r"[.-]", "_", name): name for name in ops}


def breakdown(
    trace_dir: str, hlo_text: str, steps: int, module: str = "train_step", top: int = 15, target=None
) -> dict:
    """Device time per step, ops run per step, the top ops by time, each part's share and the
    seconds per step of each of the plan's kernel classes (on `target`, a plan Target)."""
    ops = hlo_ops(hlo_text)
    per_op, counts = collections.Counter(), collections.Counter()
    kernels = _kernel_names(ops)
    for name, seconds in _events(trace_dir, module):
        name = name if name in ops else kernels.get(name, name)
        if name not in ops:  # a library's kernel (cuBLAS, a sort, a copy) run by a command buffer
            ops[name] = {"opcode": "kernel", "op_name": "", "part": LIBRARY, "in_recurrent_loop": False}
        if ops[name]["opcode"] in CONTAINERS:
            continue  # a loop or call: its ops are counted themselves
        per_op[name] += seconds / steps
        counts[name] += 1
    total = sum(per_op.values()) or float("nan")
    parts = collections.Counter()
    for name, seconds in per_op.items():
        parts["lstm loops" if ops[name]["in_recurrent_loop"] else ops[name]["part"]] += seconds
    classes = collections.Counter()  # by the plan's kernel class (elmo_jax/plan/rates.py), where one is known
    of_kernel = kernel_classes(hlo_text, target)
    for name, seconds in per_op.items():
        classes[of_kernel.get(name, (LIBRARY, None))[0]] += seconds
    return {
        "op_seconds_per_step": total,
        "ops_per_step": sum(counts.values()) / steps,
        "recurrent_loop_ops_per_step": sum(n for name, n in counts.items() if ops[name]["in_recurrent_loop"]) / steps,
        "parts": {part: seconds / total for part, seconds in parts.most_common()},
        "classes_s": dict(classes.most_common()),
        "top_ops": [
            {
                "op": name,
                "opcode": ops[name]["opcode"],
                "part": ops[name]["part"],
                "in_recurrent_loop": ops[name]["in_recurrent_loop"],
                "ms_per_step": 1e3 * seconds,
                "share": seconds / total,
                "calls_per_step": counts[name] / steps,
                "op_name": ops[name]["op_name"][-120:],
                "expected_ms_per_step": 1e3 * of_kernel[name][1] if of_kernel.get(name, ("", None))[1] else None,
            }
            for name, seconds in per_op.most_common(top)
        ],
    }


def kernel_classes(hlo_text: str, target) -> dict[str, tuple[str, float | None]]:
    """Each kernel's class among the plan's rate features (elmo_jax/plan/rates.py) and its
    expected seconds per step (its floor at its class's rate, and its launches), by name; {}
    without a target."""
    if target is None:
        return {}
    from elmo_jax.plan.kernels import Program
    from elmo_jax.plan.rates import feature_of, kernel_seconds, rates_table

    rates = rates_table(target)["rates"]
    kernels = Program(hlo_text, target.platform).kernels()
    return {k.name: (feature_of(k, target) or "collective", kernel_seconds(k, target, rates)) for k in kernels}


def describe(profile: dict) -> str:
    """The breakdown as text lines."""
    lines = [
        f"profile: {1e3 * profile['op_seconds_per_step']:.1f} ms of ops per step, {profile['ops_per_step']:.0f} ops "
        f"per step ({profile['recurrent_loop_ops_per_step']:.0f} in the LSTM loops); by part: "
        + ", ".join(f"{part} {100 * share:.1f}%" for part, share in profile["parts"].items())
    ]
    for op in profile["top_ops"]:
        lines.append(
            f"  {op['ms_per_step']:8.3f} ms {100 * op['share']:5.1f}% x{op['calls_per_step']:<4.0f} "
            f"{op['op']} ({op['opcode']}, {'lstm loop' if op['in_recurrent_loop'] else op['part']}"
            + (f"; expected {op['expected_ms_per_step']:.3f} ms" if op.get("expected_ms_per_step") else "")
            + f"): {op['op_name']}"
        )
    return "\n".join(lines)


def by_class(profile: dict, expected_s: dict[str, float]) -> str:
    """Measured against the plan's expected seconds per kernel class (its launches and the
    step's fixed cost are not kernels: expected only; library kernels: measured only)."""
    lines = ["by kernel class: measured / expected ms per step (the plan's rates, elmo_jax/plan/rates.py)"]
    for name in dict.fromkeys([*expected_s, *profile["classes_s"]]):
        measured, want = profile["classes_s"].get(name), expected_s.get(name)
        cells = [f"{1e3 * v:8.3f}" if v is not None else "       -" for v in (measured, want)]
        ratio = f"{measured / want:6.2f}" if measured and want else "     -"
        lines.append(f"  {name:16s} {cells[0]} {cells[1]} {ratio}")
    return "\n".join(lines)
