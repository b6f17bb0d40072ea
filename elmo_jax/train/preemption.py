"""Stopping a run cleanly on SIGTERM / SIGINT: every process stops at the same step, which the
loop then saves (the signals themselves: elmo_jax/stop_signals.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
from jax.experimental import multihost_utils

from elmo_jax import stop_signals


class Preemption:
    """SIGTERM and SIGINT, seen by every process at the same step. Outside the steps (start-up,
    the final evaluation) a signal stops the run at the code's next check, as
    `stop_signals.Stopped`. During them (`steps`), with
    one process, it is recorded and the loop stops at the next step with a checkpoint (a second
    SIGINT quits at once); with several, JAX's preemption sync point (installed by
    jax.distributed.initialize in place of our SIGTERM handler) makes all of them stop at the
    same step on SIGTERM, and SIGINT quits at once. Our handler is installed by the command
    line at its first instant, else (train called from Python) here, for the run."""

    def __init__(self):
        self._installed = jax.process_count() == 1 and stop_signals.install()
        self._sync_point_reached = False

    @property
    def requested(self) -> str | None:
        """The stop signal's name once one arrived."""
        return "SIGTERM" if self._sync_point_reached else stop_signals.requested()

    @contextlib.contextmanager
    def steps(self) -> Iterator[None]:
        with stop_signals.deferred(quit_at_sigint=2 if jax.process_count() == 1 else 1):
            yield

    def reached(self, step: int) -> bool:
        """Whether the run stops at `step` (every process gives the same answer)."""
        if jax.process_count() > 1:
            self._sync_point_reached = self._sync_point_reached or multihost_utils.reached_preemption_sync_point(step)
            return self._sync_point_reached
        return self.requested is not None

    def close(self):
        if self._installed:
            stop_signals.uninstall()
