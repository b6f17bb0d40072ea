"""One trainer per run folder, and stop signals at any moment: SIGINT as SIGTERM, exit 0,
nothing lost."""

import re
import signal
import time
from pathlib import Path

import pytest
from cli import assert_one_line_error, run_cli, start_cli
from test_training_run import cli_train_args, losses, wait_for_checkpoint


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (Python has none of its own)."""
    caught = re.search(r"SigCgt:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text())
    return bool(caught and int(caught.group(1), 16) >> (signal.SIGTERM - 1) & 1)


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
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_at_any_instant_of_the_start_exits_0_in_one_line_leaving_nothing(tmp_path, text_data, signum):
    """From the first instant (the handler installed, as the imports begin; Python's own start-up
    comes before any code of ours) to the first step: exit 0, the stop said in one line, no
    traceback, and the new workdir gone. (A SIGINT in the first 0.5 s printed a 27-line
    KeyboardInterrupt traceback, at about 1 s "interrupted" with exit 130; one at 0.3 s could
    land in an import and be lost, the run going on to its end; a stopped start left vocab.txt,
    config.json, train.lock and checkpoints/.) A signal that comes once the steps run saves the
    step it is at."""
    for k, moment in enumerate(("handler", 0.5, 1.0, "vocab.txt", "config.json")):
        workdir = tmp_path / f"run{k}"
        proc = start_cli(cli_train_args(text_data, workdir, 100_000))
        if moment == "handler":  # the first instant ours: the handler in place (the imports begin)
            while not _catches_sigterm(proc.pid):
                time.sleep(0.001)
        elif isinstance(moment, float):
            time.sleep(moment)
        else:
            deadline = time.monotonic() + 60
            while not (workdir / moment).exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "Traceback" not in out, (moment, out)
        said = [line for line in out.splitlines() if "stopped" in line]
        assert len(said) == 1, (moment, out)
        if "saved the checkpoint" not in said[0]:
            assert not workdir.exists(), (moment, said, sorted(p.name for p in workdir.iterdir()))
