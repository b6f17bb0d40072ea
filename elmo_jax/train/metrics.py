"""The training run's record: a log line per window of steps and per evaluation, and the same
numbers in metrics.jsonl and TensorBoard event files in the workdir (tensorboardX: no
TensorFlow needed). Only process 0 writes files."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import jax

from elmo_jax import strict_json
from elmo_jax.compile_time import CompileClock
from elmo_jax.outputs import write_text
from elmo_jax.progress import format_duration
from elmo_jax.torn_records import cut_torn_lines, cut_torn_records
from elmo_jax.train.evaluate import safe_exp
from elmo_jax.train.step_ends import StepEnds
from elmo_jax.workdir import Workdir

log = logging.getLogger(__name__)


class MetricWriter:
    def __init__(self, workdir: Workdir, start: int = 0):
        """A run (re)starting after step `start`: what a killed run recorded of the steps after
        its last checkpoint, which this run computes again, is left out (metrics.jsonl's records
        cut, TensorBoard's purged), so that no step is recorded twice."""
        self.jsonl: TextIO | None = None
        self.tensorboard: Any = None  # tensorboardX's SummaryWriter on the writing process
        if jax.process_index() == 0:  # the writing process
            from tensorboardX import SummaryWriter

            cut_torn_lines(workdir.metrics_jsonl)  # a crash's half-written record is not written onto
            _cut_after(workdir.metrics_jsonl, start)
            for events in sorted(workdir.tensorboard.glob("events.out.tfevents.*")):
                cut_torn_records(events)
            self.jsonl = open(workdir.metrics_jsonl, "a")
            self.tensorboard = SummaryWriter(str(workdir.tensorboard), purge_step=start + 1)

    def write(self, step: int, kind: str, values: dict[str, float]) -> None:
        """One record: `kind` is "train" or "eval"; values are plain floats (non-finite ones are
        null in metrics.jsonl and left out of TensorBoard)."""
        if self.jsonl is None or self.tensorboard is None:  # not the writing process
            return
        self.jsonl.write(strict_json.dumps({"step": step, "kind": kind, **values}) + "\n")
        self.jsonl.flush()
        for name, value in values.items():
            if math.isfinite(value):
                self.tensorboard.add_scalar(f"{kind}/{name}", value, step)
        self.tensorboard.flush()

    def close(self) -> None:
        if self.jsonl is not None and self.tensorboard is not None:
            self.jsonl.close()
            self.tensorboard.close()


def _cut_after(path: Path, step: int) -> None:
    """Leaves out of the JSON lines at `path` the records of steps after `step` (rewritten
    atomically, where there are such)."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) < len(lines):
        log.info("%s: left out %d record(s) of the steps after %d, run again now", path, len(lines) - len(kept), step)
        write_text(path, "".join(kept))


class TrainWindow:
    """The steps since the last log line: their summed metrics, tokens and time. `softmax`
    ("sampled" or "full") says what the train perplexities are of. Its time is the steps' own:
    what runs under `leave_out` (evaluations, step calls that compile) is not in the rates.
    Input-bound is the share of that time the devices had nothing to do while the loop waited
    for a batch (step_ends.py): the loop tells it each step it dispatches (`dispatched`)."""

    INPUT_BOUND_WARNING = 0.10  # the share of the window's time the devices idled for input that is warned about, once

    def __init__(self, writer: MetricWriter, total_steps: int, softmax: str):
        self.writer, self.total_steps, self.softmax = writer, total_steps, softmax
        self.last_loss = float("nan")
        self.warned_input_bound = False
        self.step_ends = StepEnds()
        self.restart()

    def restart(self) -> None:
        """An empty window from now."""
        self.start, self.steps, self.excluded = time.monotonic(), 0, 0.0
        self.tokens: float = 0
        self.sums: dict[str, float] = {}
        self.idled = 0.0  # seconds the devices had nothing to do while the loop waited for a batch

    @contextlib.contextmanager
    def waiting_for_input(self) -> Iterator[None]:
        """The loop waits for its batch inside: the part of it after the step in flight ended
        counts as input-bound."""
        asked = time.monotonic()
        try:
            yield
        finally:
            self.idled += self.step_ends.idle(asked, time.monotonic())

    def dispatched(self, output: jax.Array) -> None:
        """A step was dispatched; `output` (one of its results) is ready when it has ended."""
        self.step_ends.dispatched(output)

    def close(self) -> None:
        self.step_ends.close()

    @contextlib.contextmanager
    def leave_out(self, only_if_compiled: bool = False) -> Iterator[None]:
        """Leaves the time inside out of the rates: always (an evaluation), or when a program was
        compiled inside (a step call, which otherwise only dispatches the step)."""
        start, clock = time.monotonic(), CompileClock()
        try:
            yield
        finally:
            if not only_if_compiled or clock.since().programs:
                self.excluded += time.monotonic() - start

    def elapsed(self) -> float:
        """The window's seconds of stepping: wall time less what was left out."""
        return max(time.monotonic() - self.start - self.excluded, 1e-9)

    def mean_loss(self) -> tuple[float, int]:
        """The mean loss of the window's steps so far, and how many there are."""
        return self.sums.get("loss", 0.0) / max(self.steps, 1), self.steps

    def add(self, values: dict[str, float]) -> None:
        """One step's metrics as plain floats (loss, loss_forward, loss_backward, grad_norm, tokens)."""
        values = dict(values)
        self.steps += 1
        self.tokens += values.pop("tokens")
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.last_loss = values["loss"]

    def log(self, step: int, epoch: float) -> None:
        """Logs and writes the window's means, then starts a new window."""
        elapsed = self.elapsed()
        n = max(self.steps, 1)
        mean = {k: v / n for k, v in self.sums.items()}
        step_time = elapsed / n
        values = {
            **mean,
            "perplexity_forward": safe_exp(mean["loss_forward"]),
            "perplexity_backward": safe_exp(mean["loss_backward"]),
            "tokens_per_sec": self.tokens / elapsed,
            "step_time_s": step_time,
            "input_bound": min(self.idled / elapsed, 1.0),
            "epoch": epoch,
        }
        log.info(
            "step %d/%d | epoch %.2f | loss %.3f | train ppl fwd %.1f bwd %.1f (%s) | grad norm %.2f | "
            "%s tok/s | %.0f ms/step | input-bound %.0f%% | ETA %s",
            step,
            self.total_steps,
            epoch,
            mean["loss"],
            values["perplexity_forward"],
            values["perplexity_backward"],
            self.softmax,
            mean["grad_norm"],
            f"{values['tokens_per_sec']:,.0f}",
            1000 * step_time,
            100 * values["input_bound"],
            format_duration((self.total_steps - step) * step_time),
        )
        if values["input_bound"] > self.INPUT_BOUND_WARNING and not self.warned_input_bound:
            log.warning(
                "the devices had nothing to do %.0f%% of the time, waiting for batches: the host's input pipeline "
                "is slower than the devices (docs/DISTRIBUTED.md, 'What the host needs')",
                100 * values["input_bound"],
            )
            self.warned_input_bound = True
        self.writer.write(step, "train", values)
        self.restart()


def log_eval(step: int, result: dict[str, float], writer: MetricWriter) -> None:
    floor = f" (floor {result['floor_perplexity']:.2f})" if "floor_perplexity" in result else ""
    log.info(
        "step %d | held-out perplexity %.2f (forward %.2f, backward %.2f) over %d tokens%s",
        step,
        result["perplexity"],
        result["forward_perplexity"],
        result["backward_perplexity"],
        result["tokens"],
        floor,
    )
    writer.write(step, "eval", {k: float(v) for k, v in result.items()})
