"""Host memory reuse for XLA on CPU: run CPU computations on the calling thread and keep the
memory they free in the process.

XLA:CPU allocates a step's temporaries afresh at every call. With JAX's asynchronous CPU
dispatch they are allocated on a worker thread, from a glibc arena whose large blocks go back to
the OS when freed, so every step touched tens of MB of new pages, each a page fault and a kernel
zero-fill: on `cpu_peer` about 17,800 faults per train step (65 ms; benchmarks/speed/throughput.py).
`keep_freed_memory()` runs CPU computations on the calling thread (main heap) and makes glibc
keep freed memory there (no mmap blocks, no trimming), so later steps reuse warm pages: about 50
faults and 50 ms per step, compile time unchanged. It changes neither results nor accelerator
runs (their buffers live on the device), and a Python loop no longer runs ahead of a CPU step it
dispatched.

Kept memory is not given back on its own, so after each program XLA compiles, the freed memory
is returned to the OS (malloc_trim): a compile's scratch (about 350 MB for the demo's train step)
would otherwise stay with the process for good, and a run that meets a new batch shape late
(benchmarks/robustness/soak.py) grew by that much each time. The steps after it fault their pages in once.
"""

from __future__ import annotations

import ctypes
import sys

import jax

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_COMPILED = "/jax/core/compile/backend_compile_duration"  # JAX's event after XLA compiles a program
_trim_registered = [False]


def keep_freed_memory() -> bool:
    """Call at start-up. Returns False where glibc malloc is absent (then only the dispatch
    changes)."""
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return False
    if not _trim_registered[0]:

        def trim_after_compile(event: str, duration_secs: float, **_: str | int) -> None:
            if event == _COMPILED:
                malloc_trim(0)

        jax.monitoring.register_event_duration_secs_listener(trim_after_compile)
        _trim_registered[0] = True
    return all(
        mallopt(parameter, value) == 1 for parameter, value in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
    )
