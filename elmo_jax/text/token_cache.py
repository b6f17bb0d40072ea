"""Text shards turned into word numbers once (`tokenized.Lines`), kept on disk for the next
epoch's process, the next run and every resume.

The cache is a folder (`ELMO_JAX_TOKEN_CACHE`, default `$XDG_CACHE_HOME/elmo_jax/tokens`; "off"
keeps nothing on disk) of one `.npz` file per shard, named by a hash of the shard's bytes and of
the vocabulary: a shard or a vocabulary that changed gets a new name, so stale ids are never read.
A file is written under a temporary name and renamed, so a reader sees it whole or not at all,
and two processes filling the cache at once each write the same file; a file that does not load
(damaged: numpy's zip format checks every array's CRC) is tokenized again and replaced. Where the
cache cannot be written (read-only, full disk), shards are tokenized in memory, with one warning.

Text files are tokenized in worker processes, one per core, when there is enough text to pay
for starting them (`PARALLEL_BYTES`) and the cache can be written (they fill it; this process
reads it); archives and record blocks are read by this process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from elmo_jax.text.tokenized import Lines, tokenize_lines
from elmo_jax.text.vocab import Vocabulary

log = logging.getLogger(__name__)

FORMAT = b"elmo_jax tokens 1\0"
PARALLEL_BYTES = 64 << 20  # below this much text, starting worker processes costs more than it saves


def cache_root() -> Path | None:
    value = os.environ.get("ELMO_JAX_TOKEN_CACHE", "")
    if value.lower() == "off":
        return None
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "elmo_jax" / "tokens"


def _key(content_sha256: bytes, vocab_sha256: str) -> str:
    return hashlib.sha256(FORMAT + content_sha256 + vocab_sha256.encode()).hexdigest()[:40]


def _non_empty(data: bytes) -> list[bytes]:
    return [line for line in data.split(b"\n") if line.strip()]


def _save(path: Path, lines: Lines) -> None:
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


def _load(path: Path) -> Lines | None:
    """The cached lines, None when the file is absent; raises when it is damaged."""
    if not path.is_file():
        return None
    with np.load(path) as f:
        ids, lengths, oov, bad = (f[name] for name in ("ids", "lengths", "oov", "bad"))
    if ids.dtype != np.int32 or lengths.dtype != np.int32 or int(lengths.sum(dtype=np.int64)) != len(ids):
        raise ValueError("arrays of the wrong type or size")
    words = oov.tobytes().decode("utf-8", "surrogatepass")
    return Lines(ids, lengths, words.split("\n") if words else [], bad)


def _lines_of(data: bytes | list[bytes], root: Path | None, word_id: dict, vocab_sha256: str) -> tuple:
    """A shard's bytes (a file's contents) or non-empty lines -> (Lines, what went wrong with the
    cache or None, whether the lines came from the cache)."""
    path = None if root is None else root / f"{_key(_digest(data), vocab_sha256)}.npz"
    problem = None
    if path is not None:
        try:
            cached = _load(path)
            if cached is not None:
                return cached, None, True
        except Exception as e:  # a damaged file of any kind: tokenized again, replaced
            log.warning("token cache: %s is damaged (%s: %s); tokenizing the shard again", path, type(e).__name__, e)
    lines = tokenize_lines(_non_empty(data) if isinstance(data, bytes) else data, word_id)
    if path is not None:
        try:
            _save(path, lines)
        except OSError as e:
            problem = f"{type(e).__name__}: {e}"
    return lines, problem, False


def _writable(root: Path) -> str | None:
    """Why the cache folder cannot be written, or None."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f".probe.{os.getpid()}.{uuid.uuid4().hex[:8]}", "wb") as f:
            f.write(b"\0" * 4096)
            os.unlink(f.name)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


