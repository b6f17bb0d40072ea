"""`elmo-jax eval`: the params of a workdir's latest checkpoint on a held-out source."""

from __future__ import annotations

import math
from pathlib import Path

from absl.flags import FlagValues

from elmo_jax import strict_json
from elmo_jax.commands.command import Command
from elmo_jax.errors import RunFailed


def evaluate_workdir(
    workdir: str | Path, source: str | None = None, max_sentences: int | None = None, batch_size: int | None = None
) -> dict[str, float]:
    """Prints a summary; returns perplexities, tokens, step (and floor_perplexity for demo).

    Rows carry their LSTM state from sentence to sentence, so the number depends on the batch
    size; by default it is the run's own (config.train.eval_batch_size), as in training."""
    from elmo_jax.text.sources import open_corpus  # JAX: only once the command line is good
    from elmo_jax.train.evaluate import evaluate
    from elmo_jax.workdir import Workdir

    config, model_config, vocab, params, step = Workdir(workdir).restore_params()
    token_ids = Workdir(workdir).token_ids(model_config)
    source = source or config.data.heldout or "demo"
    corpus = open_corpus(source, "heldout")
    result = evaluate(
        params,
        corpus,
        vocab,
        model_config,
        batch_size or config.train.eval_batch_size,
        config.train.unroll_steps,
        max_sentences,
        token_ids=token_ids,
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


def main(flags: FlagValues) -> None:
    result = evaluate_workdir(flags.workdir, flags.data, flags.max_sentences or None, flags.batch_size)
    print(strict_json.dumps(result))


COMMAND = Command(
    main,
    "Held-out perplexity (full softmax) of a workdir's latest checkpoint.",
    "--workdir=DIR [--data=SOURCE] [--max_sentences=N] [--batch_size=N]",
    ("workdir", "data", "max_sentences", "batch_size"),
    ("workdir",),
)
