"""A side environment for one reference implementation: a venv built from the package
registry with pinned versions, cached under ELMO_JAX_REFERENCE_ENVS (default
~/.cache/elmo_jax/reference-envs) by the hash of its recipe, so a changed recipe builds anew.

The recipe: the interpreter's version, the requirements, and the environment's lock file
where it has one (`lock`: a committed pip constraints file, the `pip freeze` of a built
environment, so that every machine installs the same versions of the dependencies too). A
build installs with `-c LOCK` where the lock exists; where it does not, it builds without
and writes the new environment's freeze to it (delete the lock to refresh it). After a
build, the environment's older siblings (same name, other recipes) are removed.

The reference code runs only there, in its own processes; nothing of it is imported here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_ROOT = Path(os.environ.get("ELMO_JAX_REFERENCE_ENVS", Path.home() / ".cache" / "elmo_jax" / "reference-envs"))
LOCK_HEADER = (
    "# pip constraints: `pip freeze` of the environment tests/reference/side_env.py built;\n"
    "# delete this file to build afresh and write it again\n"
)

# Settings of every side process: CPU only, one thread, and results that do not depend on the
# CPU's vector units (MKL's conditional numerical reproducibility in its compatible mode;
# PyTorch's ATen kernels without AVX2/AVX-512 dispatch), so that a rerun, here or elsewhere,
# gives the same bytes.
RUN_SETTINGS = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_CBWR": "COMPATIBLE",
    "ATEN_CPU_CAPABILITY": "default",
    "PYTHONHASHSEED": "0",
    "CUDA_VISIBLE_DEVICES": "",
}


@dataclass(frozen=True)
class SideEnv:
    """`requirements` are installed with their dependencies, then `no_deps` without them;
    `python` is the interpreter the venv is made from; `index_urls` are package indexes pip
    looks in besides its configured ones, for the requirements (e.g. PyTorch's CPU wheels);
    `lock` is the environment's pip constraints file (module docstring)."""

    name: str
    requirements: tuple[str, ...]
    no_deps: tuple[str, ...] = ()
    python: str = sys.executable
    index_urls: tuple[str, ...] = ()
    lock: Path | None = None

    def locked(self) -> str | None:
        """The lock file's text, None where there is none (yet)."""
        return self.lock.read_text() if self.lock is not None and self.lock.is_file() else None

    def recipe(self) -> str:
        version = subprocess.run(
            [self.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True, check=True
        ).stdout.strip()
        return json.dumps(
            {
                "python": version,
                "requirements": self.requirements,
                "no_deps": self.no_deps,
                "indexes": self.index_urls,
                "lock": self.locked(),
            }
        )

    def path(self) -> Path:
        return ENV_ROOT / f"{self.name}-{hashlib.sha256(self.recipe().encode()).hexdigest()[:12]}"

    def python_exe(self) -> Path:
        return self.path() / "bin" / "python"

    def ensure(self) -> Path:
        """The venv's folder, built first if it is not there complete (a stamp file marks it)."""
        folder = self.path()
        if (folder / ".complete").is_file():
            return folder
        lock = self.locked()
        building = ENV_ROOT / f"{self.name}.building"
        shutil.rmtree(building, ignore_errors=True)
        ENV_ROOT.mkdir(parents=True, exist_ok=True)
        print(f"building the {self.name} environment (minutes, once)", flush=True)
        subprocess.run([self.python, "-m", "venv", str(building)], check=True)
        python = str(building / "bin" / "python")
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        if lock is not None:
            pip += ["-c", str(self.lock)]
        indexes = [option for url in self.index_urls for option in ("--extra-index-url", url)]
        subprocess.run([*pip, *indexes, *self.requirements], check=True)
        if self.no_deps:
            subprocess.run([*pip, "--no-deps", *self.no_deps], check=True)
        if lock is None and self.lock is not None:
            freeze = subprocess.run(
                [python, "-m", "pip", "freeze", "--disable-pip-version-check"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            self.lock.write_text(LOCK_HEADER + freeze)
            print(f"wrote {self.lock}", flush=True)
            folder = self.path()  # its recipe holds the lock now
        (building / ".complete").write_text(self.recipe() + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        building.rename(folder)
        print(f"{self.name} environment: {folder}", flush=True)
        self.remove_siblings(folder)
        return folder

    def remove_siblings(self, keep: Path) -> None:
        """Removes this environment's other builds (same name, other recipe hashes)."""
        pattern = re.compile(re.escape(self.name) + r"-[0-9a-f]{12}")
        for sibling in sorted(ENV_ROOT.iterdir()):
            if sibling != keep and sibling.is_dir() and pattern.fullmatch(sibling.name):
                print(f"removing the stale environment {sibling}", flush=True)
                shutil.rmtree(sibling)

    def run(self, *args: str | os.PathLike, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        """Runs this venv's Python with `args` (a script and its arguments) with RUN_SETTINGS; its
        output (the reference code's notices) is shown only if it fails."""
        settings = {**os.environ, **RUN_SETTINGS, **(env or {})}
        command = [str(self.python_exe()), *map(str, args)]
        done = subprocess.run(
            command, cwd=cwd, env=settings, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if done.returncode != 0:
            print(done.stdout[-20000:], file=sys.stderr)
            raise subprocess.CalledProcessError(done.returncode, command)
