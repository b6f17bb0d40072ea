"""One trainer per run folder, and stop signals at any moment: SIGINT as SIGTERM, exit 0,
nothing lost."""

import signal
import time

import pytest
from cli import assert_one_line_error, run_cli, start_cli
from test_training_run import cli_train_args, losses, wait_for_checkpoint


def _saved_steps(workdir):
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.launches
@pytest.mark.slow
def test_one_trainer_per_workdir_sigint_saves_and_a_stale_lock_is_taken_over(tmp_path, text_data):
    workdir = tmp_path / "run"
    first = start_cli(cli_train_args(text_data, workdir, 100_000))
    wait_for_checkpoint(workdir, first)
    second = run_cli(cli_train_args(text_data, workdir, 100_000))
    assert_one_line_error(second, 2, f"{workdir} is in use by another training run", f"pid {first.pid}")

    first.send_signal(signal.SIGINT)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0, out
    assert "stopped (SIGINT)" in out and _saved_steps(workdir)[-1] == max(losses(workdir))  # nothing lost

    third = start_cli(cli_train_args(text_data, workdir, 100_000))
    deadline = time.monotonic() + 60
    while f"pid {third.pid}" not in (workdir / "train.lock").read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    third.kill()  # kill -9 while it holds the lock: the lock file still names it
    third.wait()
    assert f"pid {third.pid}" in (workdir / "train.lock").read_text()
    resumed_at = _saved_steps(workdir)[-1]
    fourth = run_cli(cli_train_args(text_data, workdir, resumed_at + 2))
    assert fourth.returncode == 0, fourth.stderr
    assert f"taking over {workdir / 'train.lock'}" in fourth.stdout and f"pid {third.pid}" in fourth.stdout


@pytest.mark.launches
@pytest.mark.slow
@pytest.mark.parametrize("moment", ["imports", "start-up"])
def test_sigterm_before_the_first_step_exits_0(tmp_path, text_data, moment):
    workdir = tmp_path / "run"
    proc = start_cli(cli_train_args(text_data, workdir, 100_000))
    if moment == "imports":
        time.sleep(0.5)
    else:
        deadline = time.monotonic() + 60
        while not (workdir / "vocab.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in out, out
