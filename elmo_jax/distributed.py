"""Joining a multi-process (multi-host) run: `jax.distributed.initialize` with a clear error
when the coordinator cannot be reached (JAX itself aborts the process with a bare
DEADLINE_EXCEEDED, naming neither the address nor the process)."""

from __future__ import annotations

import logging
import socket
import time

import jax

from elmo_jax.errors import UserError

log = logging.getLogger(__name__)


def _wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def initialize(coordinator: str, num_processes: int | None, process_id: int | None, timeout_s: int = 300) -> None:
    """`coordinator` "HOST:PORT" (process 0 serves it there), or "auto" for JAX's cluster
    detection (TPU pods, SLURM, Open MPI, ...), which also finds the process count and id."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
    if coordinator == "auto":
        jax.distributed.initialize(initialization_timeout=timeout_s)
        log.info("process %d of %d (cluster detected)", jax.process_index(), jax.process_count())
        return
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"coordinator={coordinator!r}: expected HOST:PORT or auto", ("coordinator",))
    if num_processes is None or process_id is None or not 0 <= process_id < num_processes:
        raise UserError(
            f"coordinator={coordinator!r} needs num_processes=N and process_id=I with 0 <= I < N "
            f"(got {num_processes} and {process_id})",
            ("coordinator", "num_processes", "process_id"),
        )
    if process_id != 0 and not _wait_for_port(host, int(port), timeout_s):
        raise ConnectionError(
            f"process {process_id} of {num_processes} could not reach the coordinator at {coordinator} within "
            f"{timeout_s}s: is process 0 running there, and is the address right?"
        )
    log.info(
        "process %d of %d joining the coordinator at %s (timeout %ds)",
        process_id,
        num_processes,
        coordinator,
        timeout_s,
    )
    jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=timeout_s)
