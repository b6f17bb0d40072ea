"""Host memory reuse for XLA on CPU: keep freed memory in the process.

XLA:CPU allocates a step's temporaries afresh at every call. glibc's malloc serves large blocks
with mmap (or from per-thread arenas it trims) and returns them to the OS when freed, so every
step touches tens of MB of new pages, each a page fault and a kernel zero-fill: on `cpu_peer`
about 17,700 faults per train step, 10 ms of a 70 ms step (benchmarks/throughput.py).
`keep_freed_memory()` makes malloc serve everything from the main heap and never trim it, so
later steps reuse warm pages (about 1,200 faults per step). It only changes host malloc policy:
results are identical, and accelerator runs (whose buffers live on the device) are unaffected.
The process keeps its peak host memory until it exits, which a training run does anyway.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def keep_freed_memory() -> bool:
    """Sets glibc malloc to one never-trimmed heap and no mmap blocks; call at start-up,
    before JAX creates its threads. Returns False (and changes nothing) without glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    settings = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_ARENA_MAX, 1))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)
