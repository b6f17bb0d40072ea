"""SIGTERM and SIGINT from a command's first instant to its last (docs/TRAINING.md, "Stop signals").

The handler does no I/O and raises nothing at the first signal: it records it, and the command
stops at its next `check()`, which raises `Stopped` there, where the code is ready for it, so
that every `finally` on the way out runs (temporaries removed, worker processes stopped) before
the command reports the stop in one line. Every loop that can run for more than a moment calls
`check()` (reading, tokenizing, evaluating, embedding; between the phases of a start). An
exception raised by the handler itself could land anywhere: inside the initialisation of a
compiled module, which then aborts the process, or in a finaliser, which swallows it. Only a
second signal raises `Stopped` at once, wherever it lands: the user insists. A stop under way is
not cut short by later signals.

Two kinds of stretch change that:

  critical()   a few operations that must not be parted (an output renamed into place): no
               Stopped inside; one that came meanwhile is raised at the end
  deferred()   training's steps: signals are recorded only; the loop sees `requested()`, saves
               the step it is at and stops. A second SIGINT raises KeyboardInterrupt (quit at
               once, without a checkpoint), and so does every SIGINT after it, wherever it
               lands; in a multi-process run, the first (the processes cannot agree on a step
               to stop at on SIGINT; JAX's own handler takes SIGTERM)
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """A stop signal. A BaseException, so that no library's `except Exception` swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


_received: list[int] = []  # every stop signal since `install`, in order
_state = {"installed": False, "raised": False, "critical": 0, "deferred": 0, "quit": False, "pipe": False}
_previous: dict[int, Any] = {}


def _handle(signum: int, frame: object) -> None:
    _received.append(signum)
    quitting = _state["deferred"] and _received.count(signal.SIGINT) >= _state["deferred"]
    if signum == signal.SIGINT and (quitting or _state["quit"]):  # and every SIGINT after: still quitting
        _state["quit"] = True
        raise KeyboardInterrupt
    if not _state["deferred"] and len(_received) > 1 and not _state["critical"] and not _state["raised"]:
        _state["raised"] = True  # a second signal: at once
        raise Stopped(_received[0])


def install() -> bool:
    """Our handler for SIGTERM and SIGINT, with nothing received yet; False (nothing done) where
    it is installed already. Only the main thread can install it."""
    if _state["installed"]:
        return False
    _received.clear()
    _state.update(installed=True, raised=False, critical=0, deferred=0, quit=False, pipe=False)
    for signum in SIGNALS:
        _previous[signum] = signal.signal(signum, _handle)
    return True


def uninstall() -> None:
    """The handlers `install` replaced, back, and what was received forgotten."""
    for signum, previous in _previous.items():
        signal.signal(signum, previous)
    _previous.clear()
    _received.clear()
    _state.update(installed=False, raised=False, critical=0, deferred=0, quit=False, pipe=False)


def closed_pipe() -> None:
    """Stdout's reader has gone (a closed pipe): a stop, as a SIGPIPE would have been (it does
    not count as a first signal: a SIGTERM after it is one)."""
    _state["pipe"] = True


def _first() -> int | None:
    return _received[0] if _received else signal.SIGPIPE if _state["pipe"] else None


def requested() -> str | None:
    """The name of the first stop signal received (SIGPIPE: stdout closed), or None."""
    first = _first()
    return None if first is None else signal.Signals(first).name


def check() -> None:
    """Raises Stopped if a signal came (outside a deferred or critical stretch)."""
    first = _first()
    if first is not None and not _state["deferred"] and not _state["critical"]:
        _state["raised"] = True
        raise Stopped(first)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """No Stopped inside; one that came meanwhile is raised at the end."""
    _state["critical"] += 1
    try:
        yield
    finally:
        _state["critical"] -= 1
    if not _state["raised"]:
        check()


@contextlib.contextmanager
def deferred(quit_at_sigint: int = 2) -> Iterator[None]:
    """Signals recorded only (see the module doc), but the `quit_at_sigint`-th SIGINT raises
    KeyboardInterrupt. Leaving raises nothing: a signal that came inside is the stretch's to act
    on (`requested`), and counts as dealt with."""
    _state["deferred"] = quit_at_sigint
    try:
        yield
    finally:
        _state["deferred"] = 0
        _state["raised"] = _first() is not None
