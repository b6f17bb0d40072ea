"""A disk too full for the next checkpoint: the run stops before writing it, in one line naming
the folder, the bytes needed and free; the previous checkpoint stays intact and a rerun with
space resumes from it. On a real small file system (tmpfs), so only as root."""

import os
import shutil
import subprocess

import pytest
from cli import assert_one_line_error, run_cli
from test_training_run import cli_train_args

from elmo_jax.checkpoint import verify_step

pytestmark = pytest.mark.launches  # every test here starts processes


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_save_that_would_not_fit_stops_before_writing_anything(small_disk, text_data):
    workdir = small_disk / "run"

    def train(steps):
        return run_cli([*cli_train_args(text_data, workdir, steps), "--config.train.checkpoint_every=2"])

    assert train(4).returncode == 0
    checkpoints = workdir / "checkpoints"
    size = sum(p.stat().st_size for p in (checkpoints / "4").rglob("*") if p.is_file())
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - size // 2))  # half a checkpoint free
    before = sorted(p.name for p in checkpoints.iterdir())

    result = train(8)
    assert_one_line_error(
        result,
        1,
        f"no space for the checkpoint of step 6 in {checkpoints} (about ",
        "bytes needed",
        "free); nothing was written, the previous checkpoint (step 4) is intact",
    )
    assert sorted(p.name for p in checkpoints.iterdir()) == before  # no step 6, no temporary folder
    verify_step(checkpoints / "4")

    filler.unlink()
    again = train(8)
    assert again.returncode == 0 and "resumed from the checkpoint at step 4" in again.stdout, again.stderr
