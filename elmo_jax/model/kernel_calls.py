"""What our Pallas kernels (`cell_kernels`, `char_kernels`, `softmax_kernels`) share with each
other and with `elmo_jax.plan`: the custom call's metadata keys that declare a kernel's bytes and
FLOPs, the bytes of arrays, outputs as device-varying as their inputs, where our kernels cannot
run, which variant runs (`tiled()`), the padding of dimensions to whole blocks, whether a GPU's
compiler takes a kernel at a block size (`refusal`), and a setting's "auto" (`auto_choice`)."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.errors import UserError
from elmo_jax.model.backend import backend, device, tracing_for

log = logging.getLogger(__name__)

BYTES_KEY = "elmo_jax.bytes"  # the custom call's metadata: bytes it reads and writes in device memory
FLOPS_KEY = "elmo_jax.flops"  # and the floating-point operations of its products, where it has any


def nbytes(*arrays: jax.Array | jax.ShapeDtypeStruct) -> int:
    """The bytes of arrays (or shapes and dtypes), each counted once per time it is listed."""
    return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in arrays)


def metadata(touched: int, flops: int | None = None) -> dict[str, str]:
    """A pallas_call's metadata declaring the bytes it moves (and its products' FLOPs), which
    `elmo_jax.plan` reads."""
    declared = {BYTES_KEY: json.dumps(int(touched))}
    return declared if flops is None else {**declared, FLOPS_KEY: json.dumps(int(flops))}


def product(a, b, contract: tuple[int, int] = (1, 0)) -> jax.Array:
    """a . b inside a kernel, contracting a's axis contract[0] with b's contract[1] (a @ b; (1, 1):
    a @ b's transpose), float32 out."""
    return jax.lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())), preferred_element_type=jnp.float32)


def like(x: jax.Array, shape: tuple[int, ...], dtype=None) -> jax.ShapeDtypeStruct:
    """An output of `shape` as device-varying as x (under shard_map)."""
    return jax.ShapeDtypeStruct(shape, dtype or x.dtype, manual_axis_type=jax.typeof(x).manual_axis_type)


def refuse_where_unable(
    setting: str, x: jax.Array, on_tpu: bool = False, values: tuple[str, ...] = ("pallas",)
) -> None:
    """Our kernels are Triton's (GPUs), some with TPU variants (Mosaic: `on_tpu`): a UserError on
    a TPU for those without, and on a CPU where x is device-varying (Pallas's interpreter, which
    runs them in the tests, cannot run inside the data-parallel train step's shard_map).
    `setting` names the setting that picked them, `values` its values that do."""
    picked = f"{setting}=" + " or ".join(repr(v) for v in values)
    if backend() == "tpu" and not on_tpu:
        raise UserError(f"{picked} has kernels for GPUs (Triton), none for TPUs: use {setting}='xla'")
    if backend() == "cpu" and jax.typeof(x).manual_axis_type.varying:
        raise UserError(
            f"{picked} has kernels for GPUs (Triton); on a CPU JAX's Pallas interpreter cannot run them "
            f"inside the data-parallel train step: use {setting}='xla'"
        )


def tiled() -> bool:
    """The kernels' TPU variants (Mosaic: a grid whose programs' operands are VMEM blocks that its
    pipeline fetches from device memory), where the model is traced for a TPU; else the GPU's
    (Triton). Read as `kernel_calls.tiled()`, so that a test patches it in one place."""
    return backend() == "tpu"


def whole_blocks(n: int, block: int) -> int:
    """n rounded up to whole blocks."""
    return -(-n // block) * block


def padded(n: int, block: int | None = None) -> int:
    """n rounded up to whole blocks of `block`, or (below one block, or without one) to a power
    of two, at least 16: a dimension a Triton block spans whole."""
    if block is not None and n >= block:
        return whole_blocks(n, block)
    return max(16, 1 << (n - 1).bit_length())


def compiled_by_triton() -> bool:
    """The model is traced for a GPU, and a GPU (or a target's abstract one) is there to compile for."""
    return backend() == "gpu" and device().platform == "gpu"


Operand = Callable[[tuple[int, ...], Any], jax.ShapeDtypeStruct]  # (shape, dtype) -> an operand of `refusal`'s program
Probes = dict[str, tuple[Callable[..., Any], tuple]]  # a kernel's name -> a function calling it, and its operands

_REFUSALS: dict[tuple, str | None] = {}
_PROBING = threading.Lock()


def refusal(key: tuple, build: Callable[[Operand], Probes]) -> str | None:
    """The compiler's reason why kernels cannot run on the device the model is traced for (its
    first line: a resource exhausted), or None where each compiles. `build(operand)`: the
    functions that call them, by kernel name, with their operands (made by `operand(shape,
    dtype)`), each compiled alone (`_compile_alone`) until one is refused. Once per `key` (the
    kernels' names and sizes), device kind and matmul precision (float32 products as TF32 or not
    stage different operands). Thread-safe."""
    on, precision = device(), jax.config.jax_default_matmul_precision
    key = (*key, on.platform, on.device_kind, precision)
    with _PROBING:
        if key not in _REFUSALS:
            # In a thread of its own: none of the asking trace's contexts (its mesh, which a
            # program of one device may not take the place of) but those named here.
            with concurrent.futures.ThreadPoolExecutor(1) as thread:
                _REFUSALS[key] = thread.submit(_compile_alone, build, on, precision).result()
        return _REFUSALS[key]


def _compile_alone(build: Callable[[Operand], Probes], on: jax.Device, precision) -> str | None:
    """`refusal`'s answer: build's functions compiled for `on`, over a mesh of `on` alone."""
    mesh = jax.sharding.Mesh(np.array([on]), ("block",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def operand(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    for name, (call, operands) in build(operand).items():
        call.__name__ = name  # in the compile log
        try:
            with (
                tracing_for("gpu", on),
                jax.default_matmul_precision(precision),
                jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
            ):
                lowered = jax.jit(call).lower(*operands)
            lowered.compile()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            return str(e).splitlines()[0]
    return None


def auto_choice(setting: str, what: str, unfit: Callable[[], str | None]) -> str:
    """ "xla" or "pallas": `setting`'s "auto" for the backend the model is traced for: our kernels
    on TPUs, and on GPUs unless `unfit()` says why they cannot run there (or fails: a compile
    error other than our blocks' not fitting), said once, XLA's `what` in their place; XLA's
    elsewhere."""
    if backend() == "tpu":
        return "pallas"
    if backend() != "gpu":
        return "xla"
    try:
        reason = unfit()
    except Exception as e:  # a compile error other than our blocks' not fitting: not ours to fail on
        reason = f"compiling them failed ({type(e).__name__}: {str(e).splitlines()[0][:300]})"
    if reason:
        say_once(f"{setting}='auto': XLA's {what}, as ours cannot run here: {reason}")
        return "xla"
    return "pallas"


@functools.cache
def say_once(message: str) -> None:
    """Log `message` once a process (a setting's "auto" resolved to XLA's path: each trace asks)."""
    log.warning(message)
