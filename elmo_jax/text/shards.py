"""Corpora stored as shards (text files, the members of a .tar.gz read as a stream, or blocks of
records of a TFDS data source), read one piece at a time so memory does not grow with the corpus.

An epoch's sentence order (see StreamBatcher): every shard is cut into m pieces (m = the
smallest number giving at least one piece per group of rows; a piece is every m-th non-empty
line of its shard), the pieces are shuffled from (seed, epoch) and dealt to the groups in
turn, and each piece's lines are shuffled from (seed, epoch, piece); the backward LM's own
stream shuffles both independently (see `Corpus.view`). A group's rows read the concatenation
of its pieces, so groups read disjoint pieces and a group holds only the one or two pieces its
rows are in.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import logging
import tarfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from elmo_jax import stop_signals
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.text import file_facts
from elmo_jax.text.chars import ByteChars, TokenIds
from elmo_jax.text.corpus import shuffle_rng
from elmo_jax.text.token_cache import tokenize
from elmo_jax.text.token_store import cache_root, identity, lines_sha256, non_empty
from elmo_jax.text.tokenized import Tokenized, join
from elmo_jax.text.vocab import Vocabulary

log = logging.getLogger(__name__)

LM1B_DIR = "1-billion-word-language-modeling-benchmark-r13output"
LM1B_PATTERNS = {
    "train": "training-monolingual.tokenized.shuffled/news.en-000??-of-00100",
    "heldout": "heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050",
}


def _sentence(line: bytes) -> list[str]:
    return line.decode("utf-8", errors="replace").split()


def warn_invalid_utf8(name: str, numbers: list[int], what: str = "lines") -> None:
    """Logs the line numbers (up to 20) of `name` that were not valid UTF-8."""
    if numbers:
        shown = ", ".join(map(str, numbers[:20])) + (", ..." if len(numbers) > 20 else "")
        log.warning(
            "%s: %d line(s) not valid UTF-8, decoded with replacement characters (%s %s)",
            name,
            len(numbers),
            what,
            shown,
        )


def _lines_of(f: IO[bytes] | None) -> list[bytes]:
    """A file's (or an archive member's) non-empty lines, cut as token_store.non_empty cuts a
    file's bytes: the same text is the same lines, whichever holds it (their cache identity is
    the same)."""
    return non_empty(f.read()) if f is not None else []


def _invalid_utf8(lines: list[bytes]) -> list[int]:
    bad = []
    for number, line in enumerate(lines, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(number)
    return bad


@dataclasses.dataclass(frozen=True)
class Shard:
    """One file, or one member of a .tar.gz archive (read by decompressing up to it)."""

    path: Path
    member: str | None = None

    @property
    def name(self) -> str:
        return f"{self.path}:{self.member}" if self.member else str(self.path)

    def sha256(self) -> bytes:
        """The SHA-256 of the file's bytes, or of the member's: remembered (file_facts.py)."""
        if self.member is None:
            return file_facts.sha256(self.path, cache_root())
        return bytes.fromhex(dict(archive_members(self.path))[self.member])

    def identity(self) -> bytes:
        """What the shard is, unambiguously (token_store.identity): its bytes, whether a file
        or an archive's member holds them (the same text tokenized once, either way)."""
        return identity("file", self.sha256())

    def lines(self) -> list[bytes]:
        """The shard's non-empty lines, as bytes."""
        if self.member is None:
            with open(self.path, "rb") as f:
                return _lines_of(f)
        for name, member in iter_archive(self.path):
            if name == self.member:
                return _lines_of(member)
        raise MissingFile(f"{self.path}: no member {self.member}")


def iter_archive(path: Path) -> Iterator[tuple[str, IO[bytes] | None]]:
    """(member name, file object) of each regular file of a .tar.gz, in archive order, read as a
    stream; a corrupt or truncated archive fails naming the member it was reading."""
    name = "(the archive header)"
    try:
        with tarfile.open(path, "r|gz") as archive:
            for info in archive:
                if info.isfile():
                    name = info.name
                    yield name, archive.extractfile(info)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise _corrupt(path, name, e) from None


def _corrupt(path: Path, member: str, error: Exception) -> UserError:
    return UserError(f"{path}: corrupt or truncated archive, while reading {member}: {error}")


