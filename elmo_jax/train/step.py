"""The train state and the pure train/eval steps (docs/MODEL.md section 5).

train_step: (state, batch) -> (state, metrics). Loss = 0.5 * (forward + backward) cross
entropy (sampled softmax, or the full softmax with `sample_softmax` off), each the mean over the
batch's positions. As in bilm-tf's `train()`, the gradient is that of `unroll_steps * loss`; it is
clipped to a global norm and applied with Adagrad (both see the x unroll_steps) at the rate for
the global batch (`TrainSettings.batch_learning_rate`), times `warmup`'s factor. The logged loss
and gradient norm are those of the mean loss and of the scaled gradient (before clipping).
Randomness (dropout, candidate sampling) comes from fold_in(rng, step).

With the sampled softmax a step touches only K = 2S + 2BT rows of the softmax table (each
direction's S candidates and the targets): it gathers them, differentiates the loss with respect
to those rows alone and applies Adagrad to them alone. Rows a step does not touch have a zero
gradient, which leaves their Adagrad accumulator and value unchanged, so this is exactly the
dense update, and neither the gradient exchange between devices nor the update grows with the
vocabulary. The full softmax differentiates and updates the whole table.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from elmo_jax.config import ModelConfig
from elmo_jax.model.bilm import bilm_top, init_params, lstm_top
from elmo_jax.model.dropout import dropout_keep_masks
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.softmax import full_softmax_ce, gathered_softmax_ce, log_uniform_log_probs, sample_candidates
from elmo_jax.model.softmax import kernel as softmax_kernel
from elmo_jax.model.token_encoder import conv, encode_tokens, resolved
from elmo_jax.settings import TrainSettings
from elmo_jax.text.batcher import Batch
from elmo_jax.train.parallel import AXIS, DataParallel, data_parallel


@flax.struct.dataclass
class TrainState:
    params: dict
    opt_state: dict  # dense: optax Adagrad state of all params but the softmax; softmax: {W, b} accumulators
    lstm_state: LSTMState
    step: jax.Array
    rng: jax.Array  # raw key data (uint32), so checkpoints hold plain arrays


def dense_optimizer(hp: TrainSettings) -> optax.GradientTransformation:
    """Adagrad as TF1 applies it (no epsilon), for every param but the softmax table, at the
    global batch's rate (`warmup` scales its updates during the warm-up)."""
    return optax.adagrad(hp.batch_learning_rate(), initial_accumulator_value=hp.initial_accumulator_value, eps=0.0)


def warmup(hp: TrainSettings, step: jax.Array) -> jax.Array | None:
    """The factor on the learning rate at `step` (0-based): (step + 1) / warmup_steps during the
    warm-up, then 1; None without a warm-up (the recipe's update, untouched)."""
    if hp.warmup_steps == 0:
        return None
    return jnp.minimum(1.0, (step + 1).astype(jnp.float32) / hp.warmup_steps)


def _without_softmax(params: dict) -> dict:
    return {k: v for k, v in params.items() if k != "softmax"}


def init_train_state(
    rng: jax.Array, config: ModelConfig, hp: TrainSettings, batch_size: int, table_rows: int | None = None
) -> TrainState:
    """Fresh params, optimizer state and zero LSTM state for `batch_size` rows (global). The
    softmax table gets `table_rows` >= V rows (zero padding, for sharding by rows)."""
    k_init, k_train = jax.random.split(rng)
    params = init_params(k_init, config, hp.n_tokens_vocab)
    pad = (table_rows or hp.n_tokens_vocab) - hp.n_tokens_vocab
    params["softmax"] = {
        "W": jnp.pad(params["softmax"]["W"], ((0, pad), (0, 0))),
        "b": jnp.pad(params["softmax"]["b"], (0, pad)),
    }
    accumulators = jax.tree.map(lambda x: jnp.full_like(x, hp.initial_accumulator_value), params["softmax"])
    return TrainState(
        params=params,
        opt_state={"dense": dense_optimizer(hp).init(_without_softmax(params)), "softmax": accumulators},
        lstm_state=LSTMState.zeros(config, batch_size),
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.key_data(k_train),
    )


