"""Facts about a big file computed once (its SHA-256, the members of an archive) and remembered
by the file's state on disk, so that a later start reads none of its bytes.

A file's state is its device, inode, size, and modification and change times in nanoseconds:
writing the file changes the change time, which no program can set back, so a changed file is
never taken for the one a fact was computed from. The facts live beside the token cache
(`FOLDER` in `token_store.cache_root()`), one small JSON file per file path, written under a
temporary name and renamed; without a cache folder they are remembered for the process only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

FOLDER = "file_facts"
_in_process: dict[tuple, dict[str, Any]] = {}


def _state(path: Path) -> list[int]:
    s = path.stat()
    return [s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns]


def remembered(path: Path, name: str, compute: Callable[[Path], Any], root: Path | None) -> Any:
    """The fact `name` of the file at `path` (JSON-able): remembered for the file's state, else
    `compute(path)`, then remembered (in `root`/file_facts, or in this process if `root` is None)."""
    real = path.resolve()
    state = _state(real)
    memo = _in_process.setdefault((str(real), *state), {})
    if name in memo:
        return memo[name]
    record_file = (
        None if root is None else root / FOLDER / f"{hashlib.sha256(str(real).encode()).hexdigest()[:40]}.json"
    )
    record: dict[str, Any] = {}
    if record_file is not None:
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(record_file.read_text())
        if record.get("state") != state:
            record = {"path": str(real), "state": state}
    if name not in record:
        record[name] = compute(real)
        if _state(real) != state:  # changed while it was read: remember nothing of it
            return record[name]
        if record_file is not None:
            _write(record_file, record)
    memo[name] = record[name]
    return record[name]


def _write(path: Path, record: dict[str, Any]) -> None:
    """Written whole under a temporary name and renamed; a folder that cannot be written keeps
    nothing (the fact is computed again next time)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(record))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def sha256(path: Path, root: Path | None) -> bytes:
    """The SHA-256 of the file's bytes (remembered)."""

    def compute(real: Path) -> str:
        with open(real, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    return bytes.fromhex(remembered(path, "sha256", compute, root))
