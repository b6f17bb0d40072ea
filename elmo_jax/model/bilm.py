"""The biLM: token encoder, forward and backward LSTM stacks, all layers out.

Params are a plain nested dict:
  token_encoder: char_embed (n_characters, D), cnn/filter_i {W (w, D, n), b (n,)},
                 highway/layer_k {W_carry, b_carry, W_transform, b_transform}, proj {W (F, P), b};
                 with a word embedding: word_embed (n_words, Dw), proj W (Dw + F, P)
  lstm:          layer_l {W_0 (2, 2P, 4C), B (2, 4C), W_P_0 (2, C, P)}  (axis 0: fwd, bwd)
  softmax:       W (V, P), b (V,)  (absent in an embedding-only model)
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.model import Params
from elmo_jax.model.dropout import apply_dropout
from elmo_jax.model.lstm import LSTMState, init_lstm, lstm_stacks
from elmo_jax.model.token_encoder import encode_tokens, init_token_encoder
from elmo_jax.model.wavefront import input_gates


def init_params(rng: jax.Array, config: ModelConfig, vocab_size: int | None) -> Params:
    """Fresh params as bilm-tf initialises them; no softmax when `vocab_size` is None."""
    k_tok, k_lstm, k_soft = jax.random.split(rng, 3)
    params = {"token_encoder": init_token_encoder(k_tok, config), "lstm": init_lstm(k_lstm, config)}
    if vocab_size is not None:
        P = config.lstm.projection_dim
        params["softmax"] = {
            "W": jax.random.normal(k_soft, (vocab_size, P)) / np.sqrt(P),
            "b": jnp.zeros((vocab_size,)),
        }
    return params


def params_on_first_device(config: ModelConfig, vocab_size: int | None) -> Params:
    """init_params' shapes and dtypes (ShapeDtypeStructs) on the first local device: what a
    checkpoint is restored into (Orbax 0.11 warns on every restore without a sharding)."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.eval_shape(lambda: init_params(jax.random.key(0), config, vocab_size))
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), abstract)


def bilm_top(
    params: Params,
    chars_UC: jax.Array,
    ids_2BT: jax.Array,
    mask_BT: jax.Array,
    state: LSTMState,
    config: ModelConfig,
) -> tuple[jax.Array, LSTMState]:
    """Training/evaluation view: the batch's distinct tokens (U, C) and, for the forward stream
    and the backward stream (already reversed within each sentence), the token at each position
    (2, B, T) -> top LSTM layer (2, B, T, P) and the new state. Each distinct token is encoded
    once."""
    tokens_UP = encode_tokens(params["token_encoder"], chars_UC, config)
    return lstm_top(params["lstm"], tokens_UP, ids_2BT, mask_BT, state, config)


def lstm_top(
    lstm_params: Params,
    tokens_UP: jax.Array,
    ids_2BT: jax.Array,
    mask_BT: jax.Array,
    state: LSTMState,
    config: ModelConfig,
    *,
    keep_masks: jax.Array | None = None,
    dropout: float = 0.0,
    mark: Callable[[jax.Array], jax.Array] | None = None,
) -> tuple[jax.Array, LSTMState]:
    """Encoded tokens (U, P) gathered at the positions (2, B, T) -> top LSTM layer (2, B, T, P)
    and the new state. With `keep_masks` (L + 1, 2, B, T, P), dropout as bilm-tf applies it:
    on each layer's input, and once more on the top output. `mark`: see `lstm_stacks`."""
    layers, state = lstm_stacks(
        lstm_params, tokens_UP[ids_2BT], mask_BT, state, config, keep_masks=keep_masks, dropout=dropout, mark=mark,
        top_only=True,
    )  # fmt: skip
    top = layers[-1]
    if keep_masks is not None:
        top = apply_dropout(keep_masks[config.lstm.n_layers], top, dropout)
    return top, state


