"""Multi-process training on localhost (CPU collectives): 2 processes of 2 devices each give the
losses, final params and evaluation of 1 process with 4 devices, across a checkpoint restore."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from elmo_jax.workdir import Workdir

ROOT = Path(__file__).resolve().parent.parent


def train_args(text_data: Path, workdir: Path, max_steps: int) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "launch.py"),
        "train",
        "--config=experiments/demo.py",
        f"--workdir={workdir}",
        f"--config.data.train=text:{text_data / 'train.txt'}",
        f"--config.data.heldout=text:{text_data / 'heldout.txt'}",
        f"--config.train.max_steps={max_steps}",
        "--config.train.n_epochs=100",
        "--config.train.checkpoint_every=3",
        "--config.train.per_device_batch_size=2",
        "--config.train.unroll_steps=5",
        "--config.train.n_negative_samples_batch=32",
        "--config.train.log_every=1",
        "--config.train.eval_every=0",
        "--config.train.eval_batch_size=8",
        "--config.model.lstm.dim=32",
        "--config.model.lstm.projection_dim=8",
        "--config.model.char_cnn.embedding.dim=4",
    ]


def env(devices: int) -> dict:
    xla_flags = f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count={devices}"  # the last one counts
    return {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_processes(args: list[str], n: int, devices_each: int) -> list[subprocess.Popen]:
    """Starts `args` as n processes of one run (a plain run when n is 1)."""
    port = free_port()
    extra = [
        [f"--coordinator=127.0.0.1:{port}", f"--num_processes={n}", f"--process_id={i}", "--coordinator_timeout=60"]
        for i in range(n)
    ]
    return [
        subprocess.Popen(
            args + (e if n > 1 else []),
            env=env(devices_each),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for e in extra
    ]


def run_processes(args: list[str], n: int, devices_each: int) -> list[str]:
    """Runs `args` as n processes of one run; returns each one's last stdout line."""
    procs = start_processes(args, n, devices_each)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    return [out.strip().splitlines()[-1] for out in outs]


def losses(workdir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


@pytest.mark.launches
@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path, text_data):
    one, two = tmp_path / "one", tmp_path / "two"
    [want] = run_processes(train_args(text_data, one, 6), 1, 4)
    run_processes(train_args(text_data, two, 3), 2, 2)
    finals = run_processes(train_args(text_data, two, 6), 2, 2)  # restores step 3 in both processes
    assert sorted(losses(two)) == list(range(1, 7))
    np.testing.assert_allclose([losses(two)[s] for s in range(1, 7)], [losses(one)[s] for s in range(1, 7)], rtol=1e-5)
    for final in finals:
        got, expected = json.loads(final), json.loads(want)
        assert got["tokens"] == expected["tokens"]
        assert got["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-5)
    run_two, run_one = Workdir(two).restore_params(), Workdir(one).restore_params()
    assert run_two.step == 6 and run_two.config.train.devices == 4
    for a, b in zip(jax.tree.leaves(run_two.params), jax.tree.leaves(run_one.params)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.launches
@pytest.mark.slow
def test_sigterm_to_one_process_saves_the_same_step_in_all(tmp_path, text_data):
    procs = start_processes(train_args(text_data, tmp_path, 100_000), 2, 2)
    deadline = time.monotonic() + 120
    while not any(p.name.isdigit() for p in (tmp_path / "checkpoints").glob("*")):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            pytest.fail(f"no checkpoint appeared; the processes said: {[p.communicate()[0][-3000:] for p in procs]}")
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    saved = max(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == max(losses(tmp_path)) and saved < 100_000
    assert all(f"saved the checkpoint at step {saved}, exiting" in out for out in outs)


@pytest.mark.launches
def test_an_unreachable_coordinator_fails_naming_it(tmp_path, text_data):
    port = free_port()
    args = train_args(text_data, tmp_path, 2) + [
        f"--coordinator=127.0.0.1:{port}",
        "--num_processes=2",
        "--process_id=1",
        "--coordinator_timeout=2",
    ]
    result = subprocess.run(args, env=env(2), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"could not reach the coordinator at 127.0.0.1:{port} within 2s" in result.stderr
