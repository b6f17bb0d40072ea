"""Orbax checkpoints of everything that decides where training is: the TrainState (params,
optimizer state, carried LSTM state, step, rng) and the batcher's position.

The batcher position of every global row is saved as a (B, 3) array sharded like the batch, so
each process writes and reads its own rows; the rest of the batcher state is JSON. Saves are
atomic (Orbax writes to a temporary folder and renames) and asynchronous; a run killed mid-save
leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from elmo_jax.train.parallel import DataParallel
from elmo_jax.train.step import TrainState

log = logging.getLogger(__name__)


class Checkpoints:
    def __init__(self, directory: str | Path, every: int = 1000, keep: int = 3):
        self.directory = Path(directory).absolute()
        self.every = max(every, 1)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True)
        handlers = {
            "state": ocp.StandardCheckpointHandler(),
            "rows": ocp.StandardCheckpointHandler(),
            "data": ocp.JsonCheckpointHandler(),
        }
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def softmax_table_rows(self) -> int:
        """Rows of the softmax table in the latest checkpoint, read from its metadata."""
        return self.manager.item_metadata(self.latest_step())["state"]["params"]["softmax"]["W"].shape[0]

    def is_due(self, step: int) -> bool:
        """Every `every` steps (Orbax's own policy also saves at every step until a first
        checkpoint has landed, which an asynchronous save takes a while to do)."""
        return step % self.every == 0

    def save(self, step: int, state: TrainState, data_state: dict, parallel: DataParallel) -> None:
        """Starts an asynchronous save; the previous one is finished first. `data_state` is the
        batcher state of this process's rows."""
        self.manager.wait_until_finished()
        local = np.asarray(data_state["rows"], np.int32)
        rows = jax.make_array_from_process_local_data(parallel.rows, local, (data_state["batch_size"], 3))
        meta = {k: v for k, v in data_state.items() if k != "rows"}
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), rows=ocp.args.StandardSave({"positions": rows}), data=ocp.args.JsonSave(meta)
        )
        if not self.manager.save(step, args=args, force=True):
            raise RuntimeError(f"Orbax did not save the checkpoint of step {step} in {self.directory}")

    def save_and_wait(self, step: int, state: TrainState, data_state: dict, parallel: DataParallel, tries: int = 3) -> None:
        """A save that has landed on return (for preemption). A signal arriving during an
        asynchronous write can make it fail without a trace, so it is checked and retried."""
        for _ in range(tries):
            self.save(step, state, data_state, parallel)
            self.wait()
            if self.manager.latest_step() == step:
                return
            log.warning("the checkpoint of step %d did not land in %s; saving it again", step, self.directory)
            self.manager.reload()
        raise RuntimeError(f"the checkpoint of step {step} did not land in {self.directory}")

    def restore_state(self, abstract_state: TrainState) -> TrainState:
        """The latest TrainState, shaped and sharded like `abstract_state`."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        return self.manager.restore(self.latest_step(), args=args).state

    def restore(self, abstract_state: TrainState, parallel: DataParallel, batch_size: int) -> tuple[TrainState, dict]:
        """The latest TrainState and the batcher state of this process's rows."""
        rows = jax.ShapeDtypeStruct((batch_size, 3), np.int32, sharding=parallel.rows)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), rows=ocp.args.StandardRestore({"positions": rows}), data=ocp.args.JsonRestore()
        )
        restored = self.manager.restore(self.latest_step(), args=args)
        shards = sorted(restored.rows["positions"].addressable_shards, key=lambda s: s.index[0].start or 0)
        local = np.concatenate([np.asarray(s.data) for s in shards])
        return restored.state, {**restored.data, "rows": local.tolist()}

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
