"""The pictures: training curves from a workdir's metrics.jsonl (elmo_jax/curves.py) and the word
senses of the example (elmo_jax/examples/senses.py)."""

import json

import numpy as np
import pytest

from elmo_jax.curves import plot_curves, read_metrics
from elmo_jax.errors import UserError

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


def write_metrics(workdir, records):
    workdir.mkdir()
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def train_record(step, loss):
    return {"step": step, "kind": "train", "loss": loss, "loss_forward": loss + 0.1, "loss_backward": loss - 0.1}


def eval_record(step, perplexity, tokens):
    return {"step": step, "kind": "eval", "perplexity": perplexity, "forward_perplexity": perplexity + 1,
            "backward_perplexity": perplexity - 1, "tokens": tokens, "floor_perplexity": 20.9}  # fmt: skip


def test_a_step_recorded_twice_keeps_its_last_record(tmp_path):
    # A run killed after step 30 and resumed from its checkpoint at step 20 logs 30 again.
    records = [train_record(10, 5.0), train_record(20, 4.0), train_record(30, 3.9), train_record(30, 3.5)]
    write_metrics(tmp_path / "w", [*records, eval_record(30, 40.0, 1000)])
    metrics = read_metrics(tmp_path / "w" / "metrics.jsonl")
    assert [(r["step"], r["loss"]) for r in metrics["train"]] == [(10, 5.0), (20, 4.0), (30, 3.5)]
    assert [r["perplexity"] for r in metrics["eval"]] == [40.0]
    (tmp_path / "w" / "metrics.jsonl").write_text('{"step": 1, "kind": "train"}\nnot json\n')
    with pytest.raises(UserError, match="metrics.jsonl: line 2 is not a metrics record"):
        read_metrics(tmp_path / "w" / "metrics.jsonl")


def test_curves_are_drawn_into_the_workdir_or_a_new_file(tmp_path):
    workdir = tmp_path / "w"
    evals = [eval_record(100, 60.0, 500), eval_record(200, 40.0, 500), eval_record(200, 38.0, 5000)]
    write_metrics(workdir, [train_record(s, 6 - s / 100) for s in (50, 100, 150, 200)] + evals)
    assert plot_curves(workdir) == workdir / "training_curves.png"
    assert (workdir / "training_curves.png").read_bytes()[:8] == PNG
    plot_curves(workdir)  # the workdir's own picture is redrawn
    elsewhere = tmp_path / "curves.png"
    plot_curves(workdir, elsewhere, overwrite=False)
    with pytest.raises(UserError, match="already exists"):
        plot_curves(workdir, elsewhere, overwrite=False)
    with pytest.raises(UserError, match="not a training workdir, or no step logged yet"):
        plot_curves(tmp_path)


def test_principal_plane():
    from elmo_jax.examples.senses import principal_plane

    np.testing.assert_array_equal(principal_plane(np.ones((5, 8))), np.zeros((5, 2)))  # no context: one point
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 2)) * [10.0, 1.0] @ np.linalg.qr(rng.normal(size=(8, 8)))[0][:2]
    xy = principal_plane(x)
    # Distances are kept (the points span a plane) and the first axis has the larger spread.
    np.testing.assert_allclose(np.linalg.norm(xy - xy[0], axis=1), np.linalg.norm(x - x[0], axis=1), rtol=1e-6)
    assert xy[:, 0].std() > 5 * xy[:, 1].std()


def test_the_senses_picture_of_a_model(tmp_path, fixtures_dir):
    from elmo_jax.embed import Embedder
    from elmo_jax.examples.senses import draw_senses, noun_vectors
    from elmo_jax.model_io import load_model

    embedder = Embedder(load_model(fixtures_dir / "elmo"), batch_size=48)
    vectors, senses = noun_vectors(embedder, "bass")
    assert vectors.shape == (3, 48, 32) and senses == ["music"] * 24 + ["river"] * 24
    np.testing.assert_allclose(vectors[0], np.broadcast_to(vectors[0, :1], vectors[0].shape), atol=1e-5)
    draw_senses(embedder, tmp_path / "senses.png", "fixture model")
    assert (tmp_path / "senses.png").read_bytes()[:8] == PNG
