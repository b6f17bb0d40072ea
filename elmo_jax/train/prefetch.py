"""Batches made and put on the devices in background threads, each paired with the batcher state
after it, so a checkpoint records exactly the batches the train step has consumed.

Two threads in a pipeline: one cuts the batches (StreamBatcher: numpy, which lets go of Python's
lock in its array loops), one hands them to the devices (`put`), so the two overlap on two cores."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator

from elmo_jax.text.batcher import Batch, StreamBatcher

_DONE = object()


class Prefetcher:
    def __init__(self, batcher: StreamBatcher, put: Callable[[Batch], Batch] = lambda batch: batch, depth: int = 4):
        """`put` turns a host batch into what the step takes (device arrays); yields (that
        batch, the batcher state after it)."""
        self._made: queue.Queue = queue.Queue(maxsize=2)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        made = ((batch, batcher.state()) for batch in batcher)
        put_each = ((put(batch), state) for batch, state in self._items(self._made))
        self._threads = [
            threading.Thread(target=self._run, args=(made, self._made), daemon=True, name="prefetch"),
            threading.Thread(target=self._run, args=(put_each, self._queue), daemon=True, name="prefetch-put"),
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, items: Iterable, out: queue.Queue) -> None:
        try:
            for item in items:
                if not self._put(out, item):
                    return
            self._put(out, _DONE)
        except BaseException as e:  # handed on to the consumer, raised there
            self._put(out, e)

    def _put(self, out: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _items(self, source: queue.Queue) -> Iterator:
        while not self._stop.is_set():
            try:
                item = source.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def __iter__(self) -> Iterator[tuple[Batch, dict]]:
        return self

    def __next__(self) -> tuple[Batch, dict]:
        item = self._queue.get()
        if item is _DONE:
            self._queue.put(_DONE)  # later calls stop too
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
