"""The train state and the pure train/eval steps (ELMO_SPEC.md section 5).

train_step: (state, batch) -> (state, metrics). Loss = 0.5 * (forward + backward) sampled-softmax
cross entropy, each the mean over the batch's positions; one global-norm clip, then Adagrad.
Randomness (dropout, candidate sampling) comes from fold_in(rng, step).
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import optax

from elmo_jax.config import ModelConfig, TrainHParams
from elmo_jax.model.bilm import bilm_top, init_params
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.softmax import full_softmax_ce, log_uniform_log_probs, sample_candidates, sampled_softmax_ce

Batch = dict  # chars (U, C), ids (2, B, T), targets (2, B, T) int32; mask (B, T) bool (see StreamBatcher)


@flax.struct.dataclass
class TrainState:
    params: dict
    opt_state: optax.OptState
    lstm_state: LSTMState
    step: jax.Array
    rng: jax.Array  # raw key data (uint32), so checkpoints hold plain arrays


def make_optimizer(hp: TrainHParams) -> optax.GradientTransformation:
    """Global-norm clip, then Adagrad as TF1 applies it (no epsilon)."""
    return optax.chain(
        optax.clip_by_global_norm(hp.all_clip_norm_val),
        optax.adagrad(hp.learning_rate, initial_accumulator_value=hp.initial_accumulator_value, eps=0.0),
    )


def init_train_state(rng: jax.Array, config: ModelConfig, hp: TrainHParams, batch_size: int) -> TrainState:
    """Fresh params, optimizer state and zero LSTM state for `batch_size` rows."""
    k_init, k_train = jax.random.split(rng)
    params = init_params(k_init, config, hp.n_tokens_vocab)
    return TrainState(
        params=params,
        opt_state=make_optimizer(hp).init(params),
        lstm_state=LSTMState.zeros(config, batch_size),
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.key_data(k_train),
    )


def _loss(params, batch: Batch, lstm_state: LSTMState, rng, config: ModelConfig, hp: TrainHParams, unroll: int):
    k_dropout, k_sample = jax.random.split(rng)
    top_2BTP, new_state = bilm_top(
        params, batch["chars"], batch["ids"], batch["mask"], lstm_state, config, k_dropout, hp.dropout, unroll
    )
    W, b = params["softmax"]["W"], params["softmax"]["b"]
    log_p = log_uniform_log_probs(W.shape[0])
    mask_N = batch["mask"].reshape(-1)
    n_tokens = jnp.maximum(mask_N.sum(), 1)
    losses = []
    for direction in range(2):
        cand = sample_candidates(jax.random.fold_in(k_sample, direction), log_p, hp.n_negative_samples_batch)
        targets_N = batch["targets"][direction].reshape(-1)
        ce = sampled_softmax_ce(
            top_2BTP[direction].reshape(-1, top_2BTP.shape[-1]),
            targets_N,
            W,
            b,
            cand.ids,
            cand.log_expected_count(cand.ids, log_p),
            cand.log_expected_count(targets_N, log_p),
        )
        losses.append(jnp.sum(jnp.where(mask_N, ce, 0.0)) / n_tokens)
    return 0.5 * (losses[0] + losses[1]), (losses, jax.lax.stop_gradient(new_state))


def train_step(
    state: TrainState, batch: Batch, *, config: ModelConfig, hp: TrainHParams, unroll: int = 1
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One Adagrad step; metrics: loss, loss_forward, loss_backward, grad_norm, tokens."""
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    grad_fn = jax.value_and_grad(_loss, has_aux=True)
    (loss, (losses, lstm_state)), grads = grad_fn(state.params, batch, state.lstm_state, rng, config, hp, unroll)
    updates, opt_state = make_optimizer(hp).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss,
        "loss_forward": losses[0],
        "loss_backward": losses[1],
        "grad_norm": optax.tree.norm(grads),
        "tokens": batch["mask"].sum(),
    }
    new_state = state.replace(params=params, opt_state=opt_state, lstm_state=lstm_state, step=state.step + 1)
    return new_state, metrics


def make_train_step(config: ModelConfig, hp: TrainHParams, unroll: int = 1):
    """The jitted train step; the incoming state's buffers are donated."""
    return jax.jit(functools.partial(train_step, config=config, hp=hp, unroll=unroll), donate_argnums=0)


def eval_step(
    params: dict, batch: Batch, lstm_state: LSTMState, *, config: ModelConfig, unroll: int = 1
) -> tuple[jax.Array, jax.Array, LSTMState]:
    """Full-softmax evaluation, no dropout: summed cross entropy per direction (2,), the number
    of positions, and the carried state."""
    top_2BTP, lstm_state = bilm_top(params, batch["chars"], batch["ids"], batch["mask"], lstm_state, config, unroll=unroll)
    W, b = params["softmax"]["W"], params["softmax"]["b"]
    mask_N = batch["mask"].reshape(-1)
    sums = jnp.stack(
        [
            jnp.sum(jnp.where(mask_N, full_softmax_ce(top_2BTP[d].reshape(-1, top_2BTP.shape[-1]), batch["targets"][d].reshape(-1), W, b), 0.0))
            for d in range(2)
        ]
    )
    return sums, mask_N.sum(), lstm_state
