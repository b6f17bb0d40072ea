"""What a run ran on, for its config.json: the versions of the packages that decide what it
computes, the device kind and count, and the git commit of the elmo_jax source when it is a
checkout."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import jax

SOURCE = Path(__file__).resolve().parents[1]  # the folder holding elmo_jax/
PACKAGES = ("elmo_jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections")


def git_commit(folder: Path = SOURCE) -> str | None:
    """HEAD of the git checkout whose top is `folder` (+ "-dirty" with uncommitted changes to
    tracked files); None for an installed copy, or without git."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()  # fmt: skip

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != folder.resolve():
            return None  # elmo_jax installed inside some other repository
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "packages": versions,
        "device_kind": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "git_commit": git_commit(),
    }
