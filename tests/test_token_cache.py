"""The token cache (elmo_jax/text/token_cache.py): never stale, keys that cannot collide, damaged
files rebuilt, two writers at once, a cache that cannot be written falls back to memory with one
warning, a warm start that reads no text, and worker processes that fail or are stopped."""

import errno
import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from elmo_jax import stop_signals
from elmo_jax.errors import RunFailed
from elmo_jax.text import file_facts, token_cache, token_store, token_workers
from elmo_jax.text.shards import RecordBlock, Shard, ShardedCorpus
from elmo_jax.text.tokenized import tokenize_lines
from elmo_jax.text.vocab import Vocabulary


def tokenize_files(paths, vocab):
    """Each file's `Lines` through the cache, as ShardedCorpus.tokenized gets them."""
    shards = [Shard(p) for p in paths]
    return token_cache.tokenize(
        [s.identity() for s in shards],
        lambda indices: ((i, shards[i].lines()) for i in indices),
        vocab,
        [(s.path, s.sha256()) for s in shards],
    )


@pytest.fixture
def shards(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", str(tmp_path / "cache"))
    paths = []
    for s in range(3):
        path = tmp_path / f"shard{s}.txt"
        path.write_bytes(f"the cat sat\n\nrare{s} words here\n  \ncafé w\xc3\n".encode().replace(b"\xc3\x83", b"\xc3"))
        paths.append(path)
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "the", "cat", "sat", "words", "café"])
    return paths, vocab, tmp_path / "cache"


def expected(path, vocab):
    return tokenize_lines([line for line in path.read_bytes().split(b"\n") if line.strip()], vocab.word_ids)


def assert_lines_equal(a, b):
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.bad, b.bad)
    assert a.oov == b.oov


def test_second_read_comes_from_the_cache_and_equals_tokenizing(shards, caplog):
    paths, vocab, cache = shards
    caplog.set_level("INFO", logger=token_cache.log.name)
    first = tokenize_files(paths, vocab)
    assert len(list(cache.glob("*.npz"))) == 3 and "tokenized 3 shard(s)" in caplog.text
    caplog.clear()
    second = tokenize_files(paths, vocab)
    assert "tokenized" not in caplog.text  # nothing tokenized again
    for a, b, path in zip(first, second, paths):
        assert_lines_equal(a, expected(path, vocab))
        assert_lines_equal(b, expected(path, vocab))
    assert first[0].oov == ["rare0", "here", "w\ufffd"] and first[0].bad.tolist() == [3]


