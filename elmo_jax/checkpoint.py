"""Orbax checkpoints of everything that decides where training is: the TrainState (params,
optimizer state, carried LSTM state, step, rng) and the batcher's position. Training writes
them; evaluation, embedding and export read the params (elmo_jax/workdir.py), so this module
knows nothing of training but a state's shape.

The batcher positions of every global row are saved as a (B, 3 per stream) array sharded like
the batch, so each process writes and reads its own rows; the rest of the batcher state is JSON.
Saves are atomic (Orbax writes to a temporary folder and renames) and asynchronous; a run killed
mid-save leaves the previous checkpoint as the latest.

Orbax checks no data checksums, so each item's folder also gets `checksums.json` (SHA-256 of
every file) before the checkpoint is committed. A restore takes the newest step whose files all
verify; a damaged or incomplete step is named in one line, skipped, and (by train) moved to
`damaged_checkpoints/` beside the checkpoints, so the run falls back to the previous one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from elmo_jax.errors import RunFailed, UserError
from elmo_jax.model import shapes_by_path
from elmo_jax.outputs import write_text

if TYPE_CHECKING:
    from elmo_jax.model import Params

State = Any  # a pytree of jax.Arrays: training's TrainState

log = logging.getLogger(__name__)

ITEMS = ("state", "rows", "data")
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # a step folder Orbax is writing
SPACE_MARGIN = 0.1  # free space a save needs beyond the size of the checkpoint before it
MANIFEST = "checksums.json"


class DamagedCheckpoint(Exception):
    """A step folder that is not a complete, intact checkpoint; the message says why."""


class CheckpointSaveError(RunFailed):
    """A save that failed (a full disk, ...); the previous checkpoint is intact."""


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> None:
    """folder/checksums.json: the SHA-256 of every file under `folder`, by relative path."""
    digests = {str(p.relative_to(folder)): _digest(p) for p in _files(folder)}
    write_text(folder / MANIFEST, json.dumps(digests, indent=0, sort_keys=True) + "\n")


def verify_step(step_dir: Path) -> None:
    """Raises DamagedCheckpoint naming the first missing, extra-short or altered file."""
    if not step_dir.is_dir():
        raise DamagedCheckpoint("not a folder")
    for item in ITEMS:
        manifest = step_dir / item / MANIFEST
        if not manifest.is_file():
            raise DamagedCheckpoint(f"{item}/{MANIFEST} is missing (an incomplete checkpoint)")
        try:
            digests = json.loads(manifest.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DamagedCheckpoint(f"{item}/{MANIFEST} is unreadable ({e})") from None
        for name, digest in digests.items():
            path = step_dir / item / name
            if not path.is_file():
                raise DamagedCheckpoint(f"{item}/{name} is missing")
            if _digest(path) != digest:
                raise DamagedCheckpoint(f"{item}/{name} does not match its checksum")


def _process_0s(value: int) -> int:
    """Process 0's `value` on every process: what process 0 decided, for all."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _with_checksums(handler):
    """An Orbax handler whose finalize (after its own, before the checkpoint is committed, that
    is renamed into place) also has process 0 write the item folder's checksums. The instance
    keeps its class, which Orbax's save/restore args are registered with."""
    finalize = handler.finalize

    def finalize_with_checksums(directory) -> None:
        finalize(directory)
        if jax.process_index() == 0:
            write_manifest(Path(directory))

    handler.finalize = finalize_with_checksums
    return handler


