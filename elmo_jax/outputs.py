"""Outputs that never clobber: every file or folder a command writes is built under a temporary
name beside its target and renamed into place when complete, so a kill at any moment leaves the
old output intact or the new one whole. An existing target is refused unless `overwrite`, and an
output that is one of the inputs (or holds one) always is. `overwrite` replaces only what the
command writes: a file, or a folder that holds nothing but the command's own files (an earlier
output of it); a folder holding anything else is refused, naming what it holds, and is never the
working directory (or a folder above it). An empty folder is used as if it were not there.

The temporary names are `.NAME.tmp-HOST-PID` (and `.NAME.old-HOST-PID`, an old folder moved
aside while a new one is swapped in). What a killed process left beside a target is cleared by
the next command that writes it: temporaries of processes of this host that no longer exist are
removed, and an old folder whose target is missing (a kill between the two renames) is put back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from elmo_jax import stop_signals
from elmo_jax.errors import UserError

log = logging.getLogger(__name__)
HOST = socket.gethostname()


@dataclasses.dataclass(frozen=True)
class Folder:
    """A folder output: the names the command writes in it, and those every output of it holds,
    by which a folder is recognised as an earlier one."""

    names: tuple[str, ...]
    always: tuple[str, ...]


def _contains(outer: Path, inner: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_output(
    target: str | Path,
    overwrite: bool = False,
    inputs: tuple = (),
    folder: Folder | None = None,
    name: str = "output",
) -> Path:
    """The target as an absolute path, after refusing an input as output, a folder where the
    output is a file (or a file where it is a `folder`), unless `overwrite` an existing target,
    and a folder that is not empty nor an earlier output of the command, or holds the working
    directory (errors name `output`, the command line's flag; or `name`)."""
    target = Path(target).absolute()
    resolved = target.resolve()
    for given in inputs:
        if given is not None and _contains(resolved, Path(given).resolve()):
            raise UserError(f"{name}={target} is (or holds) the input {given}: choose another output", (name,))
    if target.exists() and target.is_dir() != (folder is not None):
        kind = ("a folder", "a file") if folder is not None else ("a file", "a folder")
        raise UserError(f"{name}={target} is {kind[1]}; the output is {kind[0]}: choose another", (name,))
    occupied = target.exists()
    if folder is not None and target.is_dir():
        occupied = _earlier_output(target, resolved, folder, name)
    if occupied and not overwrite:
        raise UserError(
            f"{name}={target} already exists: overwrite=True replaces it, or choose another", (name, "overwrite")
        )
    nearest = next(p for p in target.parents if p.exists())  # of the folders above (`replacing` makes the rest)
    if not nearest.is_dir():
        raise UserError(f"{name}={target}: {nearest} is a file, not a folder", (name,))
    return target


def _earlier_output(target: Path, resolved: Path, folder: Folder, name: str) -> bool:
    """An existing folder as the output is empty (False) or an earlier output (True); anything
    else, or the working directory, is refused."""
    if _contains(resolved, Path.cwd().resolve()):
        raise UserError(f"{name}={target} is (or holds) the working directory: choose a folder inside it", (name,))
    held = sorted(p.name for p in target.iterdir())
    others = [entry for entry in held if entry not in folder.names]
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise UserError(
            f"{name}={target} holds what this command does not write ({shown}): it replaces only a folder of its "
            f"own outputs ({', '.join(sorted(folder.names))}); choose another (a new or empty folder)",
            (name,),
        )
    missing = [entry for entry in folder.always if entry not in held]
    if held and missing:
        raise UserError(
            f"{name}={target} holds {', '.join(held)}, which is not an earlier output of this command (that holds "
            f"{', '.join(folder.always)}): yours are not replaced; choose another (a new or empty folder)",
            (name,),
        )
    return bool(held)


@contextlib.contextmanager
def replacing(
    target: str | Path,
    overwrite: bool = False,
    inputs: tuple = (),
    folder: Folder | None = None,
    name: str = "output",
) -> Iterator[Path]:
    """Yields a temporary path beside `target` to write the whole output to (a file, or a
    `folder`), in its folder, made if missing; on success it replaces `target`, on any error it
    is removed (and the folders made for it)."""
    clear_leftovers(Path(target).absolute())
    target = check_output(target, overwrite, inputs, folder, name)
    made = make_folders(target.parent)
    tmp = _temporary(target, "tmp")
    remove(tmp)  # a reused PID's
    done = False
    _UNFINISHED[tmp] = (target, made)
    try:
        yield tmp
        stop_signals.check()  # asked to stop: the output is not put in place
        with stop_signals.critical():  # a stop signal waits until the output is in place, and said so
            _move_into_place(tmp, target)
            done = True
            _FINISHED.append(target)
    finally:
        del _UNFINISHED[tmp]
        remove(tmp)
        if not done:
            remove_empty(made)  # as they were: no empty folders left by a failed output
            _GIVEN_UP.append(target)


# The temporaries being written (`replacing`): each one's target and the folders made for it.
_UNFINISHED: dict[Path, tuple[Path, list[Path]]] = {}
# The targets of the outputs given up (their temporaries removed) and of those put in place.
_GIVEN_UP: list[Path] = []
_FINISHED: list[Path] = []


def abandon_unfinished() -> str:
    """Removes every output still being written (its temporary, the folders made for it): what
    a command stopped by a signal does before it exits. Says what became of the command's
    outputs: those given up (these, and those `replacing` gave up as the stop unwound it) and
    those already in place."""
    for tmp, (target, made) in list(_UNFINISHED.items()):
        remove(tmp)
        remove(tmp)  # again: a writer's thread may have added to a folder while it was removed
        remove_empty(made)
        _GIVEN_UP.append(target)
    given_up, finished = (", ".join(map(str, dict.fromkeys(paths))) for paths in (_GIVEN_UP, _FINISHED))
    said = [f"removed the unfinished {given_up}"] if given_up else []
    said += [f"{finished} complete and in place"] if finished else []
    return "; ".join(said or ["no output was unfinished"]) + ("" if finished else "; earlier outputs are as they were")


def make_folders(folder: Path) -> list[Path]:
    """Makes `folder` and the folders above it that are missing (as `train` makes its workdir);
    returns those it made, deepest first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def remove_empty(folders: list[Path]) -> None:
    """Removes each of `folders` (deepest first) that is empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def write_text(path: str | Path, text: str) -> None:
    """Writes a small text file atomically (temporary file, fsync, rename)."""
    path = Path(path)
    clear_leftovers(path)
    tmp = _temporary(path, "tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        remove(tmp)


def _move_into_place(tmp: Path, target: Path) -> None:
    """A file replaces its target in one rename; a folder is swapped in with two (the old one
    renamed aside first, then deleted)."""
    if tmp.is_dir() and target.exists():
        old = _temporary(target, "old")
        remove(old)
        os.rename(target, old)
        os.rename(tmp, target)
        remove(old)
    else:
        os.replace(tmp, target)


def _temporary(target: Path, kind: str) -> Path:
    return target.with_name(f".{target.name}.{kind}-{HOST}-{os.getpid()}")


def _ended(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's, alive
        return False
    return False


def clear_leftovers(target: Path) -> None:
    """Clears what processes of this host that have ended left beside `target` (temporaries
    named without a host are older elmo_jax's, taken as this host's): an old folder is put back
    if `target` is missing, the rest removed; one line says what was done."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(tmp|old)-(?:(.+)-)?(\d+)")
    if not target.parent.is_dir():
        return
    leftovers = []
    for path in target.parent.iterdir():
        match = pattern.fullmatch(path.name)
        if match and match[2] in (None, HOST) and _ended(int(match[3])):
            leftovers.append((match[1], path))
    removed = []
    for kind, path in sorted(leftovers):  # "old" before "tmp"
        if kind == "old" and not target.exists():
            os.rename(path, target)
            log.warning("put %s back: a command killed while replacing it had moved it aside as %s", target, path.name)
        else:
            remove(path)
            removed.append(path.name)
    if removed:
        log.info("removed what ended processes left beside %s: %s", target, ", ".join(removed))


def remove(path: Path) -> None:
    """Removes a file or a folder (with what it holds); nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
