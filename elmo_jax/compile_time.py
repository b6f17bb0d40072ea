"""Compilation, measured apart from the work: JAX's own monitoring events, summed since start-up,
and every program's XLA compilation logged with its time (at INFO from half a second, at DEBUG
below: Orbax's first save compiles a slice per replicated array, tens of 0.1 s programs).

`CompileClock()` takes a reading; `.since()` gives the seconds spent tracing, lowering and
compiling (or fetching from the persistent compilation cache) since then, the programs compiled
and how many of them came from that cache. `use_persistent_cache(folder)` turns the cache on for
every compile, so a second run of the same model compiles nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import jax

_DURATIONS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_PROGRAM = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_totals: dict[str, float] = {"seconds": 0.0, "programs": 0, "cached": 0}
_cached_before: list[float] = [0]  # cache hits counted at the previous program
_INFO_FROM_S = 0.5  # compiles shorter than this are logged at DEBUG
log = logging.getLogger(__name__)


def _on_duration(event: str, duration_secs: float, **metadata: str | int) -> None:
    fun_name = metadata.get("fun_name", "a program")
    if event in _DURATIONS:
        _totals["seconds"] += duration_secs
    if event == _PROGRAM:
        _totals["programs"] += 1
        cached = _totals["cached"] > _cached_before[0]
        _cached_before[0] = _totals["cached"]
        if cached:
            log.debug("loaded %s from the compile cache in %.1f s", fun_name, duration_secs)
        else:
            level = logging.INFO if duration_secs >= _INFO_FROM_S else logging.DEBUG
            log.log(level, "compiled %s in %.1f s", fun_name, duration_secs)


def _on_event(event: str, **_) -> None:
    if event == _CACHE_HIT:
        _totals["cached"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


@dataclasses.dataclass(frozen=True)
class Compiled:
    seconds: float
    programs: int
    cached: int

    def __str__(self) -> str:
        compiled = f"{self.programs - self.cached} compiled, {self.cached} from the persistent cache"
        return f"{self.programs} programs in {self.seconds:.1f} s ({compiled})"


class CompileClock:
    def __init__(self):
        self.start = dict(_totals)

    def since(self) -> Compiled:
        return Compiled(*(_totals[k] - self.start[k] for k in ("seconds", "programs", "cached")))


def use_persistent_cache(folder: str | Path) -> None:
    """Cache every compiled program in `folder` (JAX's persistent compilation cache)."""
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
