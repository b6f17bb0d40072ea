"""The kernels of a compiled accelerator program (`compiled.as_text()`) and what each costs, read
from the shapes alone: FLOPs of its dots, convolutions and cuBLAS calls, bytes it reads and
writes in device memory, and how often it runs (the trip counts of the loops around it).

A kernel is each instruction of the entry computation, of a while loop's body or condition, or
of a called computation, that launches work: a fusion, a library call (cuBLAS, cuDNN), a copy,
a sort, a collective, a DMA (copy-start) (a loop's condition only where its trip count is
unknown); not an uninitialised buffer's allocation (AllocateBuffer), nor, on a TPU, scalar
arithmetic outside fusions (the loop counters: its scalar unit runs them beside the kernels).
A loop's trip count is read by `trips.trip_count`.

A kernel's bytes are its operands plus its results, except where it touches less: an operand
that the fusion only slices or gathers (itself or in a fusion nested in it) counts as the
elements of those slices that the fusion keeps (a slice or gather of them further on keeps
fewer); a fusion whose results slice what it computes reads that share of its operands; a
buffer updated in place (dynamic-update-slice, scatter) counts as the update written, whatever
other results the fusion has, and read too where a scatter adds its update to the old values.
Only arrays in device memory count (a TPU keeps many in its on-chip memory, memory space S(1),
and moves them there and back with DMAs). An async fusion (fusion-start, fusion-done) is one
kernel, counted as the fusion it wraps. Elementwise
arithmetic is not counted in FLOPs (a few per byte: memory-bound anyway). A convolution counts
the multiplications of its window that meet the input, not padding nor the holes of a dilated
input (TPU programs write batched matmuls and weight gradients as such convolutions)."""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np

from elmo_jax.model.kernel_calls import BYTES_KEY, FLOPS_KEY
from elmo_jax.plan.hlo import FREE_OPS, computations, holds_matmul, tuple_elements
from elmo_jax.plan.instruction import DEFINITION, Instruction, required
from elmo_jax.plan.trips import trip_count

