"""The token cache (elmo_jax/text/token_cache.py): never stale, damaged files rebuilt, two
writers at once, and a cache that cannot be written falls back to memory with one warning."""

import errno
import threading

import numpy as np
import pytest

from elmo_jax.text import token_cache
from elmo_jax.text.tokenized import tokenize_lines
from elmo_jax.text.vocab import Vocabulary


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
    first = token_cache.tokenize_files(paths, vocab)
    assert len(list(cache.glob("*.npz"))) == 3 and "tokenized 3 shard(s)" in caplog.text
    caplog.clear()
    second = token_cache.tokenize_files(paths, vocab)
    assert "tokenized" not in caplog.text  # nothing tokenized again
    for a, b, path in zip(first, second, paths):
        assert_lines_equal(a, expected(path, vocab))
        assert_lines_equal(b, expected(path, vocab))
    assert first[0].oov == ["rare0", "here", "w\ufffd"] and first[0].bad.tolist() == [3]


def test_a_changed_shard_or_vocabulary_is_tokenized_again(shards):
    paths, vocab, cache = shards
    token_cache.tokenize_files(paths, vocab)
    paths[1].write_text("the cat sat down\n")  # same name, new content
    (lines,) = token_cache.tokenize_files(paths[1:2], vocab)
    assert lines.lengths.tolist() == [4] and lines.oov == ["down"]
    bigger = Vocabulary(vocab.words + ["down"])
    (lines,) = token_cache.tokenize_files(paths[1:2], bigger)
    assert lines.oov == [] and lines.ids.tolist() == [3, 4, 5, 8]


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "not a zip"])
def test_a_damaged_cache_file_is_detected_and_rebuilt(shards, caplog, damage):
    paths, vocab, cache = shards
    token_cache.tokenize_files(paths[:1], vocab)
    (file,) = cache.glob("*.npz")
    data = bytearray(file.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped byte":
        data[len(data) // 3] ^= 0xFF
    else:
        data = b"hello"
    file.write_bytes(bytes(data))
    (lines,) = token_cache.tokenize_files(paths[:1], vocab)
    assert_lines_equal(lines, expected(paths[0], vocab))
    assert "is damaged" in caplog.text
    caplog.clear()
    (lines,) = token_cache.tokenize_files(paths[:1], vocab)  # the file was replaced: read cleanly
    assert "damaged" not in caplog.text
    assert_lines_equal(lines, expected(paths[0], vocab))


def test_two_writers_at_once_leave_one_good_file(shards):
    paths, vocab, cache = shards
    results, start = [], threading.Barrier(4)

    def fill():
        start.wait()
        results.append(token_cache.tokenize_files(paths, vocab))

    threads = [threading.Thread(target=fill) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(list(cache.glob("*.npz"))) == 3
    assert not list(cache.glob(".*.tmp"))  # no temporary file left behind
    for lines in [*results, token_cache.tokenize_files(paths, vocab)]:
        for a, path in zip(lines, paths):
            assert_lines_equal(a, expected(path, vocab))


def test_a_cache_that_cannot_be_written_falls_back_to_memory_with_one_warning(shards, monkeypatch, caplog, tmp_path):
    paths, vocab, _ = shards
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", str(tmp_path / "a_file" / "cache"))  # not a folder: cannot be made
    lines = token_cache.tokenize_files(paths, vocab)
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

    monkeypatch.setattr(token_cache.np, "savez", savez_then_disk_full)
    lines = token_cache.tokenize_files(paths, vocab)
    assert [r.levelname for r in caplog.records].count("WARNING") == 1 and "No space left" in caplog.text
    assert list(cache.iterdir()) == []
    for a, path in zip(lines, paths):
        assert_lines_equal(a, expected(path, vocab))


def test_the_cache_can_be_turned_off(shards, monkeypatch, caplog):
    paths, vocab, cache = shards
    monkeypatch.setenv("ELMO_JAX_TOKEN_CACHE", "off")
    lines = token_cache.tokenize_files(paths, vocab)
    assert not cache.exists() and not [r for r in caplog.records if r.levelname == "WARNING"]
    assert_lines_equal(lines[0], expected(paths[0], vocab))


@pytest.mark.launches
def test_worker_processes_fill_the_cache_with_what_this_process_would_make(shards, monkeypatch):
    paths, vocab, cache = shards
    monkeypatch.setattr(token_cache, "PARALLEL_BYTES", 0)  # workers even for this little text
    monkeypatch.setattr(token_cache.os, "cpu_count", lambda: 2)
    lines = token_cache.tokenize_files(paths, vocab)
    assert len(list(cache.glob("*.npz"))) == 3 and not list(cache.glob(".vocab*"))
    for a, path in zip(lines, paths):
        assert_lines_equal(a, expected(path, vocab))