def abstract_train_state(
    config: ModelConfig,
    hp: TrainSettings,
    batch_size: int,
    table_rows: int,
    parallel: DataParallel,
    shard_softmax: bool,
) -> TrainState:
    """Shapes, dtypes and shardings (DataParallel.state_shardings) of `init_train_state`'s
    state, to restore a checkpoint into and to lay the step out."""
    abstract = jax.eval_shape(lambda: init_train_state(jax.random.key(0), config, hp, batch_size, table_rows))
    shardings = parallel.state_shardings(abstract, shard_softmax)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


class SoftmaxRows(NamedTuple):
    """The rows of the softmax table one step uses and where its ids sit among them.

    rows (K,): distinct table rows, ascending, padded with the out-of-range row count;
    candidates (2, S) / targets (2, N): positions in `rows` of each direction's sampled ids and
    targets; log_q_*: log of the sampler's expected count of each (TF's correction)."""

    rows: jax.Array
    candidates: jax.Array
    log_q_candidates: jax.Array
    targets: jax.Array
    log_q_targets: jax.Array


def softmax_rows(rng: jax.Array, targets_2N: jax.Array, hp: TrainSettings, table_rows: int) -> SoftmaxRows:
    """Samples each direction's candidates and collects the rows the step touches."""
    log_p = log_uniform_log_probs(hp.n_tokens_vocab)

    def sample(d, targets_N):  # both directions batched: each pass over the vocabulary is one kernel for both
        c = sample_candidates(jax.random.fold_in(rng, d), log_p, hp.n_negative_samples_batch)
        return c.ids, c.log_expected_count(c.ids, log_p), c.log_expected_count(targets_N, log_p)

    ids_2S, log_q_candidates, log_q_targets = jax.vmap(sample)(jnp.arange(2), targets_2N)
    used = jnp.concatenate([ids_2S.reshape(-1), targets_2N.reshape(-1)])
    rows, where = jnp.unique(used, return_inverse=True, size=used.size, fill_value=table_rows)
    return SoftmaxRows(
        rows=rows,
        candidates=where[: ids_2S.size].reshape(ids_2S.shape),
        log_q_candidates=log_q_candidates,
        targets=where[ids_2S.size :].reshape(targets_2N.shape),
        log_q_targets=log_q_targets,
    )


def _used_rows(table: dict, used: dict) -> tuple[dict, dict]:
    """The rows of `table` ({W (K, P), b (K,)}) that each direction's candidates and targets
    use: ({W (2, S, P), b (2, S)}, {W (2, N, P), b (2, N)}). One gather for all, so that their
    gradient is one scatter into the table's (a gather each: a zeroed (K, P) buffer and a
    scatter for each half, both read again by the norm and by Adagrad's two updates)."""
    candidates, targets = used["candidates"], used["targets"].reshape(2, -1)
    rows = {k: v[jnp.concatenate([candidates.reshape(-1), targets.reshape(-1)])] for k, v in table.items()}
    n = candidates.size
    return (
        {k: v[:n].reshape(*candidates.shape, *v.shape[1:]) for k, v in rows.items()},
        {k: v[n:].reshape(*targets.shape, *v.shape[1:]) for k, v in rows.items()},
    )


def _cross_entropy(h_NP, rows, used: dict, d: int, *, config: ModelConfig, vocab_size: int | None):
    """Direction d's per-position cross entropy (N,): sampled against `used`'s candidates
    (`rows`: `_used_rows`' pair), or (vocab_size given) the full softmax over the first
    vocab_size rows of the table (`rows`: {W, b})."""
    targets_N = used["targets"][d].reshape(-1)
    if vocab_size is not None:
        return full_softmax_ce(h_NP, targets_N, rows["W"], rows["b"], vocab_size, config.compute_dtype)
    candidates, targets = rows
    return gathered_softmax_ce(
        h_NP,
        targets_N,
        used["candidates"][d],
        targets["W"][d],
        targets["b"][d],
        candidates["W"][d],
        candidates["b"][d],
        used["log_q_candidates"][d],
        used["log_q_targets"][d].reshape(-1),
        config.compute_dtype,
        softmax_kernel(config),
    )


def _varying(x: jax.Array) -> jax.Array:
    """x (replicated) marked device-varying under the step's shard_map: the transpose of the
    mark sums x's gradient over devices, as it is."""
    return jax.lax.pcast(x, axis_name=AXIS, to="varying")