_TYPE = re.compile(r"(pred|bf16|f8\w*|[suf]\d+|c\d+|token)\[([\d,]*)\](\{[^}]*\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
_ITEM_BYTES = {"pred": 1, "bf16": 2, "token": 0}
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_DIMS = re.compile(r"\b(lhs_contracting_dims|rhs_contracting_dims)=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_CONV_TARGET = re.compile(r'custom_call_target="__cudnn\$conv(\w*)"')
# A cuBLAS matmul (XLA picks one over its own kernels when it autotunes on the device): its
# contracting dimensions are in its backend config's JSON.
_GEMM_TARGET = re.compile(r'custom_call_target="__cublas\$')
_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
# The bytes (and FLOPs) a Pallas kernel of the model declares in its custom call's metadata (JSON: its quotes
# written \22 in a GPU program's text, plain in a TPU's kernel_metadata, one key a line).
_DECLARED_BYTES = re.compile(re.escape(BYTES_KEY) + r'(?:\\22|"):\s*(?:\\22|")(\d+)(?:\\22|")')
_DECLARED_FLOPS = re.compile(re.escape(FLOPS_KEY) + r'(?:\\22|"):\s*(?:\\22|")(\d+)(?:\\22|")')
CONTROL_OPS = {"while", "conditional", "call"}
SLICING_OPS = {"slice", "dynamic-slice", "gather"}
IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}  # ops that update operand 0 in place: their update operand
VIEW_OPS = {"bitcast", "reshape", "get-tuple-element"}
# Ops whose result's element i is computed from their operands' elements i alone.
ELEMENTWISE = {
    *("convert", "copy", "select", "compare", "clamp", "add", "subtract", "multiply", "divide", "maximum"),
    *("minimum", "negate", "abs", "sign", "floor", "ceil", "exponential", "exponential-minus-one", "log"),
    *("log-plus-one", "sqrt", "rsqrt", "tanh", "logistic", "power", "and", "or", "xor", "not", "is-finite"),
}
# Named scopes of the train step (jax.named_scope / the jitted functions' names), by priority.
PARTS = ("lstm", "token_encoder", "softmax", "sampler", "optimizer")
# What a kernel does, as far as its achieved rate goes: a collective; our Pallas kernel; a sort
# (a kernel a pass); one with products (dot, convolution, cuBLAS); one that gathers or scatters; one
# that reduces; anything else (elementwise fusions, copies, in-place updates), first that applies.
KINDS = ("collective", "pallas", "sort", "matmul", "gather_scatter", "reduction", "elementwise")
_GATHER_SCATTER = {"gather", "scatter"}


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
    loop: str = ""  # the body of the innermost while loop it runs in ("" outside loops)
    kind: str = "elementwise"  # its class (KINDS), for the rates measured per class (plan/rates.py)

    def floor(self, target) -> float:
        """The slower of its FLOPs at the target's peak for its dtype and its bytes at the
        target's memory bandwidth."""
        compute = self.flops / target.peak(self.dtype) if self.flops else 0.0
        return max(compute, self.bytes / target.hbm_bytes_per_s)

    def seconds(self, target) -> float:
        """Its floor, plus one launch."""
        return self.floor(target) + target.launch_s


SORT_TILE = 4096  # elements XLA's GPU sort merges in shared memory: 1024 threads x 4 (its sort emitter)


def bitonic_passes(n: int, tile: int = SORT_TILE) -> int:
    """Kernels of XLA's GPU sort of n elements, each a pass over the operands in device memory:
    a bitonic sort of 2^s >= n elements in s stages, stage i merging blocks of 2^(i + 1) with the
    xor masks 2^(i + 1) - 1, 2^(i - 1), ..., 1; every mask of at least `tile` is a kernel of its
    own, the smaller ones of a stage (of all the first stages, while they fit) run together in
    one kernel on tiles in shared memory."""
    stages, tiled = max(1, (n - 1).bit_length()), tile.bit_length() - 1
    return 1 + sum(i - tiled + 2 for i in range(tiled, stages))


def type_bytes(text: str, on_chip_too: bool = False) -> int:
    """Bytes in device memory of an HLO type: an array such as bf16[2,128]{1,0}, or a tuple of
    them; arrays in another memory space (a TPU's on-chip memory: {1,0:T(8,128)S(1)}) count 0
    unless `on_chip_too`."""
    total = 0
    for dtype, dims, layout in _TYPE.findall(text):
        space = _MEMORY_SPACE.search(layout)
        if space and space.group(1) != "0" and not on_chip_too:
            continue
        size = math.prod(int(d) for d in dims.split(",") if d)
        total += size * _ITEM_BYTES.get(dtype, max(int(re.sub(r"\D", "", dtype) or 8) // 8, 1))
    return total


def _dims(text: str) -> list[int]:
    match = _TYPE.search(text)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


def _dtype(text: str) -> str:
    match = _TYPE.search(text)
    return match.group(1) if match else ""


@dataclasses.dataclass
class Loop:
    body: str  # its body computation
    source: str  # the JAX op it came from
    trips: int  # iterations per run of the program, the loops around it included
    known: bool  # whether its trip count was read (else it counts as 1)
    matmul: bool  # whether it holds a matmul (the recurrence: the LSTM time loops)


class Program:
    """A compiled program's text, parsed: its computations and every instruction by name.
    `platform` is the target's ("cuda" or "tpu")."""

    def __init__(self, hlo_text: str, platform: str = "cuda"):
        self.text = hlo_text
        self.platform = platform
        self.computations = {
            name: [Instruction(line) for line in lines if DEFINITION.match(line)]
            for name, lines in computations(hlo_text).items()
        }
        self.defs = {i.name: i for body in self.computations.values() for i in body}
        entry = required(r"^ENTRY %?([\w.\-]+)", hlo_text, re.M)
        self.entry = entry.group(1)
        self.entry_params = dict(
            re.findall(r"([\w.\-]+): ((?:pred|bf16|[suf]\d+)\[[\d,]*\])", hlo_text[entry.end() :].split("\n", 1)[0])
        )

    def type(self, name: str) -> str:
        return self.defs[name].type if name in self.defs else self.entry_params.get(name, "")

    def kernels(self) -> list[Kernel]:
        return list(self._walked[0])

    def loops(self) -> list[Loop]:
        """Every while loop that runs, in the order the program reaches it."""
        return list(self._walked[1])

    @functools.cached_property
    def _walked(self) -> tuple[list[Kernel], list[Loop]]:
        kernels: list[Kernel] = []
        loops: list[Loop] = []
        self._walk(self.entry, 1, None, kernels, loops)
        return kernels, loops

    def _walk(self, computation: str, runs: int, loop: Loop | None, kernels: list[Kernel], loops: list[Loop]) -> None:
        for inst in self.computations.get(computation, []):
            op = inst.opcode
            if op in FREE_OPS or op.endswith("-done") or 'custom_call_target="AllocateBuffer"' in inst.attrs:
                continue
            if op == "custom-call-start" and not inst.operands:  # an offload's context; its update works
                continue
            if op == "while":
                trips = trip_count(inst, self.defs, self.computations)
                body = inst.called("body")[0]
                inner = Loop(
                    body,
                    self._source(inst),
                    runs * (trips or 1),
                    trips is not None,
                    bool(loop and loop.matmul) or self._has_matmul(body),
                )
                loops.append(inner)
                self._walk(body, inner.trips, inner, kernels, loops)
                if trips is None:  # with a known trip count the GPU runtime does not run the condition
                    self._walk(inst.called("condition")[0], runs * 2, inner, kernels, loops)
            elif op in CONTROL_OPS:
                for callee in inst.called("to_apply") + inst.called("branch_computations"):
                    self._walk(callee, runs, loop, kernels, loops)
            elif not (self.platform == "tpu" and self._scalar(inst)):
                kernels.append(self._kernel(inst, runs, loop))

    def _scalar(self, inst: Instruction) -> bool:
        """Whether an instruction is scalar arithmetic outside fusions: its result and operands
        are all rank 0 (on a TPU, its scalar unit's work)."""
        types = [inst.type] + [self.type(o) for o in inst.operands]
        return inst.opcode not in ("fusion", "custom-call") and all(
            not dims for text in types for _, dims, _ in _TYPE.findall(text)
        )

    @functools.cache  # noqa: B019 (one Program per compiled text)
    def _has_matmul(self, computation: str) -> bool:
        for inst in self.computations.get(computation, []):
            if holds_matmul(inst.line):
                return True
            callees = [c for a in ("calls", "body", "to_apply", "branch_computations") for c in inst.called(a)]
            if any(self._has_matmul(c) for c in callees):
                return True
        return False

    def _kernel(self, inst: Instruction, runs: int, loop: Loop | None) -> Kernel:
        flops, dtype = self._flops(inst)
        source = self._source(inst)
        if re.match(r"(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)", inst.opcode):
            part = "collectives"
        elif loop is not None and loop.matmul:
            part = "LSTM loops"
        else:
            scopes = re.split(r"[^a-z0-9_]+|__", source)  # a parameter's name: state_params__token_encoder__...
            part = next((p for p in PARTS if p in scopes), "other")
        passes = self._sort_passes(inst)
        loop_body = loop.body if loop else ""
        kind = self._kind(inst, part, flops, passes)
        return Kernel(
            inst.name, inst.opcode, part, runs * passes, flops, self._bytes(inst), dtype, source, loop_body, kind
        )

    def _kind(self, inst: Instruction, part: str, flops: float, passes: int) -> str:
        """Its class in KINDS."""
        if part == "collectives":
            return "collective"
        if inst.opcode == "custom-call" and _DECLARED_BYTES.search(inst.attrs):
            return "pallas"
        if passes > 1 or inst.opcode == "sort":
            return "sort"
        if flops:
            return "matmul"
        ops = {inst.opcode} | set().union(*(self._fused_ops(c) for c in inst.called("calls")))
        if ops & _GATHER_SCATTER:
            return "gather_scatter"
        return "reduction" if "reduce" in ops else "elementwise"

    @functools.cache  # noqa: B019
    def _fused_ops(self, computation: str) -> frozenset[str]:
        """The opcodes in a fused computation and the ones it calls."""
        ops = set()
        for inst in self.computations.get(computation, []):
            ops.add(inst.opcode)
            for callee in inst.called("calls"):
                ops |= self._fused_ops(callee)
        return frozenset(ops)

    def _sort_passes(self, inst: Instruction) -> int:
        """Kernels a sort takes (`bitonic_passes` of its length), 1 for any other instruction."""
        sort = inst if inst.opcode == "sort" else None
        for callee in inst.called("calls") if inst.opcode == "fusion" else []:
            sort = next((i for i in self.computations.get(callee, []) if i.opcode == "sort"), sort)
        if sort is None:
            return 1
        dimension = int(required(r"dimensions=\{(\d+)\}", sort.attrs).group(1))
        return bitonic_passes(_dims(self.type(sort.operands[0]))[dimension])

    def _source(self, inst: Instruction) -> str:
        """The JAX op a kernel came from: its own, or the first one named inside a fusion; for
        one that names none (DMAs, copies, an offload's update), that of its first operand, back
        to the parameter's name (the train state's leaf: state_params__lstm__...)."""
        while True:
            found = _OP_NAME.search(inst.attrs)
            if found:
                return found.group(1)
            for callee in inst.called("calls"):
                for inner in self.computations.get(callee, []):
                    found = _OP_NAME.search(inner.attrs)
                    if found:
                        return found.group(1)
            if not inst.operands:
                return ""
            moved = self.defs.get(inst.operands[0])
            if moved is None or moved.opcode == "parameter":
                return inst.operands[0]
            inst = moved

    # -- FLOPs --------------------------------------------------------------------------------
    def _flops(self, inst: Instruction) -> tuple[float, str]:
        conv = _CONV_TARGET.search(inst.attrs)
        if inst.opcode == "custom-call" and conv:
            return self._conv_flops(inst, conv.group(1))
        if inst.opcode == "custom-call" and _GEMM_TARGET.search(inst.attrs):
            return self._gemm_flops(inst)
        declared = _DECLARED_FLOPS.search(inst.attrs) if inst.opcode == "custom-call" else None
        if declared:  # a kernel of ours with products: in its first operand's dtype
            return float(declared.group(1)), _dtype(self.type(inst.operands[0]))
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

    def _gemm_flops(self, inst: Instruction) -> tuple[float, str]:
        """A cuBLAS call: 2 x its result's elements (the first of its tuple, beside the
        workspace) x the lhs's contracted size."""
        lhs = self.type(inst.operands[0])
        match = _GEMM_CONTRACTING.search(inst.attrs)
        dims = [int(d.strip('" ')) for d in match.group(1).split(",") if d.strip()] if match else []
        contracted = math.prod(_dims(lhs)[d] for d in dims)
        return 2.0 * math.prod(_dims(inst.type)) * contracted, _dtype(lhs)

    def _fused_flops_of(self, inst: Instruction) -> tuple[float, str]:
        lhs = self.type(inst.operands[0])
        if inst.opcode == "dot":
            dims = dict(_DIMS.findall(inst.attrs))
            contracted = math.prod(_dims(lhs)[int(d)] for d in dims.get("lhs_contracting_dims", "").split(",") if d)
            return 2.0 * math.prod(_dims(inst.type)) * contracted, _dtype(lhs)
        return 2.0 * self._convolution_products(inst), _dtype(lhs)

    def _convolution_products(self, inst: Instruction) -> int:
        """Multiplications of a convolution: for each output element, its kernel's input
        features times the window's taps that meet the input (not its padding, nor the holes
        of a dilated input)."""
        lhs_labels, kernel_labels, out_labels = required(_DIM_LABELS, inst.attrs).groups()
        lhs, kernel, out = _dims(self.type(inst.operands[0])), _dims(self.type(inst.operands[1])), _dims(inst.type)
        attribute = re.search(r"window=\{([^}]*)\}", inst.attrs)
        window = dict(re.findall(r"(\w+)=([\d_x-]+)", attribute.group(1))) if attribute else {}
        spatial = sorted(c for c in out_labels if c.isdigit())
        products = out[out_labels.index("b")] * out[out_labels.index("f")] * kernel[kernel_labels.index("i")]
        for i, d in enumerate(spatial):

            def field(key, default, i=i):
                return int(window[key].split("x")[i].split("_")[0]) if key in window else default

            n, m = lhs[lhs_labels.index(d)], out[out_labels.index(d)]
            size, stride, low = field("size", 1), field("stride", 1), field("pad", 0)
            dilate, kernel_dilate = field("lhs_dilate", 1), field("rhs_dilate", 1)
            position = np.arange(m)[:, None] * stride + np.arange(size)[None, :] * kernel_dilate - low
            meets = (position >= 0) & (position <= (n - 1) * dilate) & (position % dilate == 0)
            products *= int(meets.sum())
        return products

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
        declared = _DECLARED_BYTES.search(inst.attrs) if inst.opcode == "custom-call" else None
        if declared:  # a kernel of ours, which reads and writes parts of its operands and results
            return float(declared.group(1))
        result = self.type(inst.name)
        if inst.opcode == "custom-call" and result.startswith("("):
            result = required(_TYPE, result).group(0)  # the result, not the library's scratch space
        if inst.opcode == "fusion-start":  # an async fusion: ((operands), result, context)
            result = tuple_elements(result)[1]
        if inst.opcode == "copy-start":  # a DMA: (destination, source, context)
            result = tuple_elements(result)[0]
        if inst.opcode == "custom-call-update":  # an offload to a SparseCore: ((operands), results, context)
            return float(self._offload_bytes(inst, tuple_elements(result)[1]))
        if inst.opcode == "slice-start":  # a DMA of a slice: ((source), slice, sync flag)
            piece = tuple_elements(result)[1]
            read = type_bytes(piece, on_chip_too=True) if type_bytes(self.type(inst.operands[0])) else 0
            return float(read + type_bytes(piece))
        if inst.opcode in IN_PLACE:
            update = self.type(inst.operands[IN_PLACE[inst.opcode]])
            rest = [o for o in inst.operands[1:] if o != inst.operands[IN_PLACE[inst.opcode]]]
            in_place_write = type_bytes(update, on_chip_too=True) if type_bytes(self.type(inst.operands[0])) else 0
            in_place_write *= self._passes(inst)
            return float(type_bytes(update) + in_place_write + sum(type_bytes(self.type(o)) for o in rest))
        callee = inst.called("calls")
        if inst.opcode not in ("fusion", "fusion-start") or not callee:
            return float(type_bytes(result) + sum(type_bytes(self.type(o)) for o in inst.operands))
        reads, in_place, written = self._fused_access(callee[0])
        total = 0.0
        for i, operand in enumerate(inst.operands):
            whole = type_bytes(self.type(operand))  # 0 in on-chip memory
            total += (in_place[i] if i in in_place else reads.get(i, whole)) if whole else 0.0
        results = tuple_elements(result) if result.startswith("(") else [result]
        if len(results) != len(written):
            return total + type_bytes(result)
        return total + sum(type_bytes(r) if w is None else w for r, w in zip(results, written, strict=True))

    def _offload_bytes(self, update: Instruction, results: str) -> int:
        """Bytes of a SparseCore's gather (the rows it reads of the table, written out, and its
        indices) or scatter (its updates and indices read, as many bytes written), else its
        operands and results."""
        start = self.defs.get(update.operands[0])
        kind = re.search(r'"offload":"OFFLOAD_(\w+)"', start.attrs) if start else None
        operands = [type_bytes(self.type(o)) for o in update.operands[1:]]
        if kind and kind.group(1) == "GATHER":
            return 2 * type_bytes(results) + sum(operands[1:])
        if kind and kind.group(1) == "SCATTER":
            return sum(operands[1:]) + operands[-1]
        return type_bytes(results) + sum(operands)

    def _passes(self, update: Instruction) -> int:
        """Passes an in-place update makes over the elements it updates: 2 for a scatter whose
        combiner reads the old value (an add: read, then written), else 1 (written)."""
        combiner = update.called("to_apply")
        body = self.computations.get(combiner[0], []) if combiner else []
        root = next((i for i in body if i.line.lstrip().startswith("ROOT")), None)
        return 2 if root is not None and root.opcode != "parameter" else 1

    @functools.cache  # noqa: B019
    def _fused_access(self, computation: str) -> tuple[dict[int, float], dict[int, float], list[float | None]]:
        """For a fused computation: bytes read of each parameter that is only sliced; the
        parameters updated in place, each with the bytes written into it; and for each of its
        results the bytes it writes besides those: an update of a buffer that is not a
        parameter, what it updates; an update of a parameter, 0; any other result, None (whole)."""
        body = self.computations[computation]
        by_name = {i.name: i for i in body}
        params = {
            i.name: int(required(r"\A\d+", i.line.split("parameter(")[1]).group(0))
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
        in_place: dict[int, float] = {}
        written: list[float | None] = []
        for o in outputs:
            if o.opcode not in IN_PLACE:
                written.append(None)
                continue
            buffer, update = origin(o.operands[0]), type_bytes(self.type(o.operands[IN_PLACE[o.opcode]]), True)
            update *= self._passes(o)
            if buffer in params:
                in_place[params[buffer]] = in_place.get(params[buffer], 0.0) + update
            written.append(0.0 if buffer in params else update)

        @functools.cache
        def kept(name: str) -> float:
            """The share of `name`'s elements that the fusion computes: what the slices of it and
            the ops element by element on it keep (through views), 1 where anything else takes
            it (a result of the fusion, a reduction, a product)."""
            total, size = 0.0, math.prod(_dims(by_name[name].type))
            if size == 0:
                return 1.0
            for use, operand in through_views(name):
                if use.opcode in SLICING_OPS and use.operands[0] == operand:
                    total += math.prod(_dims(use.type)) / size * kept(use.name)
                elif use.opcode in ELEMENTWISE and math.prod(_dims(use.type)) == size:
                    total += kept(use.name)
                else:
                    return 1.0
            return min(1.0, total) if through_views(name) else 1.0

        def sliced(use: Instruction, name: str) -> float | None:
            """Bytes a use reads of `name` where it reads only slices of it (itself, or a fusion
            nested in this one that slices it), else None: a slice's elements that the fusion
            computes (`kept`: a gather whose rows are gathered again and sliced reads those)."""
            if use.opcode in SLICING_OPS:
                return float(type_bytes(use.type, True)) * kept(use.name) if use.operands[0] == name else None
            if use.opcode != "fusion" or not use.called("calls"):
                return None
            nested = self._fused_access(use.called("calls")[0])[0]
            at = [i for i, o in enumerate(use.operands) if o == name]
            return sum(nested[i] for i in at) if all(i in nested for i in at) else None

        reads: dict[int, float] = {}
        for name, index in params.items():
            uses = [sliced(u, n) for u, n in through_views(name)]
            if uses and None not in uses:
                reads[index] = sum(u for u in uses if u is not None)
        # Results that are slices of values computed here: only the elements they keep are
        # computed, so each parameter is read in that share (a reduction's operands too).
        if outputs and all(o.opcode == "slice" and origin(o.operands[0]) not in params for o in outputs):
            share = max(type_bytes(o.type, True) / type_bytes(self.type(o.operands[0]), True) for o in outputs)
            for name, index in params.items():
                reads.setdefault(index, share * type_bytes(by_name[name].type, True))
        return reads, in_place, written


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
