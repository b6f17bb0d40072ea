"""The kernels of a compiled accelerator program (`compiled.as_text()`) and what each costs, read
from the shapes alone: FLOPs of its dots and convolutions, bytes it reads and writes in device
memory, and how often it runs (the trip counts of the loops around it).

A kernel is each instruction of the entry computation, of a while loop's body or condition, or
of a called computation, that launches work: a fusion, a library call (cuBLAS, cuDNN), a copy,
a sort, a collective (a loop's condition only where its trip count is unknown); not an
uninitialised buffer's allocation (AllocateBuffer). Its bytes are its
operands plus its result, except where it touches less: an operand that the fusion only slices
is counted as the slices it reads, a fusion whose results slice what it computes as that share
of its operands, and a buffer updated in place (dynamic-update-slice, scatter) as the update
written. An async fusion (fusion-start, fusion-done) is one kernel,
counted as the fusion it wraps. Elementwise arithmetic is not counted in
FLOPs (a few per byte: memory-bound anyway)."""

from __future__ import annotations

import dataclasses
import functools
import math
import re

from elmo_jax.plan.hlo import FREE_OPS, computations, tuple_elements

_DEFINITION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_TYPE = re.compile(r"(pred|bf16|f8\w*|[suf]\d+|c\d+|token)\[([\d,]*)\]")
_ITEM_BYTES = {"pred": 1, "bf16": 2, "token": 0}
_OPERAND = re.compile(r"%([\w.\-]+)")
_ATTR = {
    name: re.compile(rf"\b{name}=\{{?%?([\w.\-, %]+?)\}}?(?:,|$| )")
    for name in ("calls", "body", "condition", "to_apply", "branch_computations")
}
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_DIMS = re.compile(r"\b(lhs_contracting_dims|rhs_contracting_dims)=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_CONV_TARGET = re.compile(r'custom_call_target="__cudnn\$conv(\w*)"')
CONTROL_OPS = {"while", "conditional", "call"}
SLICING_OPS = {"slice", "dynamic-slice", "gather"}
IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}  # ops that update operand 0 in place: their update operand
VIEW_OPS = {"bitcast", "reshape", "get-tuple-element"}
# Named scopes of the train step (jax.named_scope / the jitted functions' names), by priority.
PARTS = ("lstm", "token_encoder", "softmax", "sampler", "optimizer")


@dataclasses.dataclass
class Kernel:
    name: str
    opcode: str
    part: str  # "LSTM loops", "lstm", "token_encoder", ..., "collectives", "other"
    runs: int  # per run of the program: the product of the trip counts around it (a sort: times its passes)
    flops: float  # per run of the kernel
    bytes: float  # read and written in device memory, per run of the kernel
    dtype: str  # operand dtype of its matmuls ("" when it has none)
    source: str  # the JAX op it came from

    def seconds(self, target) -> float:
        """Its floor: the slower of its FLOPs at the target's peak for its dtype and its bytes at
        the target's memory bandwidth, plus one launch."""
        compute = self.flops / target.peak(self.dtype) if self.flops else 0.0
        return max(compute, self.bytes / target.hbm_bytes_per_s) + target.launch_s


SORT_TILE = 4096  # elements XLA's GPU sort merges in shared memory: 1024 threads x 4 (its sort emitter)


def bitonic_passes(n: int, tile: int = SORT_TILE) -> int:
    """Kernels of XLA's GPU sort of n elements, each a pass over the operands in device memory:
    a bitonic sort of 2^s >= n elements in s stages, stage i merging blocks of 2^(i + 1) with the
    xor masks 2^(i + 1) - 1, 2^(i - 1), ..., 1; every mask of at least `tile` is a kernel of its
    own, the smaller ones of a stage (of all the first stages, while they fit) run together in
    one kernel on tiles in shared memory."""
    stages, tiled = max(1, (n - 1).bit_length()), tile.bit_length() - 1
    return 1 + sum(i - tiled + 2 for i in range(tiled, stages))