def lstm_layers_of_streams(
    lstm_params: Params,
    tokens_UP: jax.Array,
    ids_2BT: jax.Array,
    mask_BT: jax.Array,
    state: LSTMState,
    config: ModelConfig,
    *,
    reset_BT: jax.Array | None = None,
    gates_2UG: jax.Array | None = None,
) -> tuple[jax.Array, LSTMState]:
    """Encoded tokens (U, P) at the positions of the forward stream and of the backward stream
    (each sentence reversed in place) (2, B, T), mask (B, T) -> every LSTM layer (L, 2, B, T, P),
    0 where masked, and the new state: `layers_of_tokens`'s LSTMs, in a form that runs a window
    of steps at a time, carrying the state, with several sentences in a row (the state
    restarts from zero where `reset_BT` is True: each sentence's first position but a row's).
    `gates_2UG`: `token_input_gates` of tokens_UP, gathered instead of computed at each position
    (the layers schedule only)."""
    x_2BTP = jnp.where(mask_BT[None, :, :, None], tokens_UP[ids_2BT], 0.0)
    gates_2BTG = None if gates_2UG is None else gates_2UG[jnp.arange(2)[:, None, None], ids_2BT]
    return lstm_stacks(lstm_params, x_2BTP, mask_BT, state, config, reset_BT=reset_BT, gates_2BTG=gates_2BTG)


def token_input_gates(lstm_params: Params, tokens_UP: jax.Array, config: ModelConfig) -> jax.Array:
    """Layer 0's input half of the gates for each distinct token (U, P), both directions ->
    (2, U, 4C): where layer 0 runs in a loop of its own, its inputs are context-free, so their
    gates can be computed once per token instead of once per position. Takes W_0 whole or split
    (`split_input_weights`)."""
    layer = lstm_params["layer_0"]
    x_2UP = jnp.broadcast_to(tokens_UP, (2, *tokens_UP.shape))
    return input_gates(layer["W_x"] if "W_x" in layer else layer["W_0"], layer["B"], x_2UP, config.compute_dtype)


def reverse_within(x_BT: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """Reverses the first lengths[b] steps of each row (axis 1), leaving the padding in place."""
    T = x_BT.shape[1]
    t = jnp.arange(T)[None, :]
    index = jnp.where(t < lengths_B[:, None], lengths_B[:, None] - 1 - t, t)
    index = index.reshape(index.shape + (1,) * (x_BT.ndim - 2))
    return jnp.take_along_axis(x_BT, index, axis=1)


def bilm_layers(
    params: Params, chars_BTC: jax.Array, state: LSTMState, config: ModelConfig
) -> tuple[jax.Array, jax.Array, LSTMState]:
    """Inference view: sentences (B, T, C) with `<S>`/`</S>` in place, left-aligned, padded
    slots all 0 -> every layer (L + 1, B, T, 2P), mask (B, T) and the new state.

    Layer 0 is [token | token]; layer l >= 1 is [forward_l | backward_l], where the backward
    LSTMs read each sentence from its `</S>` down to its `<S>`. Padded positions are 0.
    """
    B, T, C = chars_BTC.shape
    mask_BT = jnp.any(chars_BTC > 0, axis=-1)
    tokens_NP = encode_tokens(params["token_encoder"], chars_BTC.reshape(B * T, C), config)
    layers, state = layers_of_tokens(params["lstm"], tokens_NP.reshape(B, T, -1), mask_BT, state, config)
    return layers, mask_BT, state


def layers_of_tokens(
    lstm_params: Params,
    tokens_BTP: jax.Array,
    mask_BT: jax.Array,
    state: LSTMState,
    config: ModelConfig,
) -> tuple[jax.Array, LSTMState]:
    """The token vector at each position (B, T, P) of left-aligned sentences with `<S>`/`</S>`
    in place, and their mask (B, T) -> every layer (L + 1, B, T, 2P) as `bilm_layers` gives
    them, and the new state."""
    lengths = mask_BT.sum(axis=1)
    tokens_BTP = jnp.where(mask_BT[..., None], tokens_BTP, 0.0)
    x_2BTP = jnp.stack([tokens_BTP, reverse_within(tokens_BTP, lengths)])
    layers_L2BTP, state = lstm_stacks(lstm_params, x_2BTP, mask_BT, state, config)
    backward = jax.vmap(lambda x: reverse_within(x, lengths))(layers_L2BTP[:, 1])
    lstm_layers = jnp.concatenate([layers_L2BTP[:, 0], backward], axis=-1)
    token_layer = jnp.concatenate([tokens_BTP, tokens_BTP], axis=-1)[None]
    return jnp.concatenate([token_layer, lstm_layers]), state