def archive_members(path: Path) -> list[tuple[str, str]]:
    """(name, SHA-256 of its bytes) of a .tar.gz's regular files, in archive order: listed once
    by decompressing it whole, then remembered by the archive's state (file_facts.py)."""

    def listed(archive: Path) -> list[tuple[str, str]]:
        out = []
        for name, member in iter_archive(archive):
            stop_signals.check()
            digest = hashlib.sha256()
            try:
                while member is not None and (chunk := member.read(1 << 20)):
                    digest.update(chunk)
            except (tarfile.TarError, EOFError, OSError) as e:
                raise _corrupt(archive, name, e) from None
            out.append((name, digest.hexdigest()))
        return out

    return [tuple(m) for m in file_facts.remembered(path, "members", listed, cache_root())]


@dataclasses.dataclass(frozen=True, eq=False)
class RecordBlock:
    """Records start..stop-1 of a random-access data source with a `text` feature (TFDS
    `data_source`), read as one shard; the text may be bytes or str."""

    source: Any  # random access to records with a `text` feature
    start: int
    stop: int
    name: str

    @functools.cached_property
    def _identity(self) -> bytes:
        return identity("records", lines_sha256(self.lines()))

    def identity(self) -> bytes:
        """What the block is: the SHA-256 of its lines (token_store.identity), read once a
        process: a block's records are read (a start reads a TFDS source's text to know it)."""
        return self._identity

    def lines(self) -> list[bytes]:
        out = []
        for i in range(self.start, self.stop):
            text = self.source[i]["text"]
            text = text.encode("utf-8") if isinstance(text, str) else bytes(text)
            if text.strip():
                out.append(text)
        return out


