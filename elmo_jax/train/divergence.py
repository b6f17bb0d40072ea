"""When a training run has diverged, and what it then does: it stops (exit 1) with one line that
names the step, what went wrong, the last good checkpoint and the settings to change. A rerun
with changed settings resumes from that checkpoint.

A run has diverged when
- a step's loss or gradient norm is not finite, or the params or optimizer state after an
  update are not (checked before every save, so never saved);
- the mean training loss of a log window (or of the steps since the last one, checked before
  every save) is above `factor` x ln(V), V the vocabulary size: ln(V) is the loss of a model
  that predicts every word equally (full or sampled softmax), so a loss of `factor` times it is
  far worse than knowing nothing (never saved);
- the mean training loss has been above `factor` x the lowest window mean since the run
  (re)started for PATIENCE log windows in a row: checkpoints saved during those windows are
  moved to `diverged_checkpoints/` beside the checkpoints;
- a held-out perplexity is not finite (`elmo-jax eval` refuses such a model too): the
  checkpoint of that step, if saved, is moved aside the same way.
`factor` is config.train.divergence_factor (default 2); 0 turns off the two finite-loss rules.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from elmo_jax.checkpoint import Checkpoints
from elmo_jax.errors import RunFailed
from elmo_jax.settings import TrainSettings
from elmo_jax.train.step import TrainState

PATIENCE = 3  # log windows in a row above factor x the lowest window mean
ASIDE = "diverged_checkpoints"


class TrainingDiverged(RunFailed):
    pass


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def _steps(first: int, last: int) -> str:
    return f"step {last}" if first == last else f"steps {first}-{last}"


class DivergenceCheck:
    def __init__(self, checkpoints: Checkpoints, hp: TrainSettings, factor: float):
        self.checkpoints, self.hp, self.factor = checkpoints, hp, factor
        self.bound = factor * math.log(hp.n_tokens_vocab)  # the loss no run may log
        self.lowest = math.inf  # the lowest window mean since the run (re)started
        self.rising_since: int | None = None  # the first step of the current run of windows above factor x lowest
        self.rising = 0  # how many windows in that run

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """A step's loss and gradient norm (plain floats)."""
        if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
            raise self._diverged(step, f"loss {values['loss']} and gradient norm {values['grad_norm']}")

    def window(self, step: int, mean: float, steps: int) -> None:
        """A log window of `steps` steps ends at `step` with a mean loss `mean` (TrainWindow's):
        it is checked against both bounds."""
        if not steps:
            return
        self._check_bound(step, mean, steps)
        if self.factor and mean > self.factor * self.lowest:
            self.rising_since = step - steps + 1 if self.rising == 0 else self.rising_since
            self.rising += 1
            if self.rising >= PATIENCE:
                raise self._diverged(
                    step,
                    f"the mean training loss has stayed above {self.factor:g} x its lowest window mean "
                    f"({self.lowest:.3f}) since step {self.rising_since} (now {mean:.3f})",
                    since=self.rising_since,
                )
        else:
            self.rising = 0
        self.lowest = min(self.lowest, mean)

    def state(self, step: int, state: TrainState, mean: float, steps: int) -> None:
        """Before a save: the mean loss of the `steps` steps since the last window, and the
        params and optimizer state after the step's update."""
        if steps:
            self._check_bound(step, mean, steps)
        if not bool(_all_finite((state.params, state.opt_state))):
            raise self._diverged(step, "the update left non-finite params or optimizer state (not saved)")

    def heldout(self, step: int, result: dict[str, float]) -> None:
        """A held-out evaluation of the params at `step`."""
        if not all(math.isfinite(result[k]) for k in ("perplexity", "forward_perplexity", "backward_perplexity")):
            raise self._diverged(step, f"the held-out perplexity is not finite ({result['perplexity']})", since=step)

    def _check_bound(self, step: int, mean: float, steps: int) -> None:
        if self.factor and mean > self.bound:
            raise self._diverged(
                step,
                f"the mean training loss of {_steps(step - steps + 1, step)} is {mean:.4g}, above {self.factor:g} x "
                f"ln(vocabulary size) = {self.bound:.2f} (a uniform guess scores {self.bound / self.factor:.2f})",
            )

    def _diverged(self, step: int, what: str, since: int | None = None) -> TrainingDiverged:
        """The error for `what` at `step`, once the save in flight has landed; checkpoints of
        steps >= `since` are moved aside first."""
        self.checkpoints.wait()
        moved = self.checkpoints.steps_from(since) if since is not None else []
        self.checkpoints.set_aside(moved, ASIDE)
        last = max((s for s in self.checkpoints.manager.all_steps() if s not in moved), default=None)
        kept = (
            f"the latest checkpoint (step {last}) is the last good state"
            if last is not None
            else "no good checkpoint was saved"
        )
        if moved:
            kept += f" (saved since the divergence, step(s) {', '.join(map(str, moved))} moved to {ASIDE}/)"
        hp = self.hp
        return TrainingDiverged(
            f"step {step}: {what}: training diverged; {kept}. Lower config.train.learning_rate (now "
            f"{hp.learning_rate}{_scaled(hp)}), or check config.train.all_clip_norm_val (now "
            f"{hp.all_clip_norm_val}) and "
            f"config.train.initial_accumulator_value (now {hp.initial_accumulator_value}); a rerun with changed "
            f"values {'resumes from that checkpoint' if last is not None else 'starts afresh'}"
        )


def _scaled(hp: TrainSettings) -> str:
    """What the step applied, where the learning rate follows the global batch."""
    if hp.lr_batch_scaling == "none" or hp.devices < 1:
        return ""
    return f", applied as {hp.batch_learning_rate():.4g} for {hp.global_batch} rows: config.train.lr_batch_scaling"
