"""The backend the model is traced for: where it runs (`jax.default_backend()`), or the target
that `elmo_jax.plan` compiles for without having it. Matmul result dtypes, the LSTM schedule and
the block sizes of our kernels depend on it."""

from __future__ import annotations

import contextlib
import contextvars

import jax

_TARGET: contextvars.ContextVar[tuple[str, jax.Device | None] | None] = contextvars.ContextVar(
    "elmo_jax_traced_backend", default=None
)


def backend() -> str:
    """ "cpu", "gpu" or "tpu"."""
    target = _TARGET.get()
    return target[0] if target else jax.default_backend()


def device() -> jax.Device:
    """A device of the kind the model is traced for, to compile a kernel alone on (our kernels'
    block sizes): the target's abstract device within `tracing_for`, else this process's first."""
    target = _TARGET.get()
    if target and target[1] is not None:
        return target[1]
    return jax.local_devices()[0]


@contextlib.contextmanager
def tracing_for(platform: str, device: jax.Device | None = None):
    """Trace for `platform` ("gpu", "tpu") within the block, whatever this process runs on;
    `device`: one of the target's (abstract) devices."""
    token = _TARGET.set((platform, device))
    try:
        yield
    finally:
        _TARGET.reset(token)