class Checkpoints:
    def __init__(self, directory: str | Path, every: int = 1000, keep: int = 3, clean_up: bool = False):
        """`clean_up` (the training run, sole writer): unfinished saves of a killed run are removed."""
        self.directory = Path(directory).absolute()
        self.every = max(every, 1)
        unfinished = sorted(p.name for p in self.directory.glob(f"*{TMP_SUFFIX}*")) if clean_up else []
        if unfinished and jax.process_index() == 0:
            log.info("removing unfinished checkpoints of a killed run in %s: %s", self.directory, ", ".join(unfinished))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=True, create=True, cleanup_tmp_directories=clean_up
        )
        handlers = {
            "state": _with_checksums(ocp.StandardCheckpointHandler()),
            "rows": _with_checksums(ocp.StandardCheckpointHandler()),
            "data": _with_checksums(ocp.JsonCheckpointHandler()),
        }
        self._in_flight = 0  # the step of the latest save started
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def good_step(self, quarantine: bool = False) -> int | None:
        """The newest step whose files verify (None if there is none). Damaged or incomplete
        steps are named in one line each and skipped; with `quarantine` (a training run, which
        will write new steps) they are moved to `damaged_checkpoints/` first. Process 0 decides
        for all."""
        chosen = -1
        if jax.process_index() == 0:
            for step in sorted(self.manager.all_steps(), reverse=True):
                try:
                    self._verify(step)
                    chosen = step
                    break
                except DamagedCheckpoint as e:
                    log.warning(
                        "the checkpoint of step %d in %s is damaged (%s): %s",
                        step,
                        self.directory,
                        e,
                        "moving it aside and using the previous one" if quarantine else "using the previous one",
                    )
                    if quarantine:
                        self.set_aside([step], "damaged_checkpoints")
        chosen = _process_0s(chosen)
        self.manager.reload()
        return None if chosen < 0 else chosen

    def _verify(self, step: int) -> None:
        step_dir = self.directory / str(step)
        if all((step_dir / item).is_dir() and not (step_dir / item / MANIFEST).exists() for item in ITEMS):
            log.warning(
                "the checkpoint of step %d in %s has no checksums (an older elmo_jax wrote it): not verified",
                step,
                self.directory,
            )
            return
        verify_step(step_dir)

    def set_aside(self, steps: list[int], folder: str) -> None:
        """Moves the checkpoints of `steps` to `folder` beside the checkpoints (as STEP-TIME), out
        of reach of a resume (process 0 does)."""
        if jax.process_index() != 0 or not steps:
            return
        aside = self.directory.parent / folder
        aside.mkdir(exist_ok=True)
        for step in steps:
            os.rename(self.directory / str(step), aside / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.manager.reload()

    def steps_from(self, first: int) -> list[int]:
        """The saved steps >= `first`."""
        return [s for s in self.manager.all_steps() if s >= first]

    def softmax_table_rows(self, step: int) -> int:
        """Rows of the softmax table in the checkpoint of `step`, read from its metadata."""
        return self.manager.item_metadata(step)["state"]["params"]["softmax"]["W"].shape[0]

    def is_due(self, step: int) -> bool:
        """Every `every` steps (Orbax's own policy also saves at every step until a first
        checkpoint has landed, which an asynchronous save takes a while to do)."""
        return step % self.every == 0

    def save(self, step: int, state: State, data_state: dict, rows: jax.sharding.Sharding) -> None:
        """Starts an asynchronous save; the previous one is finished first, and the free space
        checked. `data_state` is the batcher state of this process's rows, laid out over the
        processes by `rows` (the batch's sharding of rows)."""
        self.wait()
        self._check_space(step, state)
        local = np.asarray(data_state["rows"], np.int32)
        positions = jax.make_array_from_process_local_data(rows, local, (data_state["batch_size"], local.shape[1]))
        meta = {k: v for k, v in data_state.items() if k != "rows"}
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            rows=ocp.args.StandardSave({"positions": positions}),
            data=ocp.args.JsonSave(meta),
        )
        try:
            saved = self.manager.save(step, args=args, force=True)
            self._in_flight = step
        except Exception as e:
            raise self._save_error(step, e) from None
        if not saved:
            raise CheckpointSaveError(f"Orbax did not save the checkpoint of step {step} in {self.directory}")

    def _check_space(self, step: int, state: State) -> None:
        """Raises CheckpointSaveError, before anything is written, when the checkpoint folder's
        file system has less free space than the latest checkpoint's size (the state's bytes for
        a first one) plus SPACE_MARGIN. Process 0 decides for all."""
        short, detail = 0, "found by process 0"
        if jax.process_index() == 0:
            latest = self.manager.latest_step()
            if latest is None:
                size = sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(state))
            else:
                size = sum(p.stat().st_size for p in (self.directory / str(latest)).rglob("*") if p.is_file())
            needed, free = int(size * (1 + SPACE_MARGIN)), shutil.disk_usage(self.directory).free
            short, detail = int(free < needed), f"about {needed:,} bytes needed, {free:,} free"
        if _process_0s(short):
            raise CheckpointSaveError(
                f"no space for the checkpoint of step {step} in {self.directory} ({detail}); "
                f"nothing was written, {self._previous(step)}. Free some space (or move the workdir) and run "
                "again: it resumes from there"
            )

    def _previous(self, step: int) -> str:
        previous = [s for s in self.manager.all_steps() if s < step]
        return f"the previous checkpoint (step {max(previous)}) is intact" if previous else "no checkpoint was lost"

    def _save_error(self, step: int, error: BaseException) -> CheckpointSaveError:
        while (cause := error.__cause__ or error.__context__) is not None:  # the root cause (an OSError)
            error = cause
        return CheckpointSaveError(
            f"saving a checkpoint in {self.directory} failed ({type(error).__name__}: {error}); {self._previous(step)}"
        )

    def save_and_wait(
        self, step: int, state: State, data_state: dict, rows: jax.sharding.Sharding, tries: int = 3
    ) -> None:
        """A save that has landed on return (for preemption). A signal arriving during an
        asynchronous write can make it fail without a trace, so it is checked and retried."""
        for _ in range(tries):
            self.save(step, state, data_state, rows)
            self.wait()
            if self.manager.latest_step() == step:
                return
            log.warning("the checkpoint of step %d did not land in %s; saving it again", step, self.directory)
            self.manager.reload()
        raise RuntimeError(f"the checkpoint of step {step} did not land in {self.directory}")

    def param_shapes(self, step: int) -> dict[str, tuple[int, ...]]:
        """The shapes of `step`'s params by path ("token_encoder/proj/W"), from the checkpoint's
        metadata: no array is read."""
        try:
            tree = self._state_handler().metadata(self._state_folder(step))
            params = getattr(tree, "tree", tree)["params"]
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"the checkpoint of step {step} in {self.directory} cannot be read: {str(e)[:300]}") from e
        return shapes_by_path(params)

    def restore_params(self, step: int, abstract_params: Params) -> Params:
        """Only the params of `step`'s state, shaped and placed like `abstract_params`: the
        optimizer state and the rest are not read."""
        tree = {"params": abstract_params}
        args = ocp.args.PyTreeRestore(
            item=tree, restore_args=ocp.checkpoint_utils.construct_restore_args(tree), partial_restore=True
        )
        try:
            return self._state_handler().restore(self._state_folder(step), args=args)["params"]
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"the checkpoint of step {step} in {self.directory} cannot be read: {str(e)[:300]}") from e

    def _state_folder(self, step: int) -> Path:
        return self.directory / str(step) / "state"

    @staticmethod
    def _state_handler() -> ocp.PyTreeCheckpointHandler:
        """The state item read on its own by its handler (a checkpointer would look for a step's
        metadata in the item's folder, and warn that it is missing)."""
        return ocp.PyTreeCheckpointHandler()

    def _restore(self, step: int, args):
        try:
            return self.manager.restore(step, args=args)
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"the checkpoint of step {step} in {self.directory} cannot be read: {str(e)[:300]}") from e

    def restore(
        self, step: int, abstract_state: State, rows: jax.sharding.Sharding, positions_shape: tuple[int, int]
    ) -> tuple[State, dict]:
        """The state of `step`, shaped and sharded like `abstract_state`, and the batcher state
        of this process's rows (the global rows' positions are `positions_shape`, see
        StreamBatcher, laid out by `rows`)."""
        positions = jax.ShapeDtypeStruct(positions_shape, np.int32, sharding=rows)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            rows=ocp.args.StandardRestore({"positions": positions}),
            data=ocp.args.JsonRestore(),
        )
        restored = self._restore(step, args)
        shards = sorted(restored.rows["positions"].addressable_shards, key=lambda s: s.index[0].start or 0)
        local = np.concatenate([np.asarray(s.data) for s in shards])
        return restored.state, {**restored.data, "rows": local.tolist()}

    def wait(self) -> None:
        """Waits for the save in flight; a failed one raises CheckpointSaveError."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            raise self._save_error(self._in_flight, e) from None

    def close(self) -> None:
        self.manager.close()
