"""Outputs that never clobber: every file or folder a command writes is built under a temporary
name beside its target and renamed into place when complete, so a kill at any moment leaves the
old output intact or the new one whole. An existing target is refused unless `overwrite`, and an
output that is one of the inputs (or holds one) always is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from elmo_jax.errors import UserError


def _contains(outer: Path, inner: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_output(target: str | Path, overwrite: bool = False, inputs: tuple = (), flag: str = "output") -> Path:
    """The target as an absolute path, after refusing an input as output and, unless
    `overwrite`, an existing target."""
    target = Path(target).absolute()
    resolved = target.resolve()
    for given in inputs:
        if given is not None and _contains(resolved, Path(given).resolve()):
            raise UserError(f"{flag} {target} is (or holds) the input {given}: choose another output")
    if target.exists() and not overwrite:
        raise UserError(f"{flag} {target} already exists: pass --overwrite to replace it, or choose another")
    if not target.parent.is_dir():
        raise UserError(f"{flag} {target}: the folder {target.parent} does not exist")
    return target


@contextlib.contextmanager
def replacing(target: str | Path, overwrite: bool = False, inputs: tuple = (), flag: str = "output") -> Iterator[Path]:
    """Yields a temporary path beside `target` to write the whole output to (a file or a
    folder); on success it replaces `target`, on any error it is removed."""
    target = check_output(target, overwrite, inputs, flag)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        _move_into_place(tmp, target)
    finally:
        _remove(tmp)


def write_text(path: str | Path, text: str) -> None:
    """Writes a small text file atomically (temporary file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def _move_into_place(tmp: Path, target: Path) -> None:
    """A file replaces its target in one rename; a folder is swapped in with two (the old one
    renamed aside first, then deleted)."""
    if tmp.is_dir() and target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        _remove(old)
        os.rename(target, old)
        os.rename(tmp, target)
        _remove(old)
    elif target.is_dir():
        raise UserError(f"{target} is a folder; the output is a file")
    else:
        os.replace(tmp, target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
