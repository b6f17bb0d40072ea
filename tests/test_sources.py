"""Sharded sources: a fake LM1B folder and .tar.gz with the real file names, text globs, the
groups' disjoint streams, resuming across a shard boundary, and bad input."""

import io
import tarfile

import numpy as np
import pytest

from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.text.shards import LM1B_DIR
from elmo_jax.text.sources import open_corpus
from elmo_jax.text.vocab import Vocabulary, count_words

TRAIN = "training-monolingual.tokenized.shuffled"
HELDOUT = "heldout-monolingual.tokenized.shuffled"


def shard_text(shard: int, n: int) -> str:
    """n sentences naming their shard and line, of 1 to 6 words; one empty line."""
    lines = [" ".join([f"s{shard}l{i}"] + ["w"] * (i % 6)) for i in range(n)]
    return "\n".join(lines[:3] + [""] + lines[3:]) + "\n"


@pytest.fixture(scope="module")
def lm1b(tmp_path_factory):
    """(folder, archive): 5 training shards (NN = 01..05) and 2 held-out ones."""
    root = tmp_path_factory.mktemp("lm1b")
    files = {f"{TRAIN}/news.en-{k:05d}-of-00100": shard_text(k, 20 + 3 * k) for k in range(1, 6)}
    files.update({f"{HELDOUT}/news.en.heldout-{k:05d}-of-00050": shard_text(100 + k, 15) for k in range(2)})
    for name, text in files.items():
        path = root / LM1B_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    archive = root / "lm1b.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in sorted(files.items(), reverse=True):  # archive order != sorted order
            data = text.encode()
            info = tarfile.TarInfo(f"{LM1B_DIR}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return root, archive


def test_folder_and_archive_hold_the_same_splits(lm1b):
    root, archive = lm1b
    for source in (f"lm1b:{root}", f"lm1b:{root / LM1B_DIR}", f"lm1b:{archive}"):
        train, heldout = open_corpus(source, "train"), open_corpus(source, "heldout")
        assert len(train) == sum(20 + 3 * k for k in range(1, 6))
        assert sorted(w[0] for w in heldout.stream()) == sorted(f"s100l{i}" for i in range(15))  # file 00000 only
        vocab = Vocabulary.from_counts(count_words(train.stream()))
        assert train.tokenized(vocab).positions() == sum(len(s) + 1 for s in train.stream())


def batches(corpus, vocab, n, state=None, groups=2):
    batcher = StreamBatcher(corpus, vocab, 4, 5, seed=3, groups=groups)
    if state is not None:
        batcher.restore(state)
    out = [next(batcher) for _ in range(n)]
    return out, batcher.state()


def test_resume_across_a_shard_boundary_gives_identical_batches(lm1b):
    root, archive = lm1b
    corpus = open_corpus(f"lm1b:{archive}", "train")
    vocab = Vocabulary.from_counts(count_words(corpus.stream()))
    straight, _ = batches(corpus, vocab, 60)
    _, state = batches(corpus, vocab, 25)
    resumed, _ = batches(open_corpus(f"lm1b:{root}", "train"), vocab, 35, state)  # the folder, a fresh reader
    # Rows have crossed into other shards (and the next epoch) after the restore point.
    assert {p[0] for p in state["rows"]} == {0}  # the forward streams
    for a, b in zip(straight[25:], resumed, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_groups_read_disjoint_pieces_that_cover_the_corpus(lm1b):
    corpus = open_corpus(f"lm1b:{lm1b[0]}", "train")
    everything = list(range(len(corpus)))
    for groups in (2, 7):  # 7 groups > 5 shards: shards are cut into pieces
        for stream in (0, 1):  # the forward LM's, the backward LM's own
            seen = [i for g in range(groups) for i in corpus.sentence_ids(0, g, groups, 3, True, stream).tolist()]
            assert sorted(seen) == everything
    first, second, backward = (corpus.sentence_ids(e, 0, 2, 3, True, n)[:5] for e, n in ((0, 0), (1, 0), (0, 1)))
    assert first.tolist() != second.tolist()  # reshuffled per epoch
    assert first.tolist() != backward.tolist()  # and per stream


def test_a_folder_without_the_files_lists_what_it_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"news.en-000\?\?-of-00100 in .*1-billion-word"):
        open_corpus(f"lm1b:{tmp_path}", "train")


def test_a_truncated_archive_fails_naming_the_member(lm1b, tmp_path):
    data = lm1b[1].read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ValueError, match=r"cut.tar.gz: corrupt or truncated archive, while reading .*news.en"):
        len(open_corpus(f"lm1b:{cut}", "train"))


def test_tfds_source_reads_blocks_of_records():
    tfds = pytest.importorskip("tensorflow_datasets")
    from elmo_jax.text.shards import ShardedCorpus, tfds_blocks

    with tfds.testing.mock_data(num_examples=20):  # mocked records hold str; real ones bytes
        source = tfds.data_source("lm1b", split="test")
        want = [s for s in (source[i]["text"].split() for i in range(20)) if s]
        assert list(open_corpus("tfds:lm1b", "heldout").stream()) == want
        blocks = ShardedCorpus("blocks", tfds_blocks("lm1b", "heldout", block=7))
        assert len(blocks.shards) == 3 and len(blocks) == len(want)
        vocab = Vocabulary.from_counts(count_words(want))
        batch = next(StreamBatcher(blocks, vocab, 2, 5, groups=2))  # one group per device, as in training
        assert batch.mask.all()
