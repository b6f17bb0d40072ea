"""Where training numbers go: metrics.jsonl and TensorBoard event files in the workdir
(tensorboardX: no TensorFlow needed). Only process 0 writes them."""

from __future__ import annotations

import json

import jax

from elmo_jax.workdir import Workdir


class MetricWriter:
    def __init__(self, workdir: Workdir):
        self.is_writer = jax.process_index() == 0
        self.jsonl = None
        self.tensorboard = None
        if self.is_writer:
            from tensorboardX import SummaryWriter

            self.jsonl = open(workdir.metrics_jsonl, "a")
            self.tensorboard = SummaryWriter(str(workdir.tensorboard))

    def write(self, step: int, kind: str, values: dict[str, float]) -> None:
        """One record: `kind` is "train" or "eval"; values are plain floats."""
        if not self.is_writer:
            return
        self.jsonl.write(json.dumps({"step": step, "kind": kind, **values}) + "\n")
        self.jsonl.flush()
        for name, value in values.items():
            self.tensorboard.add_scalar(f"{kind}/{name}", value, step)
        self.tensorboard.flush()

    def close(self) -> None:
        if self.is_writer:
            self.jsonl.close()
            self.tensorboard.close()
