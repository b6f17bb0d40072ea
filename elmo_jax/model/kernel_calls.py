"""What our Pallas kernels (`cell_kernels`, `char_kernels`, `softmax_kernels`) share with each
other and with `elmo_jax.plan`: the custom call's metadata keys that declare a kernel's bytes and
FLOPs, the bytes of arrays, outputs as device-varying as their inputs, where our kernels cannot
run, which variant runs (`tiled()`) and the padding of dimensions to whole blocks."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp

from elmo_jax.errors import UserError
from elmo_jax.model.backend import backend

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