def type_bytes(text: str) -> int:
    """Bytes of an HLO type: an array such as bf16[2,128]{1,0}, or a tuple of them."""
    total = 0
    for dtype, dims in _TYPE.findall(text):
        size = math.prod(int(d) for d in dims.split(",") if d)
        total += size * _ITEM_BYTES.get(dtype, max(int(re.sub(r"\D", "", dtype) or 8) // 8, 1))
    return total


def _dims(text: str) -> list[int]:
    match = _TYPE.search(text)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


def _dtype(text: str) -> str:
    match = _TYPE.search(text)
    return match.group(1) if match else ""


def _closing(text: str, depth: int) -> int:
    """The index in `text` of the parenthesis that closes `depth` open ones (the first one's,
    when `text` starts with it)."""
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return i
    return len(text)


class Instruction:
    """One line of HLO: name, result type, opcode, operand names and the rest."""

    def __init__(self, line: str):
        self.line = line
        definition = _DEFINITION.match(line)
        self.name = definition.group(1)
        rest = line[definition.end() :]
        if rest.startswith("("):  # a tuple type
            end = _closing(rest, 0)
            self.type, rest = rest[: end + 1], rest[end + 1 :].lstrip()
        else:
            self.type, _, rest = rest.partition(" ")
        self.opcode, _, args = rest.partition("(")
        end = _closing(args, 1)
        self.operands = _OPERAND.findall(args[:end])
        self.attrs = args[end + 1 :]

    def called(self, attr: str) -> list[str]:
        match = _ATTR[attr].search(self.attrs)
        return [c.strip().lstrip("%") for c in match.group(1).split(",")] if match else []


class Program:
    """A compiled program's text, parsed: its computations and every instruction by name."""

    def __init__(self, hlo_text: str):
        self.text = hlo_text
        self.computations = {
            name: [Instruction(line) for line in lines if _DEFINITION.match(line)]
            for name, lines in computations(hlo_text).items()
        }
        self.defs = {i.name: i for body in self.computations.values() for i in body}
        entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo_text, re.M)
        self.entry = entry.group(1)
        self.entry_params = dict(
            re.findall(r"([\w.\-]+): ((?:pred|bf16|[suf]\d+)\[[\d,]*\])", hlo_text[entry.end() :].split("\n", 1)[0])
        )

    def type(self, name: str) -> str:
        return self.defs[name].type if name in self.defs else self.entry_params.get(name, "")

    def kernels(self) -> list[Kernel]:
        found: list[Kernel] = []
        self._walk(self.entry, 1, False, found)
        return found

    def _walk(self, computation: str, runs: int, in_matmul_loop: bool, found: list[Kernel]) -> None:
        for inst in self.computations.get(computation, []):
            op = inst.opcode
            if op in FREE_OPS or op.endswith("-done") or 'custom_call_target="AllocateBuffer"' in inst.attrs:
                continue
            if op == "while":
                trips = _TRIPS.search(inst.attrs)
                n = int(trips.group(1)) if trips else 1
                body = inst.called("body")[0]
                matmul_loop = in_matmul_loop or self._has_matmul(body)
                self._walk(body, runs * n, matmul_loop, found)
                if not trips:  # with a known trip count the GPU runtime does not run the condition
                    self._walk(inst.called("condition")[0], runs * (n + 1), matmul_loop, found)
            elif op in CONTROL_OPS:
                for callee in inst.called("to_apply") + inst.called("branch_computations"):
                    self._walk(callee, runs, in_matmul_loop, found)
            else:
                found.append(self._kernel(inst, runs, in_matmul_loop))

    @functools.cache  # noqa: B019 (one Program per compiled text)
    def _has_matmul(self, computation: str) -> bool:
        for inst in self.computations.get(computation, []):
            if inst.opcode in ("dot", "convolution") or _CONV_TARGET.search(inst.attrs) or "__cublas" in inst.attrs:
                return True
            callees = [c for a in ("calls", "body", "to_apply", "branch_computations") for c in inst.called(a)]
            if any(self._has_matmul(c) for c in callees):
                return True
        return False

    def _kernel(self, inst: Instruction, runs: int, in_matmul_loop: bool) -> Kernel:
        flops, dtype = self._flops(inst)
        source = self._source(inst)
        if re.match(r"(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)", inst.opcode):
            part = "collectives"
        elif in_matmul_loop:
            part = "LSTM loops"
        else:
            scopes = re.findall(r"[\w]+", source)
            part = next((p for p in PARTS if p in scopes), "other")
        runs *= self._sort_passes(inst)
        return Kernel(inst.name, inst.opcode, part, runs, flops, self._bytes(inst), dtype, source)

    def _sort_passes(self, inst: Instruction) -> int:
        """Kernels a sort takes (`bitonic_passes` of its length), 1 for any other instruction."""
        sort = inst if inst.opcode == "sort" else None
        for callee in inst.called("calls") if inst.opcode == "fusion" else []:
            sort = next((i for i in self.computations.get(callee, []) if i.opcode == "sort"), sort)
        if sort is None:
            return 1
        dimension = int(re.search(r"dimensions=\{(\d+)\}", sort.attrs).group(1))
        return bitonic_passes(_dims(self.type(sort.operands[0]))[dimension])

    def _source(self, inst: Instruction) -> str:
        """The JAX op a kernel came from: its own, or the first one named inside a fusion."""
        found = _OP_NAME.search(inst.attrs)
        if found:
            return found.group(1)
        for callee in inst.called("calls"):
            for inner in self.computations.get(callee, []):
                found = _OP_NAME.search(inner.attrs)
                if found:
                    return found.group(1)
        return ""

    # -- FLOPs --------------------------------------------------------------------------------
    def _flops(self, inst: Instruction) -> tuple[float, str]:
        conv = _CONV_TARGET.search(inst.attrs)
        if inst.opcode == "custom-call" and conv:
            return self._conv_flops(inst, conv.group(1))
        total, dtype = 0.0, ""
        for callee in inst.called("calls"):
            f, d = self._fused_flops(callee)
            total, dtype = total + f, dtype or d
        if inst.opcode in ("dot", "convolution"):
            return self._fused_flops_of(inst)
        return total, dtype

    @functools.cache  # noqa: B019
    def _fused_flops(self, computation: str) -> tuple[float, str]:
        total, dtype = 0.0, ""
        for inst in self.computations.get(computation, []):
            if inst.opcode in ("dot", "convolution"):
                f, d = self._fused_flops_of(inst)
            else:
                f, d = 0.0, ""
                for callee in inst.called("calls"):
                    f2, d2 = self._fused_flops(callee)
                    f, d = f + f2, d or d2
            total, dtype = total + f, dtype or d
        return total, dtype

    def _fused_flops_of(self, inst: Instruction) -> tuple[float, str]:
        lhs = self.type(inst.operands[0])
        if inst.opcode == "dot":
            dims = dict(_DIMS.findall(inst.attrs))
            contracted = math.prod(_dims(lhs)[int(d)] for d in dims.get("lhs_contracting_dims", "").split(",") if d)
            return 2.0 * math.prod(_dims(inst.type)) * contracted, _dtype(lhs)
        labels = _DIM_LABELS.search(inst.attrs)
        kernel = _dims(self.type(inst.operands[1]))
        out_features = kernel[labels.group(2).index("o")] if labels else 1
        return 2.0 * math.prod(_dims(inst.type)) * math.prod(kernel) / out_features, _dtype(lhs)

    def _conv_flops(self, inst: Instruction, kind: str) -> tuple[float, str]:
        """cuDNN convolutions: 2 x (output positions) x (kernel size / output features), read
        from whichever of the operands and result is the forward output and the kernel."""
        labels = _DIM_LABELS.search(inst.attrs)
        a, b = (self.type(o) for o in inst.operands[:2])
        output, kernel = {"BackwardInput": (a, b), "BackwardFilter": (b, inst.type)}.get(kind, (inst.type, b))
        k = _dims(kernel)
        out_features = k[labels.group(2).index("o")] if labels else 1
        return 2.0 * math.prod(_dims(output)) * math.prod(k) / out_features, _dtype(a)

    # -- bytes --------------------------------------------------------------------------------
    def _bytes(self, inst: Instruction) -> float:
        result = self.type(inst.name)
        if inst.opcode == "custom-call" and result.startswith("("):
            result = _TYPE.search(result).group(0)  # the result, not the library's scratch space
        if inst.opcode == "fusion-start":  # an async fusion: ((operands), result, context)
            result = tuple_elements(result)[1]
        if inst.opcode in IN_PLACE:
            update = inst.operands[IN_PLACE[inst.opcode]]
            rest = [o for o in inst.operands[1:] if o != update]
            return 2.0 * type_bytes(self.type(update)) + sum(type_bytes(self.type(o)) for o in rest)
        callee = inst.called("calls")
        if inst.opcode not in ("fusion", "fusion-start") or not callee:
            return float(type_bytes(result) + sum(type_bytes(self.type(o)) for o in inst.operands))
        reads, in_place, written = self._fused_access(callee[0])
        total = 0.0
        for i, operand in enumerate(inst.operands):
            if i in in_place:
                continue
            total += reads.get(i, type_bytes(self.type(operand)))
        return total + (written if written is not None else type_bytes(result))

    @functools.cache  # noqa: B019
    def _fused_access(self, computation: str) -> tuple[dict[int, float], set[int], float | None]:
        """For a fused computation: bytes read of each parameter that is only sliced, the
        parameters updated in place, and the bytes written when its result is such an update
        (None: the whole result)."""
        body = self.computations[computation]
        by_name = {i.name: i for i in body}
        params = {
            i.name: int(re.match(r"\d+", i.line.split("parameter(")[1]).group(0))
            for i in body
            if i.opcode == "parameter"
        }
        users: dict[str, list[Instruction]] = {}
        for inst in body:
            for o in inst.operands:
                users.setdefault(o, []).append(inst)

        def through_views(name: str) -> list[tuple[Instruction, str]]:
            """The (user, operand name) pairs past views (bitcasts, reshapes)."""
            found = []
            for u in users.get(name, []):
                found += through_views(u.name) if u.opcode in VIEW_OPS else [(u, name)]
            return found

        def origin(name: str) -> str:
            while name in by_name and by_name[name].opcode in VIEW_OPS and by_name[name].operands:
                name = by_name[name].operands[0]
            return name

        root = next(i for i in body if i.line.lstrip().startswith("ROOT"))
        outputs = [by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]
        outputs = [by_name.get(origin(o.name), o) for o in outputs]
        in_place, written = set(), 0.0
        if outputs and all(o.opcode in IN_PLACE for o in outputs):
            for o in outputs:
                buffer = origin(o.operands[0])
                if buffer in params:
                    in_place.add(params[buffer])
                written += type_bytes(self.type(o.operands[IN_PLACE[o.opcode]]))
        reads = {}
        for name, index in params.items():
            uses = through_views(name)
            if uses and all(u.opcode in SLICING_OPS and u.operands[0] == n for u, n in uses):
                reads[index] = float(sum(type_bytes(u.type) for u, _ in uses))
        # Results that are slices of values computed here: only the elements they keep are
        # computed, so each parameter is read in that share (a reduction's operands too).
        if outputs and all(o.opcode == "slice" and origin(o.operands[0]) not in params for o in outputs):
            share = max(type_bytes(o.type) / type_bytes(self.type(o.operands[0])) for o in outputs)
            for name, index in params.items():
                reads.setdefault(index, share * type_bytes(by_name[name].type))
        return reads, in_place, (written if in_place else None)


def summarize(kernels: list[Kernel], target) -> dict:
    """Totals per program and per part: kernels launched, FLOPs, bytes, time floor."""
    parts: dict[str, dict] = {}
    for k in kernels:
        p = parts.setdefault(k.part, {"kernels": 0, "flops": 0.0, "bytes": 0.0, "seconds": 0.0})
        p["kernels"] += k.runs
        p["flops"] += k.runs * k.flops
        p["bytes"] += k.runs * k.bytes
        p["seconds"] += k.runs * k.seconds(target)
    total = {key: sum(p[key] for p in parts.values()) for key in ("kernels", "flops", "bytes", "seconds")}
    return {"total": total, "parts": dict(sorted(parts.items(), key=lambda kv: -kv[1]["seconds"]))}


def top(kernels: list[Kernel], target, n: int = 10) -> list[dict]:
    """The n kernels with the most estimated time per program run (runs x floor)."""
    ranked = sorted(kernels, key=lambda k: -k.runs * k.seconds(target))[:n]
    return [
        {
            "name": k.name,
            "part": k.part,
            "runs": k.runs,
            "seconds": k.runs * k.seconds(target),
            "flops": k.flops,
            "bytes": k.bytes,
            "dtype": k.dtype,
            "source": k.source,
        }
        for k in ranked
    ]
