"""The terminal: log lines and the progress bar of long work (training, embedding) through one
rich Console, so that the bar stays below the log lines and neither overwrites the other.

Off a terminal (a file, a pipe, CI) log lines are plain lines on stdout and no bar is drawn;
only process 0 draws one.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from elmo_jax import stop_signals

_console: Console | None = None


def _terminal() -> Console | None:
    """The Console of a terminal stdout (None when stdout is not one)."""
    global _console
    if _console is None and sys.stdout.isatty():
        _console = Console(file=sys.stdout, highlight=False, markup=False)
    return _console


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class _ConsoleHandler(logging.Handler):
    """Prints each record through the terminal's Console: above a live progress bar."""

    def __init__(self, console: Console):
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(Text(self.format(record)), soft_wrap=True)
        except Exception:
            self.handleError(record)


class _StdoutHandler(logging.StreamHandler):
    """Log lines on stdout (a file, a pipe). A pipe whose reader has gone (`elmo-jax eval | head
    -1`) is a stop (stop_signals.closed_pipe), and stdout is /dev/null from then on: no more
    lines, and no "Logging error" for each."""

    def __init__(self):
        super().__init__(sys.stdout)

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            stop_signals.closed_pipe()
        else:
            super().handleError(record)


def log_handler() -> logging.Handler:
    """The handler for the root logger: through the Console on a terminal, else to stdout."""
    console = _terminal()
    return _ConsoleHandler(console) if console is not None else _StdoutHandler()


class _Rate(ProgressColumn):
    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        return Text(f"{task.speed:,.1f} {self.unit}/s" if task.speed else f"? {self.unit}/s")


class ProgressBar:
    """A bar with the count, the rate and the ETA, and a line of text after them; drawn only on
    a terminal, by process 0. `done` is where the work starts (a resumed run's step); with
    unit="bytes" the count and rate are sizes (kB, MB, ...) and total 0 is unknown. As a context
    manager it is closed on the way out."""

    def __init__(self, total: int, unit: str = "step", done: int = 0):
        import jax

        self.start = time.monotonic()
        console = _terminal() if jax.process_index() == 0 else None
        self._progress = None
        if console is not None:
            counts = (
                (DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else (MofNCompleteColumn(), _Rate(unit))
            )
            self._progress = Progress(
                BarColumn(),
                *counts,
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
                transient=True,
            )
            self._task = self._progress.add_task("", total=total or None, completed=done, info="")
            self._progress.start()

    def update(self, done: int, info: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, info=info)

    def elapsed(self) -> float:
        """Seconds since the bar was made (more than 0)."""
        return max(time.monotonic() - self.start, 1e-9)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *error) -> None:
        self.close()
