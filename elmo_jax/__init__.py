"""elmo_jax: ELMo (Peters et al. 2018) in JAX.

    from elmo_jax import Elmo, batch_to_ids
    elmo = Elmo("workdirs/demo", dropout=0.0)
    out = elmo(batch_to_ids([["the", "river", "bank"]]))

The names below are imported on first use, so `import elmo_jax` stays cheap for the command line.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Elmo": "elmo_jax.elmo",
    "ScalarMix": "elmo_jax.model.scalar_mix",
    "batch_to_ids": "elmo_jax.text.chars",
    "Embedder": "elmo_jax.embed",
    "token_embeddings": "elmo_jax.embed",
    "load_model": "elmo_jax.model_io",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'elmo_jax' has no attribute {name!r}")
