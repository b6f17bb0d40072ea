"""`Elmo`: ELMo as a Flax NNX module to drop into a downstream model, as AllenNLP's `Elmo`.

    elmo = Elmo("workdirs/demo", num_output_representations=1, dropout=0.0)
    out = elmo(batch_to_ids([["the", "river", "bank"]]))
    out["elmo_representations"][0]        # (B, T, 2P), a learned mix of the L + 1 layers
    out["mask"]                           # (B, T) bool

Char ids come without sentence boundaries (`batch_to_ids`); the module adds `<S>` and `</S>`,
runs the biLM from a zero state (stateless: a sentence's vectors never depend on its batch),
mixes the layers and removes the boundaries again unless `keep_sentence_boundaries`. The
outputs also carry TF-Hub's names: `word_emb` (B, T, P), `lstm_outputs1` ... (B, T, 2P) for each
LSTM layer, `elmo` (the first mix) and `default` (B, 2P), its mean over the real tokens.

The biLM weights are `Frozen` variables (not trained, no gradient flows into them) unless
`requires_grad=True` makes them `nnx.Param`s; the mixes are always trainable unless
`scalar_mix_parameters` fixes them. The LSTM's gradient is hand-written (`jax.custom_vjp`), so
the biLM supports reverse-mode autodiff (`grad`, `vjp`) but not forward mode (`jvp`, `jacfwd`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from elmo_jax.config import ModelConfig
from elmo_jax.local_devices import LocalDevices
from elmo_jax.model.bilm import bilm_layers
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.scalar_mix import Frozen, ScalarMix
from elmo_jax.model_io import Model, load_model
from elmo_jax.text.chars import BOS_TOKEN, EOS_TOKEN, TokenIds, sentence_ids, token_char_ids


class Elmo(nnx.Module):
    """Char ids (B, T, 50) -> {"elmo_representations": [num_output_representations x (B, T, 2P)],
    "mask": (B, T), "word_emb", "lstm_outputs1", ..., "elmo", "default"}.

    `source` is a published model by name (`"original"`, downloaded once into the cache; see
    elmo_jax/published.py), a training workdir, an imported or exported folder, a folder of
    bilm-tf files under their published names, or a loaded `Model`; or give `options` and
    `weights` files.
    Dropout (AllenNLP's default 0.5) applies to each mix in training mode (`elmo.train()`, the
    default for NNX modules) and not after `elmo.eval()`; its random stream is `rngs`
    (default `nnx.Rngs(0)`).

    The biLM's weights are replicated on the first `devices` local devices (None: all), and a
    call outside any jit splits its batch rows over them (the vectors are those of one device);
    under the caller's jit, the caller's layout decides."""

    def __init__(
        self,
        source: str | Path | Model | None = None,
        *,
        options: str | Path | None = None,
        weights: str | Path | None = None,
        num_output_representations: int = 1,
        dropout: float = 0.5,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
        rngs: nnx.Rngs | None = None,
        devices: int | None = None,
    ):
        model = source if isinstance(source, Model) else load_model(source, options, weights)
        if num_output_representations < 1:
            raise ValueError(f"num_output_representations={num_output_representations}: must be at least 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout}: must be in [0, 1)")
        self.config, self.tokens = model.config, model.tokens
        self.devices = LocalDevices(devices)
        self.requires_grad, self.keep_sentence_boundaries = requires_grad, keep_sentence_boundaries
        kind = nnx.Param if requires_grad else Frozen
        bilm = {"token_encoder": model.params["token_encoder"], "lstm": model.params["lstm"]}
        self.bilm = nnx.data(jax.tree.map(kind, self.devices.replicate(bilm)))
        layers = model.config.lstm.n_layers + 1
        self.mixes = nnx.List(
            [
                ScalarMix(layers, do_layer_norm, scalar_mix_parameters, trainable=scalar_mix_parameters is None)
                for _ in range(num_output_representations)
            ]
        )
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        if "dropout" not in rngs and "default" not in rngs:  # under nnx.bridge.ToLinen: linen's "params" rng
            rngs = nnx.Rngs(dropout=rngs.params())
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def batch_to_ids(self, sentences: list[list[str]]) -> jax.Array:
        """Token lists -> the ids this model reads (B, T, I), padded slots 0: `batch_to_ids` for
        bilm-tf's models (I = 50), the model's own vocabularies for ELMoForManyLangs' (I = its
        word id and its char ids)."""
        return jnp.asarray(sentence_ids(sentences, self.tokens))

    @property
    def output_dim(self) -> int:
        """2P: the width of every representation and LSTM layer."""
        return 2 * self.config.lstm.projection_dim

    def bilm_params(self) -> dict:
        """The biLM's weights as the plain nested dict `bilm_layers` takes (see model/bilm.py)."""
        params = jax.tree.map(lambda v: v[...], self.bilm, is_leaf=lambda v: isinstance(v, nnx.Variable))
        return params if self.requires_grad else jax.lax.stop_gradient(params)

    def _layers(self, chars_BTC: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The biLM's layers (L + 1, B, T, 2P) and mask (B, T); outside a jit, the rows split
        over the devices (padded to a multiple of them, and cut back)."""
        if isinstance(chars_BTC, jax.core.Tracer) or self.devices.size == 1:
            return _bilm(self.config)(self.bilm_params(), chars_BTC)
        B = chars_BTC.shape[0]
        padded = jnp.pad(chars_BTC, ((0, self.devices.round_up(B) - B), (0, 0), (0, 0)))
        layers, mask = _bilm(self.config)(self.bilm_params(), jax.device_put(padded, self.devices.sharded_on(0)))
        return layers[:, :B], mask[:B]

    def __call__(self, char_ids_BTC: jax.Array) -> dict:
        C = self.config.token_width
        if isinstance(char_ids_BTC, (list, tuple, str)):
            raise TypeError(
                f"Elmo takes char ids (B, T, {C}), not {type(char_ids_BTC).__name__}s: use batch_to_ids(sentences)"
            )
        char_ids_BTC = jnp.asarray(char_ids_BTC)
        if char_ids_BTC.ndim != 3 or char_ids_BTC.shape[-1] != C or not jnp.issubdtype(char_ids_BTC.dtype, jnp.integer):
            raise ValueError(
                f"Elmo takes integer char ids (B, T, {C}) from {self._ids_function()}, "
                f"got {char_ids_BTC.dtype} {char_ids_BTC.shape}"
            )
        if self.config.token_ids != "bytes" and not isinstance(char_ids_BTC, jax.core.Tracer):
            self._check_ids(np.asarray(char_ids_BTC))
        chars = with_sentence_boundaries(char_ids_BTC, self.tokens)
        layers, mask = self._layers(chars)
        mixes = [mix(layers, mask) for mix in self.mixes]
        if not self.keep_sentence_boundaries:
            mask = jnp.any(char_ids_BTC > 0, axis=-1)
            keep = mask[..., None]
            layers = jnp.where(keep, layers[:, :, 1:-1], 0.0)
            mixes = [jnp.where(keep, m[:, 1:-1], 0.0) for m in mixes]
        representations = [self.dropout(m) for m in mixes]
        P = self.config.lstm.projection_dim
        counts = jnp.maximum(mask.sum(axis=1, keepdims=True), 1)
        out = {"elmo_representations": representations, "mask": mask, "word_emb": layers[0, ..., :P]}
        out.update({f"lstm_outputs{l}": layers[l] for l in range(1, len(layers))})
        out["elmo"] = representations[0]
        out["default"] = jnp.sum(jnp.where(mask[..., None], representations[0], 0.0), axis=1) / counts
        return out

    def _check_ids(self, ids: np.ndarray) -> None:
        """Ids past the model's tables (bilm-tf's from `batch_to_ids`, say) would be clamped by
        JAX's gather onto the last row, silently: refused (outside a jit, where they are known)."""
        lead, words = self.tokens.lead, self.config.word_embedding
        chars_past = ids[..., lead:].max(initial=0) >= self.config.char_cnn.n_characters
        if chars_past or (words is not None and ids[..., 0].max(initial=0) >= words.n_words):
            raise ValueError(f"ids past this model's tables: give it the ids of {self._ids_function()}")

    def _ids_function(self) -> str:
        return "batch_to_ids" if self.config.token_ids == "bytes" else "elmo.batch_to_ids (this model's vocabularies)"


