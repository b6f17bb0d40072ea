"""The backend the model is traced for: where it runs (`jax.default_backend()`), or the target
that `elmo_jax.plan` compiles for without having it. Matmul result dtypes and the LSTM
schedule depend on it."""

from __future__ import annotations

import contextlib
import contextvars

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("elmo_jax_traced_backend", default=None)


def backend() -> str:
    """ "cpu", "gpu" or "tpu"."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def tracing_for(platform: str):
    """Trace for `platform` ("gpu", "tpu") within the block, whatever this process runs on."""
    token = _TARGET.set(platform)
    try:
        yield
    finally:
        _TARGET.reset(token)