def test_a_changed_shard_or_vocabulary_is_tokenized_again(shards):
    paths, vocab, cache = shards
    tokenize_files(paths, vocab)
    paths[1].write_text("the cat sat down\n")  # same name, new content
    (lines,) = tokenize_files(paths[1:2], vocab)
    assert lines.lengths.tolist() == [4] and lines.oov == ["down"]
    bigger = Vocabulary(vocab.words + ["down"])
    (lines,) = tokenize_files(paths[1:2], bigger)
    assert lines.oov == [] and lines.ids.tolist() == [3, 4, 5, 8]


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "not a zip"])
def test_a_damaged_cache_file_is_detected_and_rebuilt(shards, caplog, damage):
    paths, vocab, cache = shards
    tokenize_files(paths[:1], vocab)
    (file,) = cache.glob("*.npz")
    data = bytearray(file.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped byte":
        data[len(data) // 3] ^= 0xFF
    else:
        data = b"hello"
    file.write_bytes(bytes(data))
    (lines,) = tokenize_files(paths[:1], vocab)
    assert_lines_equal(lines, expected(paths[0], vocab))
    assert "is damaged" in caplog.text
    caplog.clear()
    (lines,) = tokenize_files(paths[:1], vocab)  # the file was replaced: read cleanly
    assert "damaged" not in caplog.text
    assert_lines_equal(lines, expected(paths[0], vocab))


def test_two_writers_at_once_leave_one_good_file(shards):
    paths, vocab, cache = shards
    results, start = [], threading.Barrier(4)

    def fill():
        start.wait()
        results.append(tokenize_files(paths, vocab))

    threads = [threading.Thread(target=fill) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(list(cache.glob("*.npz"))) == 3
    assert not list(cache.glob(".*.tmp"))  # no temporary file left behind
    for lines in [*results, tokenize_files(paths, vocab)]:
        for a, path in zip(lines, paths):
            assert_lines_equal(a, expected(path, vocab))


def test_a_cache_that_cannot_be_written_falls_back_to_memory_with_one_warning(shards, monkeypatch, caplog, tmp_path):
    paths, vocab, _ = shards
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", str(tmp_path / "a_file" / "cache"))  # not a folder: cannot be made
    lines = tokenize_files(paths, vocab)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "cannot be written" in warnings[0].getMessage()
    for a, path in zip(lines, paths):
        assert_lines_equal(a, expected(path, vocab))


def test_a_full_disk_while_writing_falls_back_to_memory_and_leaves_no_partial_file(shards, monkeypatch, caplog):
    paths, vocab, cache = shards
    real = np.savez

    def savez_then_disk_full(f, **arrays):
        real(f, **arrays)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(token_store.np, "savez", savez_then_disk_full)
    lines = tokenize_files(paths, vocab)
    assert [r.levelname for r in caplog.records].count("WARNING") == 1 and "No space left" in caplog.text
    assert not list(cache.glob("*.npz")) and not list(cache.glob(".*.tmp"))
    for a, path in zip(lines, paths):
        assert_lines_equal(a, expected(path, vocab))


def test_the_cache_can_be_turned_off(shards, monkeypatch, caplog):
    paths, vocab, cache = shards
    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", "off")
    lines = tokenize_files(paths, vocab)
    assert not cache.exists() and not [r for r in caplog.records if r.levelname == "WARNING"]
    assert_lines_equal(lines[0], expected(paths[0], vocab))


@pytest.mark.launches
def test_worker_processes_fill_the_cache_with_what_this_process_would_make(shards, monkeypatch):
    paths, vocab, cache = shards
    monkeypatch.setattr(token_cache, "PARALLEL_BYTES", 0)  # workers even for this little text
    monkeypatch.setattr(token_cache.os, "cpu_count", lambda: 2)
    lines = tokenize_files(paths, vocab)
    assert len(list(cache.glob("*.npz"))) == 3 and not list(cache.glob(".vocab*"))
    for a, path in zip(lines, paths):
        assert_lines_equal(a, expected(path, vocab))


def test_keys_cannot_collide_on_how_the_text_is_cut(tmp_path, monkeypatch):
    """Lines holding a newline, the same bytes as more lines, a file of the bytes they join to:
    each is its own shard (token cache 1 keyed all three alike and handed back the first's)."""
    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", str(tmp_path / "cache"))
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "a", "b"])

    def records(*texts):
        return ShardedCorpus("r", [RecordBlock([{"text": t} for t in texts], 0, len(texts), "r")]).tokenized(vocab)

    assert records(b"a\nb").lengths.tolist() == [2]  # one record holding a newline: one sentence
    assert records(b"a", b"b").lengths.tolist() == [1, 1]
    (tmp_path / "f.txt").write_bytes(b"a\nb\n#lines")
    assert ShardedCorpus("f", [Shard(tmp_path / "f.txt")]).tokenized(vocab).lengths.tolist() == [1, 1, 1]
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 3
    # The kinds and parts are length-prefixed: no two different lists of parts give one identity.
    assert token_store.identity("records", b"ab") != token_store.identity("records", b"a", b"b")
    assert token_store.lines_sha256([b"a\nb"]) != token_store.lines_sha256([b"a", b"b"])


def test_files_of_the_earlier_format_are_never_read(shards):
    """Version 1 named a file's cache by SHA-256(format 1 + the file's SHA-256 + the vocabulary's):
    such a file, even holding wrong numbers, is not what version 2 reads."""
    paths, vocab, cache = shards
    content = hashlib.sha256(paths[0].read_bytes()).digest()
    old = hashlib.sha256(b"elmo_jax tokens 1\0" + content + vocab.sha256.encode()).hexdigest()[:40]
    cache.mkdir()
    token_store.save(cache / f"{old}.npz", tokenize_lines([b"cat cat cat cat"], vocab.word_ids))
    (lines,) = tokenize_files(paths[:1], vocab)
    assert_lines_equal(lines, expected(paths[0], vocab))


def test_a_warm_start_reads_no_text_and_a_changed_file_is_read_again(shards, monkeypatch):
    """A file's SHA-256 is remembered by its state on disk (file_facts.py), in the cache folder:
    another process (here: the in-process memory cleared) reads none of its bytes. Rewriting a
    file with its size and modification time kept still changes its state (the change time)."""
    paths, vocab, cache = shards
    tokenize_files(paths, vocab)
    assert len(list((cache / file_facts.FOLDER).glob("*.json"))) == 3
    file_facts._in_process.clear()
    real_open = open

    def no_text(path, *args, **kwargs):
        assert Path(path) not in paths, f"{path} was read"
        return real_open(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr("builtins.open", no_text)
        m.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} was read"))
        warm = tokenize_files(paths, vocab)
    for a, path in zip(warm, paths):
        assert_lines_equal(a, expected(path, vocab))

    stat = paths[1].stat()
    text = paths[1].read_bytes()
    paths[1].write_bytes(text.replace(b"the cat sat", b"sat the cat"))  # the same size
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same modification time
    time.sleep(0.01)
    (lines,) = tokenize_files(paths[1:2], vocab)
    assert lines.ids[:3].tolist() == [5, 3, 4]  # sat the cat


def test_an_archive_is_listed_once(tmp_path, monkeypatch):
    """The members of a .tar.gz and their SHA-256 are remembered: the next start does not
    decompress it to list them."""
    import io
    import tarfile

    from elmo_jax.text import shards

    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", str(tmp_path / "cache"))
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("x/one.txt", "x/two.txt"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"a b\n"))
    sha = hashlib.sha256(b"a b\n").hexdigest()
    assert shards.archive_members(archive) == [("x/one.txt", sha), ("x/two.txt", sha)]
    file_facts._in_process.clear()
    monkeypatch.setattr(shards, "iter_archive", lambda path: pytest.fail("decompressed again"))
    assert shards.archive_members(archive) == [("x/one.txt", sha), ("x/two.txt", sha)]