@functools.cache
def _bilm(config: ModelConfig):
    """(params, chars (B, T, C)) -> layers (L + 1, B, T, 2P), mask (B, T), from a zero state;
    jitted, so that eager calls run compiled too (inlined under an outer jit)."""

    def layers(params: dict, chars_BTC: jax.Array) -> tuple[jax.Array, jax.Array]:
        state = LSTMState.zeros(config, chars_BTC.shape[0])
        return bilm_layers(params, chars_BTC, state, config)[:2]

    return jax.jit(layers)


def with_sentence_boundaries(char_ids_BTC: jax.Array, tokens: TokenIds | None = None) -> jax.Array:
    """(B, T, C) char ids of left-aligned tokens, padded slots 0 -> (B, T + 2, C) with the
    sentence's first boundary token (bilm-tf's `<S>`, or `tokens.bos`) before each sentence and
    the last (`</S>`) after its last token."""
    B, T, C = char_ids_BTC.shape
    lengths = jnp.any(char_ids_BTC > 0, axis=-1).sum(axis=1)
    bos, eos = token_char_ids([BOS_TOKEN, EOS_TOKEN], C) if tokens is None else tokens.encode([tokens.bos, tokens.eos])
    padded = jnp.pad(char_ids_BTC, ((0, 0), (1, 1), (0, 0))).at[:, 0].set(bos)
    at_end = (jnp.arange(T + 2)[None, :] == lengths[:, None] + 1)[..., None]
    return jnp.where(at_end, eos, padded)