def _local_losses(
    lstm_params, table, tokens_UP, ids_2bT, mask_bT, state, used, n_tokens, keep, *, config, dropout, vocab_size
):
    """One device's rows b of the batch -> (2,) summed cross entropy of all devices / n_tokens,
    and the rows' new state. Runs under shard_map: the recurrences and their weight gradients
    stay on the device (a scan over a sharded batch under jit alone all-reduces the recurrent
    weights' gradient at every time step), and the gradients are summed over devices once."""
    # Marked device-varying once (the LSTM weights as the loops read them, stacked): left
    # replicated, each use (inside the loop: at every time step) would be a cast whose transpose
    # sums that use's gradient over devices.
    table = jax.tree.map(_varying, table)
    # Each device encoded its share of the words (on one device, all of them): gathered here,
    # so that their gradient is summed and scattered back to the shares (a reduce-scatter,
    # half an all-reduce's bytes).
    if jax.lax.axis_size(AXIS) > 1:
        tokens_UP = jax.lax.all_gather(tokens_UP, AXIS, tiled=True)
    with jax.named_scope("lstm"):
        top_2bTP, new_state = lstm_top(
            lstm_params, tokens_UP, ids_2bT, mask_bT, state, config, keep_masks=keep, dropout=dropout, mark=_varying
        )
    mask_n = mask_bT.reshape(-1)
    sums = []
    with jax.named_scope("softmax"):
        rows = table if vocab_size is not None else _used_rows(table, used)
        for d in range(2):
            h_NP = top_2bTP[d].reshape(-1, top_2bTP.shape[-1])
            ce = _cross_entropy(h_NP, rows, used, d, config=config, vocab_size=vocab_size)
            sums.append(jnp.sum(jnp.where(mask_n, ce, 0.0)))
    return jax.lax.psum(jnp.stack(sums), AXIS) / n_tokens, new_state


def _encoded(params: dict, chars_UC: jax.Array, config: ModelConfig, mesh) -> jax.Array:
    """The distinct words' token vectors (U, P), each device encoding its share of the words:
    as jit lays them out over the mesh, or, with the char CNN as our kernels (`conv(config)`),
    under shard_map (jit would run a kernel on all the words on every device). There the params
    are marked device-varying first: their gradients are summed over devices as they are,
    float32 (one all-reduce a param: jit's XLA path combines them)."""
    if conv(config) != "pallas":
        return encode_tokens(params, chars_UC, config)

    def local(params, chars):
        params = jax.tree.map(_varying, params)
        return encode_tokens(params, chars, config, kernels=True)

    return jax.shard_map(
        local, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec(AXIS)), out_specs=PartitionSpec(AXIS)
    )(params, chars_UC)


def _loss(
    params,
    batch: Batch,
    lstm_state: LSTMState,
    rng,
    used: SoftmaxRows | None,
    config: ModelConfig,
    hp: TrainSettings,
    mesh,
):
    """The mean loss 0.5 * (forward + backward) and ((forward, backward), new state).

    With `used` (sampled softmax), params["softmax"] holds only the rows `used.rows` (K, P) and
    (K,); without it (full softmax) the whole table, whose first hp.n_tokens_vocab rows are the
    vocabulary. The token encoder runs over the mesh (distinct words split over devices, each
    device encoding its share: `_encoded`); the LSTMs and the loss run per device under shard_map."""
    with jax.named_scope("token_encoder"):
        tokens_UP = _encoded(params["token_encoder"], batch.chars, config, mesh)
    mask_BT = batch.mask
    n_tokens = jnp.maximum(mask_BT.sum(), 1)
    B, T = mask_BT.shape
    rows_2BT = PartitionSpec(None, AXIS)
    if used is None:
        local_used, used_specs, vocab_size = {"targets": batch.targets}, {"targets": rows_2BT}, hp.n_tokens_vocab
    else:
        local_used = {
            "candidates": used.candidates,
            "log_q_candidates": used.log_q_candidates,
            "targets": used.targets.reshape(2, B, T),
            "log_q_targets": used.log_q_targets.reshape(2, B, T),
        }
        used_specs = {
            "candidates": PartitionSpec(),
            "log_q_candidates": PartitionSpec(),
            "targets": rows_2BT,
            "log_q_targets": rows_2BT,
        }
        vocab_size = None
    state_spec = LSTMState(PartitionSpec(None, None, AXIS), PartitionSpec(None, None, AXIS))
    keep, keep_spec = None, None
    if hp.dropout > 0.0:
        # Drawn for the whole batch, so the masks do not depend on how it is split.
        shape = (2, B, T, config.lstm.projection_dim)
        with jax.named_scope("dropout"):
            keep, keep_spec = (
                dropout_keep_masks(rng, hp.dropout, config.lstm.n_layers + 1, shape),
                PartitionSpec(None, None, AXIS),
            )
    local = jax.shard_map(
        functools.partial(_local_losses, config=config, dropout=hp.dropout, vocab_size=vocab_size),
        mesh=mesh,
        in_specs=(
            PartitionSpec(),
            PartitionSpec(),
            PartitionSpec(AXIS),
            rows_2BT,
            PartitionSpec(AXIS),
            state_spec,
            used_specs,
            PartitionSpec(),
            keep_spec,
        ),
        out_specs=(PartitionSpec(), state_spec),
    )
    losses, new_state = local(
        params["lstm"], params["softmax"], tokens_UP, batch.ids, mask_BT, lstm_state, local_used, n_tokens, keep
    )
    return 0.5 * (losses[0] + losses[1]), (losses, jax.lax.stop_gradient(new_state))


