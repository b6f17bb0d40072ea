"""Checked restores: a damaged newest checkpoint falls back to the previous one; nothing
non-finite is saved; the workdir's vocabulary is the one the run recorded."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_training_run import losses, tiny_config

from elmo_jax.commands.eval import evaluate_workdir
from elmo_jax.errors import UserError
from elmo_jax.train import loop
from elmo_jax.train.divergence import TrainingDiverged
from elmo_jax.train.loop import train

pytestmark = pytest.mark.slow  # every test here trains a model


@pytest.fixture(scope="module")
def straight(tmp_path_factory, text_data):
    """An uninterrupted run of 12 steps: its final evaluation."""
    return train(tiny_config(text_data, max_steps=12), tmp_path_factory.mktemp("straight"))


def _largest_file(folder):
    return max(
        (p for p in folder.rglob("*") if p.is_file() and p.name != "checksums.json"), key=lambda p: p.stat().st_size
    )


def _delete(step_dir):
    _largest_file(step_dir / "state").unlink()


def _truncate(step_dir):
    path = _largest_file(step_dir / "state")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_bit(step_dir):
    path = _largest_file(step_dir / "state")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _empty(step_dir):
    for p in sorted(step_dir.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()


@pytest.mark.parametrize(
    "damage", [_delete, _truncate, _flip_bit, _empty], ids=["deleted", "truncated", "bit-flip", "empty"]
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, text_data, straight, damage, caplog):
    train(tiny_config(text_data, max_steps=8), tmp_path)  # checkpoints at 4 and 8
    damage(tmp_path / "checkpoints" / "8")
    caplog.set_level("WARNING")
    result = evaluate_workdir(tmp_path)
    assert result["step"] == 4 and "the checkpoint of step 8" in caplog.text and "damaged" in caplog.text
    assert train(tiny_config(text_data, max_steps=12), tmp_path) == straight
    assert [p.name.split("-")[0] for p in (tmp_path / "damaged_checkpoints").iterdir()] == ["8"]
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [4, 8, 12]


def test_non_finite_state_is_never_saved(tmp_path, text_data, monkeypatch):
    """A step whose loss is finite but whose update leaves a NaN (as Adagrad's 0/0 can) stops
    the run before its checkpoint; the latest checkpoint stays finite."""
    real = loop.make_train_step

    def nan_at_step_8(*args, **kwargs):
        step_fn = real(*args, **kwargs)

        def step(state, batch):
            state, metrics = step_fn(state, batch)
            poison = jnp.where(state.step == 8, jnp.nan, 0.0)
            params = {
                **state.params,
                "softmax": {**state.params["softmax"], "b": state.params["softmax"]["b"] + poison},
            }
            return state.replace(params=params), metrics

        return step

    monkeypatch.setattr(loop, "make_train_step", nan_at_step_8)
    with pytest.raises(
        TrainingDiverged, match=r"step 8: the update left non-finite .* latest checkpoint \(step 4\).*learning_rate"
    ):
        train(tiny_config(text_data, max_steps=12), tmp_path)
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [4]
    assert max(losses(tmp_path)) == 8  # its loss was finite: the update made the NaN


def test_eval_of_a_non_finite_model_fails(tmp_path, text_data, monkeypatch):
    from elmo_jax.errors import RunFailed
    from elmo_jax.train import evaluate as evaluation

    train(tiny_config(text_data, max_steps=4), tmp_path)
    real = evaluation.evaluate
    monkeypatch.setattr(
        evaluation, "evaluate", lambda params, *a, **k: real(jax.tree.map(lambda x: x * np.nan, params), *a, **k)
    )
    with pytest.raises(RunFailed, match="perplexity is not finite"):
        evaluate_workdir(tmp_path)


def test_a_changed_or_half_written_vocabulary_is_refused(tmp_path, text_data):
    train(tiny_config(text_data, max_steps=4), tmp_path)
    path = tmp_path / "vocab.txt"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # cut mid-file, as a full disk leaves it
    words = len(text.splitlines())
    with pytest.raises(
        UserError, match=rf"vocab.txt \(\d+ words, .*\) is not the vocabulary this run recorded .*\({words} words"
    ):
        train(tiny_config(text_data, max_steps=8), tmp_path)
    with pytest.raises(UserError, match="is not the vocabulary this run recorded"):
        evaluate_workdir(tmp_path)
    path.write_text(text)
    assert evaluate_workdir(tmp_path)["step"] == 4
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temporary files
    assert json.loads((tmp_path / "config.json").read_text())["vocabulary"]["words"] == words
    assert os.access(tmp_path / "train.lock", os.R_OK) and (tmp_path / "train.lock").read_text() == ""  # released


def test_the_unfinished_save_of_a_killed_run_is_removed_when_training_resumes(tmp_path, text_data, caplog):
    train(tiny_config(text_data, max_steps=4), tmp_path)
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(checkpoints / "4", checkpoints / "6.orbax-checkpoint-tmp")  # as a kill -9 mid-save leaves it
    caplog.set_level("INFO")
    evaluate_workdir(tmp_path)  # a reader leaves it: a live run may be writing it
    assert (checkpoints / "6.orbax-checkpoint-tmp").is_dir()
    train(tiny_config(text_data, max_steps=8), tmp_path)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["4", "8"]
    assert f"removing unfinished checkpoints of a killed run in {checkpoints}: 6.orbax-checkpoint-tmp" in caplog.text
