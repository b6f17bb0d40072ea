"""A side environment for one reference implementation: a venv built from the package
registry with pinned versions, cached under ELMO_JAX_REFERENCE_ENVS (default
~/.cache/elmo_jax/reference-envs) by the hash of its recipe, so a changed recipe builds anew.

The reference code runs only there, in its own processes; nothing of it is imported here."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_ROOT = Path(os.environ.get("ELMO_JAX_REFERENCE_ENVS", Path.home() / ".cache" / "elmo_jax" / "reference-envs"))


@dataclass(frozen=True)
class SideEnv:
    """`requirements` are installed with their dependencies, then `no_deps` without them;
    `python` is the interpreter the venv is made from; `index_urls` are package indexes pip
    looks in besides its configured ones, for the requirements (e.g. PyTorch's CPU wheels)."""

    name: str
    requirements: tuple[str, ...]
    no_deps: tuple[str, ...] = ()
    python: str = sys.executable
    index_urls: tuple[str, ...] = ()

    def recipe(self) -> str:
        version = subprocess.run(
            [self.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True, check=True
        ).stdout.strip()
        recipe = {"python": version, "requirements": self.requirements, "no_deps": self.no_deps}
        if self.index_urls:  # only when set: the recipes (and folders) of the others stay as they were
            recipe["index_urls"] = self.index_urls
        return json.dumps(recipe)

    def path(self) -> Path:
        return ENV_ROOT / f"{self.name}-{hashlib.sha256(self.recipe().encode()).hexdigest()[:12]}"

    def python_exe(self) -> Path:
        return self.path() / "bin" / "python"

    def ensure(self) -> Path:
        """The venv's folder, built first if it is not there complete (a stamp file marks it)."""
        folder = self.path()
        if (folder / ".complete").is_file():
            return folder
        building = folder.with_name(folder.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        print(f"building {self.name} environment in {folder} (minutes, once)", flush=True)
        subprocess.run([self.python, "-m", "venv", str(building)], check=True)
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        indexes = [option for url in self.index_urls for option in ("--extra-index-url", url)]
        subprocess.run([*pip, *indexes, *self.requirements], check=True)
        if self.no_deps:
            subprocess.run([*pip, "--no-deps", *self.no_deps], check=True)
        (building / ".complete").write_text(self.recipe() + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        building.rename(folder)
        return folder

    def run(self, *args: str | os.PathLike, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        """Runs this venv's Python with `args` (a script and its arguments), single-threaded."""
        settings = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONHASHSEED": "0",
            "CUDA_VISIBLE_DEVICES": "",
            **(env or {}),
        }
        subprocess.run([str(self.python_exe()), *map(str, args)], check=True, cwd=cwd, env=settings)
