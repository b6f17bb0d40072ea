"""The last record of an append-only log that a crash or kill left half-written: cut off before
anything is appended again, kept beside the log in NAME.torn, said in one line. Without this a
resumed run would write its first record onto the torn one (metrics.jsonl would lose it and stop
being JSON lines)."""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path

log = logging.getLogger(__name__)


def cut_torn_lines(path: Path) -> bool:
    """JSON lines: a last line that does not parse is cut off (one that does but lost its newline,
    a whole JSON object, gets it back)."""
    if not path.is_file():
        return False
    data = path.read_bytes()
    start = data.rfind(b"\n", 0, len(data) - 1) + 1  # of the last line, with or without its newline
    last = data[start:]
    if not last or _parses(last):
        if last and not last.endswith(b"\n"):
            with open(path, "ab") as f:
                f.write(b"\n")
        return False
    _cut(path, start, last, "line")
    return True


def cut_torn_records(path: Path) -> bool:
    """A TFRecord file (TensorBoard's events: each record its length, 4 bytes of the length's
    checksum, the data and 4 bytes of its checksum): a last record shorter than it says is cut."""
    size, at = path.stat().st_size, 0
    with open(path, "rb") as f:
        while at < size:
            header = f.read(8)
            end = at + 8 + 4 + struct.unpack("<Q", header)[0] + 4 if len(header) == 8 else size + 1
            if end > size:
                break
            at = end
            f.seek(at)
    if at == size:
        return False
    with open(path, "rb") as f:
        f.seek(at)
        _cut(path, at, f.read(), "record")
    return True


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _cut(path: Path, keep: int, torn: bytes, what: str) -> None:
    kept = path.with_name(path.name + ".torn")
    with open(kept, "ab") as f:
        f.write(torn)
        f.flush()
        os.fsync(f.fileno())
    os.truncate(path, keep)
    log.warning("%s: its last %s (%d bytes) was torn by a crash; cut off, kept in %s", path, what, len(torn), kept.name)
