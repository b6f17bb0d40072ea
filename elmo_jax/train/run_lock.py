"""One trainer per run folder: WORKDIR/train.lock, held with an advisory lock (flock) while a
run trains. The kernel drops the lock when its holder dies, however it dies, so a lock left by
a killed run is simply taken over; the file names the holder (host, PID) for the message a
second trainer gets."""

from __future__ import annotations

import fcntl
import logging
import os
import socket

from elmo_jax.errors import UserError
from elmo_jax.workdir import Workdir

log = logging.getLogger(__name__)


class RunLock:
    def __init__(self, workdir: Workdir):
        self.path = workdir.lock
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self.fd)
            raise UserError(
                f"{workdir} is in use by another training run ({holder or 'holder unknown'}; lock {self.path}): "
                "wait for it to end or stop it, or use another workdir"
            ) from None
        previous = self._holder()
        if previous:
            log.warning("taking over %s from a run that ended without releasing it (%s)", self.path, previous)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"host {socket.gethostname()}, pid {os.getpid()}\n".encode(), 0)
        os.fsync(self.fd)

    def _holder(self) -> str:
        assert self.fd is not None, "read while held"
        return os.pread(self.fd, 200, 0).decode(errors="replace").strip()

    def release(self) -> None:
        """Empties the file (a clean end) and drops the lock."""
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
