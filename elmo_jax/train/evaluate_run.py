"""`launch.py eval`: the latest checkpoint of a workdir on a held-out source."""

from __future__ import annotations

import math
from pathlib import Path

import ml_collections

from elmo_jax.errors import MissingFile, RunFailed
from elmo_jax.experiment import base_config, model_config
from elmo_jax.text.sources import open_corpus
from elmo_jax.text.vocab import Vocabulary
from elmo_jax.train.checkpoint import Checkpoints
from elmo_jax.train.evaluate import evaluate
from elmo_jax.train.loop import abstract_train_state, check_vocab, eval_summary, read_run_json, workdir_vocab
from elmo_jax.train.step import TrainState


def load_run_config(workdir: Path) -> ml_collections.ConfigDict:
    """The run's saved config; fields it predates take base_config's defaults."""
    path = workdir / "config.json"
    if not path.is_file():
        raise MissingFile(f"{workdir} is not a training workdir: {path} not found")
    saved = read_run_json(path)
    config = base_config(saved["model"]).to_dict()
    for section in ("train", "data"):
        config[section].update(saved.get(section, {}))
    return ml_collections.ConfigDict(config)


def restore_latest(workdir: Path) -> tuple[ml_collections.ConfigDict, Vocabulary, TrainState, int]:
    """A training workdir's config, vocabulary, newest intact TrainState and its step."""
    config = load_run_config(workdir)
    vocab = workdir_vocab(workdir)
    checkpoints = Checkpoints(workdir / "checkpoints")
    step = checkpoints.good_step()
    if step is None:
        raise MissingFile(f"no intact checkpoint in {workdir / 'checkpoints'}")
    check_vocab(checkpoints, step, config, vocab, workdir / "vocab.txt")
    state = checkpoints.restore_state(step, abstract_train_state(config, len(vocab)))
    checkpoints.close()
    return config, vocab, state, step


def evaluate_workdir(
    workdir: str | Path, source: str | None = None, max_sentences: int | None = None, batch_size: int | None = None
) -> dict[str, float]:
    """Prints a summary; returns perplexities, tokens, step (and floor_perplexity for demo).

    Rows carry their LSTM state from sentence to sentence, so the number depends on the batch
    size; by default it is the run's own (config.train.eval_batch_size), as in training."""
    workdir = Path(workdir)
    config, vocab, state, step = restore_latest(workdir)
    source = source or config.data.heldout or "demo"
    corpus = open_corpus(source, "heldout")
    result = eval_summary(
        evaluate(
            state.params,
            corpus,
            vocab,
            model_config(config),
            batch_size or config.train.eval_batch_size,
            config.train.unroll_steps,
            max_sentences,
        ),
        source,
    )
    if not all(math.isfinite(result[k]) for k in ("perplexity", "forward_perplexity", "backward_perplexity")):
        raise RunFailed(
            f"{workdir} at step {step}: the held-out perplexity is not finite ({result['perplexity']}): "
            "the model is broken"
        )
    print(f"{workdir} at step {step} on {corpus.name}, {result['tokens']:,} predicted tokens:")
    forward, backward = result["forward_perplexity"], result["backward_perplexity"]
    print(f"  perplexity {result['perplexity']:.3f} (forward {forward:.3f}, backward {backward:.3f})")
    if "floor_perplexity" in result:
        floor = result["floor_perplexity"]
        print(f"  demo corpus floor {floor:.3f}: {result['perplexity'] / floor:.3f}x the floor")
    return {**result, "step": step}
