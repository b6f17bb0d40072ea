"""Environment switches (ELMO_JAX_OFFLINE, ELMO_JAX_TRACEBACK) read as the ecosystem reads its
own (Hugging Face's HF_HUB_OFFLINE): 1, true, yes or on turn one on, 0, false, no, off or
nothing leave it off, in any case; anything else is refused naming the variable."""

from __future__ import annotations

import os

from elmo_jax.errors import UserError

_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def switch(name: str) -> bool:
    """Whether the environment variable `name` is on."""
    value = os.environ.get(name, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise UserError(f"{name}={os.environ[name]!r}: one of {', '.join(_ON)} (on) or {', '.join(_OFF[1:])} (off)")
