import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from elmo_jax.text.vocab import Vocabulary, count_words


def write(tmp_path, lines):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_ids_and_unknown_words(tmp_path):
    vocab = Vocabulary.load(write(tmp_path, ["<S>", "</S>", "<UNK>", "the", "bank"]))
    assert len(vocab) == 5 and (vocab.bos, vocab.eos, vocab.unk) == (0, 1, 2)
    assert vocab.ids(["the", "bank", "zebra"]).tolist() == [3, 4, 2]


def test_special_tokens_anywhere(tmp_path):
    vocab = Vocabulary.load(write(tmp_path, ["the", "</S>", "<UNK>", "<S>"]))
    assert (vocab.bos, vocab.eos, vocab.unk) == (3, 1, 2)


@pytest.mark.parametrize("missing", ["<S>", "</S>", "<UNK>"])
def test_missing_special_token_names_file_and_token(tmp_path, missing):
    lines = [w for w in ["<S>", "</S>", "<UNK>", "the"] if w != missing]
    path = write(tmp_path, lines)
    with pytest.raises(ValueError, match=f"{path}.*missing.*{missing}"):
        Vocabulary.load(path)


def test_duplicate_word_names_file_and_lines(tmp_path):
    path = write(tmp_path, ["<S>", "</S>", "<UNK>", "the", "a", "the"])
    with pytest.raises(ValueError, match=rf"{path}: duplicate word 'the' on lines 4 and 6"):
        Vocabulary.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        Vocabulary.load(tmp_path / "nope.txt")


def test_from_counts_orders_by_count_then_word(tmp_path):
    counts = count_words([["b", "a", "c", "a"], ["c", "d"]])
    assert counts["</S>"] == 2
    vocab = Vocabulary.from_counts(counts)
    assert vocab.words == ["<S>", "</S>", "<UNK>", "a", "c", "b", "d"]
    assert Vocabulary.from_counts(counts, min_count=2).words == ["<S>", "</S>", "<UNK>", "a", "c"]
    vocab.save(tmp_path / "v.txt")
    assert Vocabulary.load(tmp_path / "v.txt").words == vocab.words


def test_counts_are_a_counter():
    assert isinstance(count_words([]), collections.Counter)


@pytest.mark.launches
def test_vocab_command_counts_a_stream_in_bilm_tf_order(tmp_path):
    root = Path(__file__).resolve().parent.parent
    # Counts: the 5, a 4 (tie with b), b 4, c 2, d 1; sentences in two files.
    (tmp_path / "part-1.txt").write_text("the a b\nthe a b c\n\n")
    (tmp_path / "part-2.txt").write_text("the a b\nthe a b c d\nthe\n")
    result = subprocess.run(
        [
            sys.executable,
            str(root / "launch.py"),
            "vocab",
            f"--data=text:{tmp_path}/part-*.txt",
            "--min_count=2",
            f"--output={tmp_path / 'vocab.txt'}",
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "vocab.txt").read_text().split("\n") == ["<S>", "</S>", "<UNK>", "the", "a", "b", "c", ""]
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats == {
        "sentences": 5,
        "tokens": 16,
        "types": 5,
        "vocabulary": 7,
        "min_count": 2,
        "oov_tokens": 1,
        "oov_rate": 1 / 16,
    }
    assert "out-of-vocabulary tokens 6.250%" in result.stdout
