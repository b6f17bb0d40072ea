"""No silent NaN: a non-finite loss, gradient norm or update stops training with the latest
checkpoint as the last good state, and never gets saved."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from elmo_jax.config import TrainHParams
from elmo_jax.errors import RunFailed
from elmo_jax.train.checkpoint import Checkpoints
from elmo_jax.train.step import TrainState


class TrainingDiverged(RunFailed):
    pass


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


class DivergenceCheck:
    def __init__(self, checkpoints: Checkpoints, hp: TrainHParams):
        self.checkpoints, self.hp = checkpoints, hp

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """The step's loss and gradient norm (plain floats)."""
        if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
            raise self._diverged(step, f"loss {values['loss']} and gradient norm {values['grad_norm']}")

    def state(self, step: int, state: TrainState) -> None:
        """The params and optimizer state after the step's update, before they are saved."""
        if not bool(_all_finite((state.params, state.opt_state))):
            raise self._diverged(step, "the update left non-finite params or optimizer state (not saved)")

    def _diverged(self, step: int, what: str) -> TrainingDiverged:
        """The error for a non-finite `what` at `step`, once the save in flight has landed."""
        self.checkpoints.wait()
        hp = self.hp
        return TrainingDiverged(
            f"step {step}: {what}: training diverged; the latest checkpoint (step {self.checkpoints.latest_step()}) "
            f"is the last good state. Lower config.train.learning_rate (now {hp.learning_rate}), or check "
            f"config.train.all_clip_norm_val (now {hp.all_clip_norm_val}) and config.train.initial_accumulator_value "
            f"(now {hp.initial_accumulator_value}); a rerun with changed values resumes from that checkpoint"
        )
