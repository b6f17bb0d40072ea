"""Orbax checkpoints of everything that decides where training is: the TrainState (params,
optimizer state, carried LSTM state, step, rng) and the batcher's JSON position.

Saves are atomic (Orbax writes to a temporary folder and renames) and asynchronous; a run
killed mid-save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

from pathlib import Path

import orbax.checkpoint as ocp

from elmo_jax.train.step import TrainState


class Checkpoints:
    def __init__(self, directory: str | Path, every: int = 1000, keep: int = 3):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, save_interval_steps=max(every, 1), enable_async_checkpointing=True, create=True
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def should_save(self, step: int) -> bool:
        return self.manager.should_save(step)

    def save(self, step: int, state: TrainState, data_state: dict, force: bool = False) -> bool:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state))
        return self.manager.save(step, args=args, force=force)

    def restore(self, abstract_state: TrainState, step: int | None = None) -> tuple[TrainState, dict]:
        """The checkpoint at `step` (default latest), shaped like `abstract_state`."""
        step = self.latest_step() if step is None else step
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
        restored = self.manager.restore(step, args=args)
        return restored.state, restored.data

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