class ShardedCorpus:
    """Sentences in shards. Sizes (non-empty lines per shard) come from a counting pass over the
    text, or from the shards' word numbers once `tokenized` has made them (token_cache.py)."""

    floor_perplexity = None  # unknown for real text

    def __init__(self, name: str, shards: Sequence[Shard | RecordBlock]):
        self.name, self.shards = name, shards
        self._sizes: list[int] | None = None
        self._warned = False  # about lines not valid UTF-8
        self._tokenized: tuple | None = None

    def _count(self) -> list[int]:
        """The non-empty lines of each shard (counted once)."""
        if self._sizes is None:
            sizes = [0] * len(self.shards)
            for index, shard_lines in self._stream_lines():
                warn_invalid_utf8(self.shards[index].name, _invalid_utf8(shard_lines), "non-empty lines")
                sizes[index] = len(shard_lines)
            self._sizes, self._warned = sizes, True
        return self._sizes

    def _stream_lines(self) -> Iterator[tuple[int, list[bytes]]]:
        """(shard index, non-empty lines) of every shard in storage order (files one by one, an
        archive's members as they come in one decompression pass); on a long pass, logs
        progress and an ETA after a shard at most every 10 seconds."""
        start = last = time.monotonic()
        for done, (index, lines) in enumerate(self._shard_lines(), start=1):
            stop_signals.check()
            yield index, lines
            now = time.monotonic()
            if now - last >= 10.0:
                eta = (now - start) * (len(self.shards) - done) / done
                log.info("%s: read %d of %d shard(s), ETA %.0fs", self.name, done, len(self.shards), eta)
                last = now

    def _shard_lines(self, indices: Iterable[int] | None = None) -> Iterator[tuple[int, list[bytes]]]:
        """(shard index, non-empty lines) of the shards of `indices` (default: all), in storage
        order: an archive's members in one decompression pass, one member in memory at a time."""
        wanted = range(len(self.shards)) if indices is None else sorted(indices)
        first = self.shards[0]
        if not isinstance(first, Shard) or first.member is None:
            yield from ((i, self.shards[i].lines()) for i in wanted)
            return
        chosen = set(wanted)
        index = {s.member: i for i, s in enumerate(self.shards) if isinstance(s, Shard) and i in chosen}
        if not index:
            return
        for name, member in iter_archive(first.path):
            if name in index:
                yield index.pop(name), _lines_of(member)
                if not index:
                    return
        raise MissingFile(f"{first.path}: no member {', '.join(map(str, index))} (the archive changed?)")

    def __len__(self) -> int:
        return sum(self._count())

    def stream(self) -> Iterator[list[str]]:
        """Every sentence once, in storage order."""
        for _, shard_lines in self._stream_lines():
            yield from (_sentence(line) for line in shard_lines)

    def fingerprint(self) -> str:
        """The SHA-256 of what the corpus's text is: its shards' identities, in order."""
        identities = []
        for shard in self.shards:  # hashing each file the first time: a long pass stops in between
            stop_signals.check()
            identities.append(shard.identity())
        return lines_sha256(identities).hex()

    def tokenized(self, vocab: Vocabulary, token_ids: TokenIds | None = None) -> Tokenized:
        """Every shard's sentences as word types, through the token cache (token_cache.py)."""
        key = (vocab.sha256, token_ids or ByteChars())
        if self._tokenized is None or self._tokenized[0] != key:
            files = [(s.path, s.sha256()) if isinstance(s, Shard) and s.member is None else None for s in self.shards]
            parts = tokenize([s.identity() for s in self.shards], self._shard_lines, vocab, files, self.name)
            if not self._warned:
                for shard, part in zip(self.shards, parts):
                    warn_invalid_utf8(shard.name, part.bad.tolist(), "non-empty lines")
                self._warned = True
            self._sizes = [len(part.lengths) for part in parts]
            self._tokenized = (key, join(parts, vocab, token_ids))
        return self._tokenized[1]

    def sentence_ids(
        self, epoch: int, group: int, groups: int, seed: int, shuffle: bool, stream: int = 0
    ) -> np.ndarray:
        """The sentences group `group` of `groups` reads in `epoch` of stream `stream` (see the
        module doc and `Corpus.sentence_ids`)."""
        sizes = self._count()
        base = np.cumsum([0, *sizes])
        m = -(-groups // len(self.shards))
        pieces = [(s, j) for s in range(len(self.shards)) for j in range(m)]
        order = shuffle_rng(stream, seed, epoch).permutation(len(pieces)) if shuffle else np.arange(len(pieces))
        ids = [np.zeros(0, np.int64)]
        for s, j in (pieces[p] for p in order[group::groups]):
            lines = np.arange(j, sizes[s], m)
            if shuffle:
                lines = lines[shuffle_rng(stream, seed, epoch, s, j).permutation(len(lines))]
            ids.append(base[s] + lines)
        return np.concatenate(ids)


def lm1b_shards(path: Path, split: str) -> list[Shard]:
    """LM1B's training files or its standard held-out file (docs/MODEL.md section 6), in a folder
    (the benchmark's folder or the one holding it) or in its .tar.gz."""
    pattern = LM1B_PATTERNS[split]
    if path.is_dir():
        for root in (path, path / LM1B_DIR):
            files = sorted(root.glob(pattern))
            if files:
                return [Shard(f) for f in files]
        raise MissingFile(
            f"lm1b:{path}: no file matches {pattern} in {path} or {path / LM1B_DIR} (expected the LM1B "
            f"folder {LM1B_DIR}/ or the folder holding it)"
        )
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        members = [name for name, _ in archive_members(path) if fnmatch.fnmatch(name, f"*{pattern}")]
        if not members:
            raise MissingFile(f"lm1b:{path}: the archive has no member matching */{pattern}")
        return [Shard(path, m) for m in sorted(members)]
    raise MissingFile(f"lm1b:{path}: neither a folder nor a .tar.gz archive")


TFDS_SPLITS = {"train": "train", "heldout": "test"}


def tfds_blocks(name: str, split: str, block: int = 65536) -> list[RecordBlock]:
    """A prepared TFDS dataset (`tfds.data_source`, array_record files; no TensorFlow needed) as
    blocks of `block` records; "heldout" is its test split."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError("tfds: sources need tensorflow-datasets: pip install 'elmo_jax[tfds]'") from None
    source = tfds.data_source(name, split=TFDS_SPLITS[split])
    n = len(source)
    return [
        RecordBlock(source, s, min(s + block, n), f"tfds:{name}[{TFDS_SPLITS[split]}][{s}:{min(s + block, n)}]")
        for s in range(0, n, block)
    ]
