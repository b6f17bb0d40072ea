"""Text shards turned into word numbers once (`tokenized.Lines`), kept on disk for the next
epoch's process, the next run and every resume.

The cache is a folder (`ELMO_JAX_TOKEN_CACHE`, default `$XDG_CACHE_HOME/elmo_jax/tokens`; "off"
keeps nothing on disk) of one `.npz` file per shard, named by a hash of the shard's identity and
of the vocabulary: a shard or a vocabulary that changed gets a new name, so stale ids are never
read. A shard's identity (`Shard.identity` in shards.py) says what it is without ambiguity: its
kind, then each part prefixed by its length (a file or an archive's member: the SHA-256 of its
bytes, so a folder and its .tar.gz share the cache; records: the SHA-256 of their lines, each
prefixed by its length), so two different shards never share a name; `FORMAT` is part of every
name, so files of an earlier format are never misread. A file's SHA-256, and an archive's
members' (file_facts.py), are remembered by the file's state on disk: a start with the cache
filled reads no text from files or archives (records are read to know what they are).

A cache file is written under a temporary name and renamed, so a reader sees it whole or not at
all, and two processes filling the cache at once each write the same file; one that does not
load (damaged: numpy's zip format checks every array's CRC) is tokenized again and replaced.
Where the cache cannot be written (read-only, full disk), shards are tokenized in memory, with
one warning.

The shards missing from the cache are tokenized by worker processes, one per core, where they
are text files, there is enough text to pay for starting them (`PARALLEL_BYTES`) and the cache
can be written (token_workers.py); else, and for archives and records, by this process. A read
shard's arrays are not kept: they are read back from the cache when the corpus is joined, one
shard at a time (`Cached`), so memory holds the corpus's numbers once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from elmo_jax import stop_signals
from elmo_jax.errors import RunFailed
from elmo_jax.text import token_workers
from elmo_jax.text.token_store import Cached, cache_key, cache_root, cached, save, writable
from elmo_jax.text.tokenized import Lines, tokenize_lines
from elmo_jax.text.vocab import Vocabulary

log = logging.getLogger(__name__)

PARALLEL_BYTES = 64 << 20  # below this much text, starting worker processes costs more than it saves


def tokenize(
    identities: Sequence[bytes],
    read: Callable[[list[int]], Iterator[tuple[int, list[bytes]]]],
    vocab: Vocabulary,
    files: Sequence[tuple[Path, bytes] | None] = (),
    name: str = "the text",
) -> list[Lines | Cached]:
    """Every shard's lines as numbers, through the cache. `identities[i]`: shard i's identity;
    `read(indices)`: (index, non-empty lines) of those shards, in any order; `files[i]`: shard
    i's text file and its SHA-256 where it is one (worker processes can read it)."""
    root, start = cache_root(), time.monotonic()
    problem = None if root is None else writable(root)
    store = None if problem else root  # where new numbers are kept (a cache that cannot be written is still read)
    paths = [None if root is None else root / f"{cache_key(i, vocab.sha256)}.npz" for i in identities]
    results: list[Lines | Cached | None] = [None if p is None else cached(p) for p in paths]
    missing = [i for i, r in enumerate(results) if r is None]
    if not missing:
        return [r for r in results if r is not None]
    hits = len(identities) - len(missing)
    tasks = {
        i: (file[0], file[1], path) for i in missing if i < len(files) and (file := files[i]) and (path := paths[i])
    }
    workers = min(len(tasks), os.cpu_count() or 1) if store is not None else 0
    if store is not None and workers > 1 and sum(t[0].stat().st_size for t in tasks.values()) >= PARALLEL_BYTES:
        log.info("%s: tokenizing %d file(s) in %d processes into the token cache %s (%d read from it)", name,
                 len(tasks), workers, store, hits)  # fmt: skip
        token_workers.run(list(tasks.values()), vocab, store, workers)
        for i, (_, _, path) in tasks.items():
            results[i] = cached(path)
            if results[i] is None:
                raise RunFailed(f"token cache: a worker reported {path} written, and it is not there (removed?)")
    rest = [i for i, r in enumerate(results) if r is None]
    last = time.monotonic()
    for done, (i, lines) in enumerate(read(rest), start=1):
        results[i] = numbers = tokenize_lines(lines, vocab.word_ids)
        path = paths[i] if store is not None else None
        if path is not None:
            try:
                save(path, numbers)
                results[i] = Cached(path)  # its ids read back when joined
            except OSError as e:
                problem = problem or f"{type(e).__name__}: {e}"
        stop_signals.check()
        if time.monotonic() - last >= 10.0 and done < len(rest):
            eta = (time.monotonic() - start) * (len(rest) - done) / done
            log.info("%s: tokenized %d of %d shard(s), ETA %.0fs", name, done, len(rest), eta)
            last = time.monotonic()
    in_memory = sum(not isinstance(results[i], Cached) for i in rest)
    if root is not None and in_memory:
        log.warning("token cache %s cannot be written (%s): %d shard(s) tokenized in memory only, again on every "
                    "start", root, problem, in_memory)  # fmt: skip
    log.info("%s: tokenized %d shard(s) in %.1fs (%d read from the token cache)", name, len(missing),
             time.monotonic() - start, hits)  # fmt: skip
    missed = [i for i, r in enumerate(results) if r is None]
    if missed:
        raise RuntimeError(f"{name}: read() left shards {missed} out")  # a bug of the caller's
    return [r for r in results if r is not None]
