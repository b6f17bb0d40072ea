"""The LM losses: bilm-tf's sampled softmax for training and the full softmax for evaluation
(docs/MODEL.md section 5). One table W (V, P), b (V,) serves both directions.

The sampler reproduces TF's `log_uniform_candidate_sampler(unique=True)`: drawing with
replacement until S distinct ids are held gives the same distinct ids, in the same order, as
successive sampling without replacement, which `top_k(log P + Gumbel)` draws in one shot (on
accelerators without sorting the vocabulary: model/top_k.py); the
number of draws TF would have needed (`num_tries`) is S plus a geometric number of repeats
between consecutive new ids, drawn here exactly. The log-Q correction is then TF's
expected count -expm1(num_tries * log1p(-P(k))).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from elmo_jax.model import softmax_kernels
from elmo_jax.model.backend import backend
from elmo_jax.model.kernel_calls import auto_choice
from elmo_jax.model.matmul import matmul
from elmo_jax.model.top_k import top_k_indices


def kernel(config) -> str:
    """ "xla" or "pallas": the training step's sampled softmax, config.softmax_kernel with "auto"
    resolved for the backend the model is traced for (ours on TPUs and on GPUs where both
    kernels compile for its P-wide rows, else XLA's)."""
    if config.softmax_kernel != "auto":
        return config.softmax_kernel
    return auto_choice(
        "softmax_kernel",
        "sampled softmax",
        lambda: softmax_kernels.unfit(config.lstm.projection_dim, config.compute_dtype),
    )


def log_uniform_log_probs(vocab_size: int) -> jax.Array:
    """log P(k) = log((log(k + 2) - log(k + 1)) / log(V + 1)), k = 0..V-1."""
    k = jnp.arange(vocab_size, dtype=jnp.float32)
    return jnp.log(jnp.log1p(1.0 / (k + 1.0))) - jnp.log(jnp.log(vocab_size + 1.0))


class Candidates(NamedTuple):
    """S distinct sampled ids (S,) and the number of with-replacement draws TF would take."""

    ids: jax.Array
    num_tries: jax.Array

    def log_expected_count(self, ids: jax.Array, log_p: jax.Array) -> jax.Array:
        """log of TF's expected count of each id in `ids` (any shape)."""
        p = jnp.exp(log_p[ids])
        return jnp.log(-jnp.expm1(self.num_tries * jnp.log1p(-p)))


def sample_candidates(rng: jax.Array, log_p: jax.Array, num_sampled: int) -> Candidates:
    """Draws `num_sampled` distinct ids from the log-uniform law as TF's unique sampler does."""
    k_gumbel, k_tries = jax.random.split(rng)
    ids = top_k_indices(log_p + jax.random.gumbel(k_gumbel, log_p.shape), num_sampled)
    # After j distinct ids of total mass m_j, repeats before the next new id ~ Geometric(1 - m_j).
    mass = jnp.cumsum(jnp.exp(log_p[ids]))[:-1]
    u = jax.random.uniform(k_tries, mass.shape, minval=jnp.finfo(jnp.float32).tiny, maxval=1.0)
    repeats = jnp.floor(jnp.log(u) / jnp.log(jnp.clip(mass, 1e-30, 1.0 - 1e-7)))
    return Candidates(ids, num_sampled + jnp.sum(repeats))


def sampled_softmax_ce(
    h_NP: jax.Array,
    targets_N: jax.Array,
    W_VP: jax.Array,
    b_V: jax.Array,
    candidate_ids_S: jax.Array,
    log_q_candidates_S: jax.Array,
    log_q_targets_N: jax.Array,
    dtype: str = "float32",
    kernel: str = "xla",
) -> jax.Array:
    """Per-position cross entropy (N,) of the true class against the sampled ones; the
    candidates' logits are a matmul in `dtype`, the log-sum-exp is float32.

    Logits are corrected by -log Q; a candidate equal to the position's target (an accidental
    hit) is removed. The ids index rows of W and b (a whole table or the rows a step uses).
    `kernel`: "xla" (the logits (N, S) in device memory) or "pallas" (ours: only their
    log-sum-exp, `softmax_kernels`), the same numbers.
    """
    rows = (W_VP[targets_N], b_V[targets_N], W_VP[candidate_ids_S], b_V[candidate_ids_S])
    return gathered_softmax_ce(
        h_NP, targets_N, candidate_ids_S, *rows, log_q_candidates_S, log_q_targets_N, dtype, kernel
    )


def gathered_softmax_ce(
    h_NP: jax.Array,
    targets_N: jax.Array,
    candidate_ids_S: jax.Array,
    W_NP: jax.Array,
    b_N: jax.Array,
    W_SP: jax.Array,
    b_S: jax.Array,
    log_q_candidates_S: jax.Array,
    log_q_targets_N: jax.Array,
    dtype: str = "float32",
    kernel: str = "xla",
) -> jax.Array:
    """`sampled_softmax_ce` of the rows already gathered: the targets' W (N, P) and b (N,), the
    candidates' W (S, P) and b (S,) (the ids still mark the accidental hits)."""
    true_logit = jnp.sum(h_NP * W_NP, axis=-1) + b_N - log_q_targets_N
    bias_S = b_S - log_q_candidates_S
    if kernel == "pallas":
        block = softmax_kernels.chosen_block(h_NP.shape[-1], dtype)
        lse = softmax_kernels.sampled_logsumexp(h_NP, W_SP, bias_S, candidate_ids_S, targets_N, dtype, block)
        return jnp.logaddexp(true_logit, lse) - true_logit
    sampled = matmul(h_NP, W_SP.T, dtype) + bias_S
    sampled = jnp.where(candidate_ids_S[None, :] == targets_N[:, None], -jnp.inf, sampled)
    # One pass over the logits on accelerators; XLA on CPU runs a reduction with its own
    # combiner element by element, several times slower than its two vectorised passes.
    lse = jax.nn.logsumexp(sampled, axis=-1) if backend() == "cpu" else logsumexp(sampled)
    return jnp.logaddexp(true_logit, lse) - true_logit


@jax.custom_vjp
def logsumexp(x_NS: jax.Array) -> jax.Array:
    """log(sum(exp(x))) over the last axis (N, S) -> (N,): a row's max and its sum of
    exponentials, rescaled as the max grows, in one pass over x (jax.nn.logsumexp reads x twice:
    its max, then the sum). A row of -inf gives -inf and a zero gradient. Differentiated by
    hand: JAX does not differentiate a reduction with its own combiner."""

    def combine(a, b):  # one exponential: the smaller max's sum rescaled to the larger's
        (a_max, a_sum), (b_max, b_sum) = a, b
        a_top = a_max >= b_max
        top, low = jnp.where(a_top, a_max, b_max), jnp.where(a_top, b_max, a_max)
        factor = jnp.exp(jnp.where(low == top, 0.0, low - top))  # (-inf - -inf is not 0)
        return top, jnp.where(a_top, a_sum + b_sum * factor, b_sum + a_sum * factor)

    init = (jnp.array(-jnp.inf, x_NS.dtype), jnp.array(0.0, x_NS.dtype))
    top_N, sum_N = jax.lax.reduce((x_NS, jnp.ones_like(x_NS)), init, combine, (x_NS.ndim - 1,))
    return top_N + jnp.log(sum_N)


def _logsumexp_forward(x_NS):
    lse_N = logsumexp(x_NS)
    return lse_N, (x_NS, lse_N)


def _logsumexp_backward(residuals, g_N):
    x_NS, lse_N = residuals
    # -inf entries get 0 (a row of them too: -inf - -inf is not -inf)
    return (g_N[..., None] * jnp.exp(jnp.where(x_NS == -jnp.inf, -jnp.inf, x_NS - lse_N[..., None])),)


logsumexp.defvjp(_logsumexp_forward, _logsumexp_backward)


def full_softmax_ce(
    h_NP: jax.Array,
    targets_N: jax.Array,
    W_VP: jax.Array,
    b_V: jax.Array,
    vocab_size: int | None = None,
    dtype: str = "float32",
    chunk_rows: int = 32768,
) -> jax.Array:
    """Per-position cross entropy (N,) over the first `vocab_size` rows of the table (default
    all; the rest pad a table sharded by rows). The log-sum-exp runs over chunks of
    `chunk_rows` table rows, so memory is N x chunk_rows, not N x V (LM1B: 793k words)."""
    V = W_VP.shape[0]
    n_valid = V if vocab_size is None else vocab_size
    chunk = min(chunk_rows, V)
    true_logit = jnp.sum(h_NP * W_VP[targets_N], axis=-1) + b_V[targets_N]

    def add_chunk(carry, i):
        running_max, running_sum = carry
        # The last chunk is shifted back to fit; rows an earlier chunk covered are masked.
        start = jnp.minimum(i * chunk, V - chunk)
        rows = start + jnp.arange(chunk)
        logits = matmul(h_NP, jax.lax.dynamic_slice_in_dim(W_VP, start, chunk).T, dtype)
        logits = logits + jax.lax.dynamic_slice_in_dim(b_V, start, chunk)
        logits = jnp.where((rows >= i * chunk) & (rows < n_valid), logits, -jnp.inf)
        new_max = jnp.maximum(running_max, logits.max(axis=-1))
        new_sum = running_sum * jnp.exp(running_max - new_max) + jnp.exp(logits - new_max[:, None]).sum(axis=-1)
        return (new_max, new_sum), None

    init = (jnp.full_like(true_logit, -jnp.inf), jnp.zeros_like(true_logit))  # as device-varying as the inputs
    (running_max, running_sum), _ = jax.lax.scan(add_chunk, init, jnp.arange(-(-V // chunk)))
    return running_max + jnp.log(running_sum) - true_logit
