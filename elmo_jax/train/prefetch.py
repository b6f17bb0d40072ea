"""Batches made (and put on the devices) in a background thread, each paired with the batcher
state after it, so a checkpoint records exactly the batches the train step has consumed."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from elmo_jax.text.batcher import Batch, StreamBatcher

_DONE = object()


class Prefetcher:
    def __init__(self, batcher: StreamBatcher, put: Callable[[Batch], Batch] = lambda batch: batch, depth: int = 4):
        """`put` turns a host batch into what the step takes (device arrays); yields (that
        batch, the batcher state after it)."""
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(batcher, put), daemon=True, name="prefetch")
        self._thread.start()

    def _run(self, batcher: StreamBatcher, put: Callable[[Batch], Batch]) -> None:
        try:
            for batch in batcher:
                if not self._put((put(batch), batcher.state())):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[tuple[Batch, dict]]:
        return self

    def __next__(self) -> tuple[Batch, dict]:
        item = self._queue.get()
        if item is _DONE:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
