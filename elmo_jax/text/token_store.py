"""The token cache's folder and files (how they are used: token_cache.py).

The folder is `ELMO_JAX_TOKEN_CACHE` (default `$XDG_CACHE_HOME/elmo_jax/tokens`; "off" keeps
nothing on disk). Each shard's numbers are one `.npz` file named by `cache_key`: a hash of the
shard's identity and of the vocabulary. An identity says what a shard is without ambiguity: its
kind, then each part prefixed by its length (`identity`); `FORMAT` is part of every name, so
files of an earlier format are never misread. A file is written under a temporary name and
renamed (`save`), so a reader sees it whole or not at all; one that does not load (numpy's zip
format checks every array's CRC) is taken as absent, with a warning (`cached`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from elmo_jax.text.tokenized import Lines

log = logging.getLogger(__name__)

FORMAT = b"elmo_jax tokens 2"  # 1 keyed a shard's lines by their bytes joined with newlines: ambiguous


def cache_root() -> Path | None:
    value = os.environ.get("ELMO_JAX_TOKEN_CACHE", "")
    if value.lower() == "off":
        return None
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "elmo_jax" / "tokens"


def identity(kind: str, *parts: bytes) -> bytes:
    """An unambiguous identity: the kind, then each part, each prefixed by its length."""
    return b"".join(len(p).to_bytes(8, "little") + p for p in (kind.encode(), *parts))


def lines_sha256(lines: Sequence[bytes]) -> bytes:
    """The SHA-256 of lines, each prefixed by its length."""
    h = hashlib.sha256()
    for line in lines:
        h.update(len(line).to_bytes(8, "little"))
        h.update(line)
    return h.digest()


def cache_key(shard_identity: bytes, vocab_sha256: str) -> str:
    return hashlib.sha256(identity("token cache", FORMAT, shard_identity, vocab_sha256.encode())).hexdigest()[:40]


def non_empty(data: bytes) -> list[bytes]:
    """A text file's non-empty lines."""
    return [line for line in data.split(b"\n") if line.strip()]


class Cached:
    """A shard's `Lines` in the cache: the small arrays held, its ids read when asked for."""

    def __init__(self, path: Path):
        self.path = path
        with np.load(path) as f:
            lengths, oov, bad, n_ids = f["lengths"], f["oov"], f["bad"], _length(f, "ids")
        if lengths.dtype != np.int32 or int(lengths.sum(dtype=np.int64)) != n_ids:
            raise ValueError("arrays of the wrong type or size")
        words = oov.tobytes().decode("utf-8", "surrogatepass")
        self.lengths, self.oov, self.bad = lengths, words.split("\n") if words else [], bad

    @property
    def ids(self) -> np.ndarray:
        with np.load(self.path) as f:
            ids = f["ids"]
        if ids.dtype != np.int32 or len(ids) != int(self.lengths.sum(dtype=np.int64)):
            raise ValueError(f"token cache: {self.path} changed since it was read; run again")
        return ids


def _length(npz, name: str) -> int:
    """The length of array `name` of an open .npz, from its header alone (not its data)."""
    with npz.zip.open(f"{name}.npy") as member:
        version = np.lib.format.read_magic(member)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        shape, _, _ = read_header[version](member)
    return int(shape[0])


def save(path: Path, lines: Lines) -> None:
    """Written whole under a temporary name, then renamed over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "wb") as f:
            oov = "\n".join(lines.oov).encode("utf-8", "surrogatepass")
            np.savez(f, ids=lines.ids, lengths=lines.lengths, oov=np.frombuffer(oov, np.uint8), bad=lines.bad)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def cached(path: Path) -> Cached | None:
    """The cached lines at `path`; None when absent, or damaged (said in a warning)."""
    if not path.is_file():
        return None
    try:
        return Cached(path)
    except Exception as e:  # a damaged file of any kind: tokenized again, replaced
        log.warning("token cache: %s is damaged (%s: %s); tokenizing the shard again", path, type(e).__name__, e)
        return None


def writable(root: Path) -> str | None:
    """Why the cache folder cannot be written, or None."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f".probe.{os.getpid()}.{uuid.uuid4().hex[:8]}", "wb") as f:
            f.write(b"\0" * 4096)
            os.unlink(f.name)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None
