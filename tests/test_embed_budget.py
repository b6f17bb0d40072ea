"""embed is bounded by tokens, not rows: batches within a token budget, a very long line alone,
and a line over the limit refused by its number (the token encoder's pieces: test_embed_words.py)."""

import h5py
import jax
import numpy as np
import pytest
from tiny_models import tiny_options

from elmo_jax import embed
from elmo_jax.config import ModelConfig
from elmo_jax.embed import Embedder, embed_file, length_bucket, rows_bucket
from elmo_jax.errors import UserError
from elmo_jax.model.bilm import init_params
from elmo_jax.model_io import Model


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.from_options(tiny_options(16, 8, 4, [[1, 4], [2, 4]]))
    return Model(config, jax.tree.map(np.asarray, init_params(jax.random.key(3), config, None)))


def test_batches_stay_within_the_token_budget_and_a_long_line_runs_alone(tmp_path, model, monkeypatch):
    rng = np.random.default_rng(0)
    lines = [" ".join(f"w{rng.integers(50)}" for _ in range(rng.integers(1, 30))) for _ in range(40)]
    lines[17] = " ".join(f"w{i % 50}" for i in range(3000))
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    shapes = []
    real_streams = embed.padded_streams

    def streams(lanes, rows, whole):
        ids, mask, reset, slots = real_streams(lanes, rows, whole)
        shapes.append(mask.shape)
        return ids, mask, reset, slots

    monkeypatch.setattr(embed, "padded_streams", streams)
    embed_file(model, src, tmp_path / "out.h5", "all", batch_size=16, max_tokens=256, devices=1)
    assert all(rows * T <= 256 for rows, T in shapes if rows > 1)
    assert (1, length_bucket(3001)) in shapes and max(rows for rows, _ in shapes) <= 16
    alone = Embedder(model, batch_size=1)
    with h5py.File(tmp_path / "out.h5") as f:
        for i in (0, 17, 39):
            np.testing.assert_allclose(f[str(i)][...], alone([lines[i].split()])[0], atol=1e-6)

    with pytest.raises(UserError, match=r"in.txt: line 18 has 3,000 tokens, more than max_sentence_tokens=2,999"):
        embed_file(model, src, tmp_path / "refused.h5", "all", max_sentence_tokens=2999)
    assert not (tmp_path / "refused.h5").exists()


def test_rounds_pack_rows_nearly_full_within_the_budget():
    rng = np.random.default_rng(2)
    lengths = [int(n) for n in rng.integers(3, 40, size=500)] + [700]
    rounds = embed.pack_rounds(lengths, 32, 2048, stateful=False)
    placed = sorted(i for lanes in rounds for lane in lanes for i in lane)
    assert placed == list(range(len(lengths)))  # each sentence once
    padded = 0
    for lanes in rounds:
        T = length_bucket(max(sum(lengths[i] for i in lane) for lane in lanes))
        rows = rows_bucket(len(lanes), 32)
        assert rows * T <= 2048 or len(lanes) == 1
        padded += rows * T
    longest = next(lanes for lanes in rounds if any(500 in lane for lane in lanes))
    assert len(longest) <= 2048 // length_bucket(700)  # the rows its round can afford
    assert padded < 1.05 * sum(lengths)  # packed back to back: little padding
    assert embed.pack_rounds([5, 6, 7], 2, 2048, stateful=True) == [[[0], [1]], [[2]]]


def test_rows_bucket():
    assert [rows_bucket(n, 64) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64] and rows_bucket(9, 12) == 12
    assert embed.MAX_TOKENS >= 64 * 8  # a full batch of short sentences fits