def _scaled_loss(params, *args, hp: TrainSettings):
    """bilm-tf's objective, unroll_steps * the mean loss; aux: (mean loss, (losses, state))."""
    loss, aux = _loss(params, *args)
    return hp.unroll_steps * loss, (loss, aux)


def _adagrad(value, accumulator, grad, lr: float | jax.Array):
    """TF1's Adagrad rule (no epsilon, the updated accumulator) -> (value, accumulator)."""
    accumulator = accumulator + grad**2
    return value - lr * grad / jnp.sqrt(accumulator), accumulator


def _sparse_adagrad(table: dict, accumulators: dict, grads: dict, rows: jax.Array, lr: float | jax.Array):
    """`_adagrad` on rows `rows` (distinct) of each table (rows out of range, the padding, are
    skipped), both updates added in place: the table's rows are read where they are updated,
    not gathered for the step's use and kept until then."""
    new_table, new_acc = {}, {}
    for key in table:
        new_acc[key] = accumulators[key].at[rows].add(grads[key] ** 2, mode="drop")
        acc_rows = new_acc[key].at[rows].get(mode="fill", fill_value=1.0)
        new_table[key] = table[key].at[rows].add(-(lr * grads[key] / jnp.sqrt(acc_rows)), mode="drop")
    return new_table, new_acc


# Leaves smaller than this are squared and summed in one reduction for the global norm.
_SMALL_LEAF = 1 << 20


def _global_norm(grads: dict) -> jax.Array:
    """The gradients' global norm, a float32 scalar (optax.tree.norm's). The leaves under
    _SMALL_LEAF elements (biases, the char CNN's filters: dozens at the published sizes) are
    squared and summed in one reduction, where a reduction each is a kernel each on accelerators."""
    leaves = jax.tree.leaves(grads)
    sums = [jnp.sum(jnp.square(g)) for g in leaves if g.size >= _SMALL_LEAF]
    small = [g.ravel().astype(jnp.float32) for g in leaves if g.size < _SMALL_LEAF]
    if small:
        sums.append(jnp.sum(jnp.square(jnp.concatenate(small))))
    return jnp.sqrt(sum(sums))


def _clipped(g: jax.Array, norm: jax.Array, max_norm: float) -> jax.Array:
    """g scaled by max_norm / norm where the global norm reaches max_norm (optax.clip_by_global_norm)."""
    return jax.lax.select(norm < max_norm, g, (g / norm.astype(g.dtype)) * max_norm)


