"""How many times a compiled program's while loop runs: XLA's known_trip_count where the
program writes it (GPU programs), else read from the loop's counter (TPU programs): the
constant it starts from, the constant the condition compares it with and the constant the
body adds to it."""

from __future__ import annotations

import re

from elmo_jax.plan.hlo import KNOWN_TRIP_COUNT
from elmo_jax.plan.instruction import Instruction, required

Defs = dict[str, Instruction]  # every instruction of the program, by name
Computations = dict[str, list[Instruction]]  # each computation's instructions, by name

_FLIPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}


def trip_count(loop: Instruction, defs: Defs, computations: Computations) -> int | None:
    """Iterations of the while loop `loop`; None where neither XLA's count nor a counter (a state
    element that starts at a constant, that the body adds a constant to and that the condition
    compares with a constant) is there."""
    known = KNOWN_TRIP_COUNT.search(loop.attrs)
    if known:
        return int(known.group(1))
    root = _root(computations, loop.called("condition")[0])
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = required(r"direction=(\w+)", root.attrs).group(1)
    a, b = root.operands
    if _element(defs, a) is None:
        a, b, direction = b, a, _FLIPPED.get(direction, direction)
    index, limit = _element(defs, a), _constant(defs, b)
    body_root = _root(computations, loop.called("body")[0])
    start = defs.get(loop.operands[0]) if loop.operands else None
    if index is None or limit is None or body_root is None or start is None or start.opcode != "tuple":
        return None
    first, step = _constant(defs, start.operands[index]), _increment(defs, body_root.operands[index], index)
    if first is None or not step:
        return None
    span = (limit - first) * (1 if step > 0 else -1)
    count = {
        ("LT", True): -(-span // abs(step)),
        ("LE", True): span // abs(step) + 1,
        ("GT", False): -(-span // abs(step)),
        ("GE", False): span // abs(step) + 1,
        ("NE", True): span // step if span % step == 0 else None,
    }.get((direction, step > 0))
    return None if count is None else max(count, 0)


def _root(computations: Computations, computation: str) -> Instruction | None:
    return next((i for i in computations.get(computation, []) if i.line.lstrip().startswith("ROOT")), None)


def _origin(defs: Defs, name: str) -> Instruction | None:
    """The instruction a value comes from, past copies, bitcasts and conversions."""
    inst = defs.get(name)
    while inst is not None and inst.opcode in ("copy", "bitcast", "convert") and inst.operands:
        inst = defs.get(inst.operands[0])
    return inst


def _constant(defs: Defs, name: str) -> int | None:
    inst = _origin(defs, name)
    value = re.search(r"constant\((-?\d+)\)", inst.line) if inst is not None and inst.opcode == "constant" else None
    return int(value.group(1)) if value else None


def _element(defs: Defs, name: str) -> int | None:
    """The index of the loop state's element that a value is (get-tuple-element of a parameter),
    else None."""
    inst = _origin(defs, name)
    if inst is None or inst.opcode != "get-tuple-element" or inst.operands[0] not in defs:
        return None
    if defs[inst.operands[0]].opcode != "parameter":
        return None
    return int(required(r"index=(\d+)", inst.attrs).group(1))


def _increment(defs: Defs, name: str, index: int) -> int | None:
    """The constant a loop body adds to element `index` of its state, when its next value
    (`name`) is that element plus a constant."""
    inst = _origin(defs, name)
    if inst is None or inst.opcode not in ("add", "subtract") or len(inst.operands) != 2:
        return None
    a, b = inst.operands
    if _element(defs, a) != index:
        if inst.opcode == "subtract":
            return None
        a, b = b, a
    value = _constant(defs, b)
    if _element(defs, a) != index or value is None:
        return None
    return -value if inst.opcode == "subtract" else value
