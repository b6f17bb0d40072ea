"""Fine-tuning: a new run's params started from a trained model (a training workdir, an imported
folder, or bilm-tf options.json + weights.hdf5) on a new corpus with its own vocabulary.

The token encoder and the LSTMs are the model's; a softmax row is the model's row for the same
word where the model has a softmax and knows the word, and freshly initialised otherwise.
"""

from __future__ import annotations

import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.errors import UserError
from elmo_jax.model_io import Model
from elmo_jax.text.vocab import Vocabulary


def warm_start(params: dict, vocab: Vocabulary, source: Model, config: ModelConfig) -> tuple[dict, dict[str, int]]:
    """Fresh `params` (softmax over `vocab`, maybe padded) -> the same with `source`'s weights;
    also returns how many softmax rows were kept and how many are new."""
    differences = config.differences(source.config)
    if differences:
        raise UserError(
            f"the model to fine-tune from has another architecture (this config vs it): {'; '.join(differences)}"
        )
    out = {**params, "token_encoder": source.params["token_encoder"], "lstm": source.params["lstm"]}
    kept_new, kept_old = [], []
    if "softmax" in source.params and source.vocab is not None:
        for i, word in enumerate(vocab.words):
            if word in source.vocab:
                kept_new.append(i)
                kept_old.append(source.vocab.id(word))
    W, b = np.array(params["softmax"]["W"]), np.array(params["softmax"]["b"])
    if kept_new:
        W[kept_new] = np.asarray(source.params["softmax"]["W"])[kept_old]
        b[kept_new] = np.asarray(source.params["softmax"]["b"])[kept_old]
    out["softmax"] = {"W": W, "b": b}
    return out, {"kept": len(kept_new), "new": len(vocab) - len(kept_new)}
