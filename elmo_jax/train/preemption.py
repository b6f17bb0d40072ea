"""Stopping a run cleanly on SIGTERM / SIGINT: every process stops at the same step, which the
loop then saves."""

from __future__ import annotations

import logging
import signal

import jax
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)


class Stopped(Exception):
    """Raised by a stop signal once the handler is set to interrupt (the final evaluation)."""


class Preemption:
    """SIGTERM and SIGINT, seen by every process at the same step. One process: a Python
    signal handler sets a flag the loop checks between steps (a second SIGINT quits at once).
    Several: JAX's preemption sync point (installed by jax.distributed.initialize) makes all of
    them stop at the same step on SIGTERM, so their collectives and the checkpoint save line up.
    Installed before any work, so a signal during start-up also ends the run cleanly."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = None  # the signal's name once one arrived
        self.interrupt = False  # raise Stopped from the handler instead of setting the flag
        self._previous = {}
        if jax.process_count() == 1:
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.requested == "SIGINT":
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        if self.interrupt:
            raise Stopped(self.requested)
        if signum == signal.SIGINT:
            log.info("SIGINT: stopping after this step with a checkpoint (press Ctrl-C again to quit without one)")

    def reached(self, step: int) -> bool:
        if jax.process_count() > 1 and not self.requested and multihost_utils.reached_preemption_sync_point(step):
            self.requested = "SIGTERM"
        return self.requested is not None

    def close(self):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
