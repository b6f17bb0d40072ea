"""When a run has diverged (elmo_jax/train/divergence.py): a loss far past a uniform guess, a
loss that stays at a multiple of its lowest, a non-finite held-out perplexity; nothing saved
after it, and a rerun resumes from the last good checkpoint."""

import math

import jax
import numpy as np
import pytest
from cli import assert_one_line_error, run_cli, strict_json
from test_training_run import cli_train_args, losses, tiny_config

from elmo_jax.checkpoint import Checkpoints
from elmo_jax.settings import TrainSettings
from elmo_jax.train import loop
from elmo_jax.train.divergence import DivergenceCheck, TrainingDiverged
from elmo_jax.train.loop import train


def saved_steps(workdir):
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def feed(check, losses_by_step):
    """One log window per step."""
    for step, loss in losses_by_step.items():
        check.metrics(step, {"loss": loss, "grad_norm": 1.0})
        check.window(step, loss, 1)


@pytest.fixture
def run_with_checkpoints(tmp_path, text_data):
    """A workdir with the checkpoints of steps 4, 6 and 8."""
    train(tiny_config(text_data, max_steps=8, checkpoint_every=2), tmp_path)
    assert saved_steps(tmp_path) == [4, 6, 8]
    return tmp_path


@pytest.mark.slow
def test_a_loss_that_stays_at_twice_its_lowest_stops_and_sets_aside_what_was_saved_since(run_with_checkpoints):
    workdir = run_with_checkpoints
    checkpoints = Checkpoints(workdir / "checkpoints", every=2)
    check = DivergenceCheck(checkpoints, TrainSettings(n_tokens_vocab=10_000), factor=2.0)  # ln V = 9.2
    feed(check, {3: 4.0, 4: 3.0, 5: 3.1})
    feed(check, {6: 6.5, 7: 6.2, 8: 2.9})  # two windows above 2 x 3.0, then back: noise, not divergence
    with pytest.raises(
        TrainingDiverged,
        match=r"step 8: .*stayed above 2 x its lowest window mean \(2\.900\) since step 6 \(now 6\.100\).*"
        r"latest checkpoint \(step 4\) is the last good state \(saved since the divergence, step\(s\) 6, 8 moved",
    ):
        feed(check, {6: 6.0, 7: 6.4, 8: 6.1})  # a rerun of steps 6-8 (as after a resume), three windows up
    checkpoints.close()
    assert saved_steps(workdir) == [4]
    assert sorted(p.name.split("-")[0] for p in (workdir / "diverged_checkpoints").iterdir()) == ["6", "8"]
    assert Checkpoints(workdir / "checkpoints").good_step() == 4  # where a rerun resumes


def test_the_finite_rules_are_off_at_factor_0_but_a_non_finite_loss_still_stops(tmp_path):
    check = DivergenceCheck(Checkpoints(tmp_path), TrainSettings(n_tokens_vocab=10_000), factor=0.0)
    feed(check, {1: 1.0, 2: 1e30, 3: 1e30, 4: 1e30, 5: 1e30})
    with pytest.raises(TrainingDiverged, match=r"step 6: loss nan .*no good checkpoint was saved.*starts afresh"):
        feed(check, {6: math.nan})


@pytest.mark.slow
def test_a_loss_far_past_a_uniform_guess_stops_before_the_save(tmp_path, text_data):
    """The run's first update explodes the loss (finite); the log window is longer than the run,
    so the check before the save at step 4 catches it."""
    config = tiny_config(text_data, max_steps=10, checkpoint_every=4, log_every=100, learning_rate=1e6)
    with pytest.raises(
        TrainingDiverged, match=r"step 4: the mean training loss of steps 1-4 is .*, above 2 x ln\(vocabulary size\)"
    ):
        train(config, tmp_path)
    assert saved_steps(tmp_path) == []


@pytest.mark.slow
def test_a_non_finite_heldout_perplexity_stops_and_sets_aside_its_checkpoint(tmp_path, text_data, monkeypatch):
    """Training stays finite; the held-out evaluation of step 4's params does not."""
    real = loop.evaluate
    monkeypatch.setattr(
        loop, "evaluate", lambda params, *a, **k: real(jax.tree.map(lambda x: x * np.inf, params), *a, **k)
    )
    with pytest.raises(TrainingDiverged, match=r"step 4: the held-out perplexity is not finite .*no good checkpoint"):
        train(tiny_config(text_data, max_steps=8, checkpoint_every=4, eval_every=4), tmp_path)
    assert saved_steps(tmp_path) == [] and max(losses(tmp_path)) == 4
    assert [p.name.split("-")[0] for p in (tmp_path / "diverged_checkpoints").iterdir()] == ["4"]


@pytest.mark.launches
def test_the_command_exits_1_with_one_line_and_strict_json_metrics(tmp_path, text_data):
    """The issue's run at tiny size: a learning rate of 1e6 gives a loss of about 1e5 nats from
    step 2 on, finite."""
    workdir = tmp_path / "run"
    result = run_cli([*cli_train_args(text_data, workdir, 10), "--config.train.learning_rate=1e6"])
    assert_one_line_error(result, 1, "step 2: the mean training loss of step 2 is", "no good checkpoint was saved")
    assert saved_steps(workdir) == []
    records = [strict_json(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 2 and records[-1]["perplexity_forward"] is None
    assert records[-1]["non_finite"] == {"perplexity_forward": "inf", "perplexity_backward": "inf"}
    strict_json((workdir / "config.json").read_text())
