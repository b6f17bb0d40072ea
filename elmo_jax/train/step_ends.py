"""When each dispatched step ended on the devices, noted by a thread that waits for its output:
from it, the time the devices had nothing to do while the loop waited for a batch.

The loop keeps one step in flight: while it waits for the next batch, the devices are still
running the step it last dispatched. They idle only from that step's end until the next
dispatch; the share of such time (`input_bound`) is what a slow input pipeline costs, where
the loop's own wait (which also covers the step still running) is not.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import jax


class StepEnds:
    def __init__(self):
        self._outputs: queue.SimpleQueue = queue.SimpleQueue()
        self._ended = threading.Condition()
        self._end: dict[int, float] = {}  # step number (of dispatch) -> when its output was ready
        self._last: tuple[int, Any] | None = None
        self._count = 0
        self._thread = threading.Thread(target=self._watch, daemon=True, name="step-ends")
        self._thread.start()

    def _watch(self) -> None:
        while (item := self._outputs.get()) is not None:
            number, output = item
            try:
                jax.block_until_ready(output)
            except Exception:  # a step that failed ended too; the loop reports its error
                pass
            with self._ended:
                self._end[number] = time.monotonic()
                self._ended.notify_all()

    def dispatched(self, output: Any) -> None:
        """A step was dispatched; `output` (a jax.Array: `is_ready`, `block_until_ready`) is
        ready when it has ended."""
        self._count += 1
        self._last = (self._count, output)
        self._outputs.put(self._last)

    def idle(self, asked: float, got: float) -> float:
        """Of a wait for a batch from `asked` to `got` (time.monotonic), the seconds after the
        last dispatched step had ended: the devices had nothing to do."""
        if self._last is None:
            return 0.0
        number, output = self._last
        if not output.is_ready():  # still running when the batch came: no idle time
            return 0.0
        with self._ended:
            self._ended.wait_for(lambda: number in self._end, timeout=1.0)
            end = self._end.get(number, got)
            for old in [n for n in self._end if n < number]:
                del self._end[old]
        return max(0.0, got - max(asked, end))

    def close(self) -> None:
        self._outputs.put(None)
        self._thread.join(timeout=5)