def _in_workers(paths: list[Path], root: Path, vocab: Vocabulary, workers: int) -> list[tuple | None]:
    """Files tokenized into the cache by `workers` Python processes (started with subprocess,
    not multiprocessing, so the caller's script is not imported again); each file's cached
    lines, None where its worker failed."""
    sizes = [p.stat().st_size for p in paths]
    shares: list[list[int]] = [[] for _ in range(workers)]
    load = [0] * workers
    for i in sorted(range(len(paths)), key=lambda i: -sizes[i]):  # the biggest first, to the least loaded
        w = load.index(min(load))
        shares[w].append(i)
        load[w] += sizes[i]
    vocab_file = root / f".vocab.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    vocab_file.write_text(vocab.text(), encoding="utf-8")
    try:
        command = [sys.executable, "-m", "elmo_jax.text.token_cache", str(vocab_file), vocab.sha256, str(root)]
        package_root = str(Path(__file__).resolve().parents[2])  # importable wherever this process found it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        procs = [
            subprocess.Popen([*command, *(str(paths[i]) for i in share)], stdout=subprocess.DEVNULL, env=env)
            for share in shares
            if share
        ]
        for proc in procs:
            proc.wait()
    finally:
        vocab_file.unlink(missing_ok=True)
    results: list[tuple | None] = []
    for p in paths:
        try:
            cached = _load(root / f"{_key(_digest(p.read_bytes()), vocab.sha256)}.npz")
        except Exception:
            cached = None
        results.append(None if cached is None else (cached, None, False))
    return results


def _digest(data: bytes | list[bytes]) -> bytes:
    return hashlib.sha256(data if isinstance(data, bytes) else b"\n".join(data) + b"\n#lines").digest()


def tokenize_files(paths: list[Path], vocab: Vocabulary) -> list[Lines]:
    """Each text file's non-empty lines as `Lines`, through the cache (module doc)."""
    root, start = cache_root(), time.monotonic()
    problem = None if root is None else _writable(root)
    workers = min(len(paths), os.cpu_count() or 1)
    results: list = [None] * len(paths)
    if root is not None and problem is None and workers > 1 and sum(p.stat().st_size for p in paths) >= PARALLEL_BYTES:
        log.info("tokenizing %d file(s) in %d processes (or reading the token cache %s)", len(paths), workers, root)
        results = _in_workers(paths, root, vocab, workers)
    last = time.monotonic()
    for i, p in enumerate(paths):
        if results[i] is None:  # in this process: a small corpus, or what a worker left undone
            results[i] = _lines_of(p.read_bytes(), None if problem else root, vocab.word_ids, vocab.sha256)
            if problem:
                results[i] = (results[i][0], problem, False)
        now = time.monotonic()
        if now - last >= 10.0 and i + 1 < len(paths):
            eta = (now - start) * (len(paths) - i - 1) / (i + 1)
            log.info("tokenizing the text: %d of %d file(s), ETA %.0fs", i + 1, len(paths), eta)
            last = now
    return _report(results, root, time.monotonic() - start)


def tokenize_pieces(pieces: list[list[bytes]], vocab: Vocabulary) -> list[Lines]:
    """Pieces already read (an archive's members, blocks of records) as `Lines`, through the
    cache, in this process."""
    root, start = cache_root(), time.monotonic()
    results = [_lines_of(lines, root, vocab.word_ids, vocab.sha256) for lines in pieces]
    return _report(results, root, time.monotonic() - start)


def _report(results: list[tuple], root: Path | None, seconds: float) -> list[Lines]:
    problems = [p for _, p, _ in results if p is not None]
    if problems:
        log.warning(
            "token cache %s cannot be written (%s): %d shard(s) tokenized in memory only, again on every start",
            root,
            problems[0],
            len(problems),
        )
    fresh = sum(not hit for _, _, hit in results)
    if fresh:
        log.info("tokenized %d shard(s) in %.1fs (%d read from the token cache)", fresh, seconds, len(results) - fresh)
    return [lines for lines, _, _ in results]


def _worker(vocab_file: str, vocab_sha256: str, root: str, *paths: str) -> None:
    """A worker process of `tokenize_files`: each file into the cache."""
    vocab = Vocabulary.load(vocab_file)
    if vocab.sha256 != vocab_sha256:
        raise SystemExit(f"{vocab_file}: not the vocabulary of SHA-256 {vocab_sha256}")
    for path in paths:
        _lines_of(Path(path).read_bytes(), Path(root), vocab.word_ids, vocab_sha256)


if __name__ == "__main__":
    _worker(*sys.argv[1:])