@pytest.fixture
def workers(shards, monkeypatch, tmp_path):
    """Two workers for the three files, run by a stand-in for Python (`python.sh`) whose body
    the test writes; the files, vocabulary and cache folder."""
    paths, vocab, cache = shards
    monkeypatch.setattr(token_cache, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(token_cache.os, "cpu_count", lambda: 2)
    stand_in = tmp_path / "python.sh"
    monkeypatch.setattr(token_workers.sys, "executable", str(stand_in))

    def body(text: str) -> None:
        stand_in.write_text(f"#!/usr/bin/env bash\n{text}\n")
        stand_in.chmod(0o755)

    return paths, vocab, cache, body


@pytest.mark.launches
def test_a_failed_worker_stops_the_run_naming_it_and_its_file(workers):
    """Token cache 1 waited for its workers without reading their status and quietly did their
    files again on one core."""
    paths, vocab, cache, body = workers
    body("echo 'MemoryError: the worker ran out' >&2; exit 3")
    with pytest.raises(RunFailed) as failed:
        tokenize_files(paths, vocab)
    message = str(failed.value)
    # Both workers fail; the first the wait sees is named (either, by timing: CI's py311 lane saw 2).
    assert re.search(r"tokenizing worker [12] of 2 \(pid \d+\) exited with status 3 on", message), message
    assert "shard" in message and message.count("MemoryError: the worker ran out") == 1
    assert "run again to go on" in message
    assert not list(cache.glob(".vocab*")) and not list(cache.glob("*.npz"))


@pytest.mark.launches
def test_a_stop_signal_while_workers_tokenize_stops_them_within_seconds(workers):
    """The wait sees the signal at once; the workers (in sessions of their own, so Ctrl-C at a
    terminal would not reach them) are stopped, their temporaries and the vocabulary file gone.
    (Token cache 1's parent went on alone; eval's exit left the workers running.)"""
    paths, vocab, cache, body = workers
    body(f"echo $$ >> {cache.parent / 'pids'}; touch {cache}/.x.npz.$$.abc.tmp; exec sleep 60")
    stop_signals.install()
    try:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        began = time.monotonic()
        with pytest.raises(stop_signals.Stopped):
            tokenize_files(paths, vocab)
        assert time.monotonic() - began < 8
    finally:
        stop_signals.uninstall()
    pids = [int(p) for p in (cache.parent / "pids").read_text().split()]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not list(cache.glob(".vocab*")) and not list(cache.glob(".*.tmp"))


@pytest.mark.launches
def test_a_worker_exits_when_its_parent_has_gone(shards, tmp_path):
    """Orphaned (its parent killed), a worker stops after the file it is on."""
    paths, vocab, cache = shards
    cache.mkdir()
    vocab_file = tmp_path / "vocab.txt"
    vocab.save(vocab_file)
    sleeper = subprocess.Popen(["sleep", "0"])
    sleeper.wait()  # a parent that has ended
    tasks = [
        part
        for p in paths
        for part in (str(p), hashlib.sha256(p.read_bytes()).hexdigest(), str(cache / f"{p.name}.npz"))
    ]
    args = [
        sys.executable,
        "-m",
        "elmo_jax.text.token_workers",
        str(vocab_file),
        vocab.sha256,
        str(sleeper.pid),
        *tasks,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["0"]  # one file, then it saw it was alone
    assert [p.name for p in cache.glob("*.npz")] == [f"{paths[0].name}.npz"]


def test_an_archive_is_read_and_tokenized_one_member_at_a_time(tmp_path, monkeypatch):
    """Each member is tokenized as it comes out of the one decompression pass, so one member's
    lines are in memory at a time (every member's lines were read first: about 30M Python bytes
    objects for LM1B's .tar.gz); a start with the cache filled decompresses nothing."""
    import io
    import tarfile

    from elmo_jax.text import shards

    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", str(tmp_path / "cache"))
    archive = tmp_path / "text.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for k in range(4):
            data = f"the cat sat {k}\nwords here\n".encode()
            info = tarfile.TarInfo(f"x/shard{k}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "the", "cat", "sat", "words"])
    events = []
    read, tokenize = shards._lines_of, token_cache.tokenize_lines
    monkeypatch.setattr(shards, "_lines_of", lambda f: events.append("read") or read(f))
    monkeypatch.setattr(
        token_cache, "tokenize_lines", lambda lines, ids: events.append("tokenize") or tokenize(lines, ids)
    )
    corpus = ShardedCorpus("a", [Shard(archive, f"x/shard{k}.txt") for k in range(4)])
    assert corpus.tokenized(vocab).lengths.tolist() == [4, 2] * 4
    assert events == ["read", "tokenize"] * 4
    events.clear()
    again = ShardedCorpus("a", [Shard(archive, f"x/shard{k}.txt") for k in range(4)])
    assert again.tokenized(vocab).lengths.tolist() == [4, 2] * 4 and events == []
