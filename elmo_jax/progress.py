"""A one-line progress bar with rate and ETA for long work (training, embedding), drawn only on
a terminal and only by process 0."""

from __future__ import annotations

import sys
import time

import jax


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ProgressBar:
    """A one-line bar with rate and ETA, drawn only when stdout is a terminal."""

    def __init__(self, total: int, unit: str = "step"):
        self.total, self.unit = total, unit
        self.enabled = sys.stdout.isatty() and jax.process_index() == 0
        self.start = time.monotonic()
        self.last_draw = 0.0

    def update(self, done: int, first: int = 0, suffix: str = "") -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last_draw < 0.2 and done < self.total):
            return
        self.last_draw = now
        rate = (done - first) / self.elapsed()
        eta = (self.total - done) / rate if rate > 0 else 0.0
        width = 30
        filled = int(width * done / max(self.total, 1))
        bar = "#" * filled + "." * (width - filled)
        sys.stdout.write(
            f"\r[{bar}] {done}/{self.total} {rate:.1f} {self.unit}/s ETA {format_duration(eta)} {suffix}\033[K"
        )
        sys.stdout.flush()

    def elapsed(self) -> float:
        """Seconds since `start` (more than 0)."""
        return max(time.monotonic() - self.start, 1e-9)

    def clear(self) -> None:
        if self.enabled:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()
