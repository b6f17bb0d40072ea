"""Reading a compiled program's HLO text (`jit(f).lower(...).compile().as_text()`): its
computations, while loops, matmuls and collectives. Used to check what the train step compiles
to (tests/test_parallel.py) and by the benchmarks that measure it (communication.py,
critical_path.py, step_profile.py)."""

from __future__ import annotations

import collections
import re

import numpy as np

from elmo_jax.model.kernel_calls import FLOPS_KEY

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?\s([a-z][\w\-]*)\(")
_WHILE = re.compile(r"\swhile\(.*?\bcondition=%?([\w.\-]+), body=%?([\w.\-]+)")
KNOWN_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
# A matmul: XLA's, a library's (cuBLAS, cuDNN's convolutions, oneDNN), or one in a kernel of
# ours (a custom call declaring its FLOPs).
_MATMUL = re.compile(
    r"\s(?:dot|convolution)\(|custom_call_target=\"(?:__cublas|__cudnn\$conv|__onednn\$matmul)|"
    r"\scustom-call\(.*" + re.escape(FLOPS_KEY)
)
_COLLECTIVE = re.compile(
    r"=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?P<start>-start)?\("
)
_ARRAY = re.compile(r"(pred|[suf]\d+|bf16)\[([\d,]*)\]")
_BYTES = {"pred": 1, "bf16": 2}
# Ops that launch nothing: not counted as ops of a loop body.
FREE_OPS = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all", "opt-barrier"}


def computations(hlo_text: str) -> dict[str, list[str]]:
    """Each computation's instruction lines, by name: an instruction's attributes that span lines
    (a TPU Pallas kernel's metadata: one JSON key a line) joined onto its first."""
    found: dict[str, list[str]] = {}
    current = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = found.setdefault(header.group(1), [])
        elif line.strip() == "}":
            current = None
        elif current is not None:
            if current and not _INSTRUCTION.match(line):
                current[-1] += " " + line.strip()
            else:
                current.append(line)
    return found


def instructions(lines: list[str]) -> list[tuple[str, str, str]]:
    """(name, opcode, the JAX op it came from) of each instruction line."""
    found = []
    for line in lines:
        match = _INSTRUCTION.match(line)
        if match:
            op_name = _OP_NAME.search(line)
            found.append((match.group(1), match.group(2), op_name.group(1) if op_name else ""))
    return found


def reachable(name: str, comps: dict[str, list[str]]) -> set[str]:
    """Computation `name` and every computation it calls, directly or not."""
    reach, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in reach:
            reach.add(current)
            todo.extend(callee for line in comps.get(current, []) for callee in _CALLS.findall(line))
    return reach


def loops(hlo_text: str) -> list[dict]:
    """Every while loop: its body, trip count (None when XLA does not know it), the product of
    the trip counts of the loops it runs inside (`outer_trips`), whether its body holds a matmul
    (the LSTM time loop does; the sampler's binary searches and, on CPU, the random number
    generator's rounds do not), the JAX op it came from (`source`), its body and what it calls
    (`computations`), and its body's ops by opcode, free ops left out."""
    comps = computations(hlo_text)
    parent_of = {}
    for name, lines in comps.items():
        for line in lines:
            match = _WHILE.search(line)
            if match:
                trip_count, op_name = KNOWN_TRIP_COUNT.search(line), _OP_NAME.search(line)
                parent_of[match.group(2)] = (
                    name,
                    int(trip_count.group(1)) if trip_count else None,
                    op_name.group(1) if op_name else "",
                )
    found = []
    for body, (parent, trips, source) in parent_of.items():
        outer = 1
        while parent in parent_of:
            outer *= parent_of[parent][1] or 1
            parent = parent_of[parent][0]
        inside = reachable(body, comps)
        ops = collections.Counter(opcode for _, opcode, _ in instructions(comps[body]) if opcode not in FREE_OPS)
        found.append(
            {
                "body": body,
                "source": source,
                "trip_count": trips,
                "outer_trips": outer,
                "matmul": any(holds_matmul(line) for name in inside for line in comps.get(name, [])),
                "computations": sorted(inside),
                "ops": dict(sorted(ops.items())),
            }
        )
    return found


def holds_matmul(line: str) -> bool:
    """Whether an HLO instruction's line is a matmul or a call of one (`_MATMUL`)."""
    return _MATMUL.search(line) is not None


def recurrence(hlo_text: str) -> dict:
    """The loops with matmuls (the recurrence: each iteration waits for the last, and the loops
    run one after another): their iterations per run of the program, the ops per iteration
    weighted by how often each body runs, the iterations of the other loops, and every loop."""
    found = loops(hlo_text)
    recurrent = [loop for loop in found if loop["matmul"]]
    runs = [(loop["trip_count"] or 0) * loop["outer_trips"] for loop in recurrent]
    ops = [sum(loop["ops"].values()) for loop in recurrent]
    total = sum(runs)
    return {
        "dependent_loop_iterations": total,
        "ops_per_iteration": sum(r * n for r, n in zip(runs, ops)) / total if total else 0.0,
        "other_loop_iterations": sum(
            (loop["trip_count"] or 0) * loop["outer_trips"] for loop in found if not loop["matmul"]
        ),
        "loops": found,
    }


def communication_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes that a compiled program's collectives produce, per collective kind: the result size
    of every all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute (async
    pairs counted once, by their results). Each op counts once: see `collectives_in_loops` for
    ops that run once per loop iteration."""
    totals: dict[str, int] = {}
    for match in _COLLECTIVE.finditer(hlo_text):
        size, shape = 0, match["shape"]
        if match["start"] and shape.startswith("("):
            shape = tuple_elements(shape)[1]  # an async start's tuple: (operands, results, ...)
        for dtype, dims in _ARRAY.findall(shape):
            itemsize = _BYTES.get(dtype) or int(dtype[1:]) // 8
            size += itemsize * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
        totals[match["op"]] = totals.get(match["op"], 0) + size
    return totals


def tuple_elements(shape: str) -> list[str]:
    """The top-level elements of a tuple shape: "((f32[8]), f32[64])" -> ["(f32[8])", "f32[64]"]."""
    elements, depth, start = [], 0, 1
    for i, c in enumerate(shape):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(c, 0)
        if (c == "," and depth == 1) or depth == 0:
            elements.append(shape[start:i].strip())
            start = i + 1
            if depth == 0:
                break
    return elements


def collectives_in_loops(hlo_text: str) -> list[str]:
    """The collectives of a compiled program that sit in a while loop's body, where they run at
    every iteration."""
    comps = computations(hlo_text)
    bodies = {m.group(2) for lines in comps.values() for line in lines for m in [_WHILE.search(line)] if m}
    return [line.strip()[:200] for body in bodies for line in comps[body] if _COLLECTIVE.search(line)]