def _apply_gradients(state: TrainState, grads: dict, used: SoftmaxRows | None, hp: TrainSettings):
    """Clipped Adagrad: the dense params through optax, the softmax table (its rows `used`
    touched, or all of it) by TF1's rule -> new params, new optimizer state, the gradient's norm
    before clipping."""
    grad_norm = _global_norm(grads)
    grads = jax.tree.map(lambda g: _clipped(g, grad_norm, hp.all_clip_norm_val), grads)
    updates, dense_state = dense_optimizer(hp).update(_without_softmax(grads), state.opt_state["dense"])
    lr: float | jax.Array = hp.batch_learning_rate()
    factor = warmup(hp, state.step)
    if factor is not None:  # Adagrad's update is linear in its rate
        updates, lr = jax.tree.map(lambda u: u * factor, updates), lr * factor
    new_params = optax.apply_updates(_without_softmax(state.params), updates)
    table, accumulators = state.params["softmax"], state.opt_state["softmax"]
    if used is None:
        new_params["softmax"], softmax_state = {}, {}
        for k in table:
            new_params["softmax"][k], softmax_state[k] = _adagrad(table[k], accumulators[k], grads["softmax"][k], lr)
    else:
        new_params["softmax"], softmax_state = _sparse_adagrad(table, accumulators, grads["softmax"], used.rows, lr)
    return new_params, {"dense": dense_state, "softmax": softmax_state}, grad_norm


def train_step(
    state: TrainState, batch: Batch, *, config: ModelConfig, hp: TrainSettings, mesh
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One Adagrad step; metrics: loss, loss_forward, loss_backward (means over the
    positions), grad_norm (of the unroll_steps-scaled gradient, before clipping), tokens."""
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    k_dropout, k_sample = jax.random.split(rng)
    table = state.params["softmax"]
    if hp.sample_softmax:
        with jax.named_scope("sampler"):
            used = softmax_rows(k_sample, batch.targets.reshape(2, -1), hp, table["W"].shape[0])
        with jax.named_scope("softmax"):
            gathered = {k: v.at[used.rows].get(mode="fill", fill_value=0.0) for k, v in table.items()}
    else:
        used, gathered = None, table
    params = {**state.params, "softmax": gathered}
    grad_fn = jax.grad(functools.partial(_scaled_loss, hp=hp), has_aux=True)
    grads, (loss, (losses, lstm_state)) = grad_fn(params, batch, state.lstm_state, k_dropout, used, config, hp, mesh)
    with jax.named_scope("optimizer"):
        new_params, opt_state, grad_norm = _apply_gradients(state, grads, used, hp)
    metrics = {
        "loss": loss,
        "loss_forward": losses[0],
        "loss_backward": losses[1],
        "grad_norm": grad_norm,
        "tokens": batch.mask.sum(),
    }
    new_state = dataclasses.replace(
        state,
        params=new_params,
        opt_state=opt_state,
        lstm_state=lstm_state,
        step=state.step + 1,
    )
    return new_state, metrics


def make_train_step(config: ModelConfig, hp: TrainSettings, parallel: DataParallel | None = None, state_shardings=None):
    """The jitted train step over `parallel`'s mesh (default: one device, arrays left where
    they are); the incoming state's buffers are donated. With `state_shardings` (see
    DataParallel.state_shardings) the state and the batch are laid out on the mesh."""
    parallel = parallel or data_parallel(1)
    step = functools.partial(train_step, config=resolved(config), hp=hp, mesh=parallel.mesh)
    if state_shardings is None:
        return jax.jit(step, donate_argnums=0)
    return jax.jit(
        step,
        in_shardings=(state_shardings, parallel.batch_shardings()),
        out_shardings=(state_shardings, None),
        donate_argnums=0,
    )


def eval_step(
    params: dict, batch: Batch, lstm_state: LSTMState, *, config: ModelConfig, vocab_size: int
) -> tuple[jax.Array, jax.Array, LSTMState]:
    """Full-softmax evaluation over the first `vocab_size` table rows, no dropout: summed cross
    entropy per direction (2,), the number of positions, and the carried state."""
    top_2BTP, lstm_state = bilm_top(params, batch.chars, batch.ids, batch.mask, lstm_state, config)
    h_2NP = top_2BTP.reshape(2, -1, top_2BTP.shape[-1])
    targets_2N, mask_N = batch.targets.reshape(2, -1), batch.mask.reshape(-1)
    W, b = params["softmax"]["W"], params["softmax"]["b"]
    ce = [full_softmax_ce(h_2NP[d], targets_2N[d], W, b, vocab_size, config.compute_dtype) for d in range(2)]
    sums = jnp.stack([jnp.sum(jnp.where(mask_N, ce_d, 0.0)) for ce_d in ce])
    return sums, mask_N.sum(), lstm_state
