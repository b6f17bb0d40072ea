import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.model import kernel_calls, softmax_kernels
from elmo_jax.model.softmax import (
    full_softmax_ce,
    log_uniform_log_probs,
    logsumexp,
    sample_candidates,
    sampled_softmax_ce,
)


def test_log_uniform_law():
    V = 1000
    p = np.exp(np.asarray(log_uniform_log_probs(V), np.float64))
    k = np.arange(V)
    np.testing.assert_allclose(p, (np.log(k + 2) - np.log(k + 1)) / np.log(V + 1), rtol=1e-5)
    assert abs(p.sum() - 1) < 1e-5


def test_every_class_sampled_equals_full_softmax():
    rng = np.random.default_rng(0)
    N, V, P = 12, 30, 6
    h = jnp.asarray(rng.normal(size=(N, P)), jnp.float32)
    W = jnp.asarray(rng.normal(size=(V, P)), jnp.float32)
    b = jnp.asarray(rng.normal(size=V), jnp.float32)
    targets = jnp.asarray(rng.integers(V, size=N))
    candidates = jnp.asarray(rng.permutation(V))  # every class, in any order; expected count 1
    sampled = sampled_softmax_ce(h, targets, W, b, candidates, jnp.zeros(V), jnp.zeros(N))
    np.testing.assert_allclose(sampled, full_softmax_ce(h, targets, W, b), rtol=1e-5)
    # Rows padding a table (for sharding it) are not classes.
    padded = full_softmax_ce(h, targets, jnp.pad(W, ((0, 2), (0, 0))), jnp.pad(b, (0, 2)), vocab_size=V)
    np.testing.assert_allclose(padded, sampled, rtol=1e-5)
    # In chunks of table rows (7 does not divide 32: the last chunk overlaps the one before).
    chunked = full_softmax_ce(h, targets, jnp.pad(W, ((0, 2), (0, 0))), jnp.pad(b, (0, 2)), vocab_size=V, chunk_rows=7)
    np.testing.assert_allclose(chunked, sampled, rtol=1e-5)
    want = jax.nn.logsumexp(h @ W.T + b, axis=-1) - (h @ W.T + b)[jnp.arange(N), targets]
    np.testing.assert_allclose(full_softmax_ce(h, targets, W, b), want, rtol=1e-5)


def test_one_pass_logsumexp_equals_two_passes_with_its_gradient():
    # Rows of a wide range, -inf entries (removed accidental hits) and a row whose max repeats.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 300)) * np.array([[0.1], [1.0], [10.0], [30.0], [80.0], [1.0]])
    x[1, ::3] = -np.inf
    x[5, :] = 2.0
    x[5, :7] = -np.inf
    x = jnp.asarray(x, jnp.float32)
    g = jnp.asarray(rng.normal(size=6), jnp.float32)
    got, got_vjp = jax.vjp(logsumexp, x)
    want, want_vjp = jax.vjp(lambda x: jax.nn.logsumexp(x, axis=-1), x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(logsumexp)(x), want, rtol=1e-6)
    np.testing.assert_allclose(got_vjp(g)[0], want_vjp(g)[0], rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(got_vjp(g)[0])[1, ::3] == 0)
    # A row without a finite entry (one candidate, the target's): -inf, and no NaN in its gradient.
    lse, vjp = jax.vjp(logsumexp, jnp.full((1, 4), -jnp.inf))
    assert lse[0] == -np.inf and np.all(np.asarray(vjp(jnp.ones(1))[0]) == 0)


def test_accidental_hits_are_removed_and_log_q_corrects():
    h = jnp.array([[1.0, 0.0]])
    W = jnp.array([[2.0, 0.0], [0.5, 0.0], [-1.0, 0.0]])
    b = jnp.zeros(3)
    log_q = jnp.log(jnp.array([0.5, 0.25, 0.8]))
    candidates = jnp.array([0, 1, 2])
    ce = sampled_softmax_ce(h, jnp.array([0]), W, b, candidates, log_q, log_q[:1])
    # Candidate 0 is the target: it appears once, as the true class, never as a negative.
    true = 2.0 - np.log(0.5)
    negatives = np.array([0.5 - np.log(0.25), -1.0 - np.log(0.8)])
    want = np.log(np.exp(true) + np.exp(negatives).sum()) - true
    np.testing.assert_allclose(ce, [want], rtol=1e-6)


def test_sampler_draws_distinct_ids_following_the_log_uniform_law():
    V, S, draws = 50, 10, 4000
    log_p = log_uniform_log_probs(V)
    sample = jax.jit(jax.vmap(lambda k: sample_candidates(k, log_p, S)))
    cand = sample(jax.random.split(jax.random.key(0), draws))
    ids = np.asarray(cand.ids)
    assert all(len(set(row)) == S for row in ids)
    p = np.exp(np.asarray(log_p, np.float64))
    # The first id of each draw is one plain draw from P.
    first = np.bincount(ids[:, 0], minlength=V) / draws
    assert np.abs(first - p).max() < 4 * np.sqrt(p.max() / draws)
    # Inclusion frequencies match TF's expected count 1 - (1 - P)^num_tries on average.
    tries = np.asarray(cand.num_tries, np.float64)
    assert (tries >= S).all() and tries.mean() > S
    expected = (1 - (1 - p[None, :]) ** tries[:, None]).mean(0)
    included = np.zeros(V)
    np.add.at(included, ids.ravel(), 1)
    np.testing.assert_allclose(included / draws, expected, atol=0.03)
    # num_tries follows the coupon-collector law: its mean matches a direct simulation.
    direct = []
    gen = np.random.default_rng(1)
    for _ in range(2000):
        seen, n = set(), 0
        while len(seen) < S:
            seen.add(gen.choice(V, p=p / p.sum()))
            n += 1
        direct.append(n)
    assert abs(tries.mean() - np.mean(direct)) < 0.05 * np.mean(direct)


def test_top_k_without_a_full_sort_equals_lax_top_k():
    """The accelerators' selection (model/top_k.py, traced for a GPU here) returns lax.top_k's
    indices: largest first, equal values by lower index, negatives and ties included."""
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.top_k import top_k_indices

    rng = np.random.default_rng(4)
    log_p = log_uniform_log_probs(20_000)
    vectors = {
        "sampler": log_p + jax.random.gumbel(jax.random.key(1), log_p.shape),
        "ties": jnp.asarray(rng.integers(-40, 40, size=5000), jnp.float32) / 4,
        "negative": -jnp.abs(jnp.asarray(rng.normal(size=3000), jnp.float32)),
    }
    for name, x in vectors.items():
        for k in (1, 257, x.shape[0]):
            with tracing_for("gpu"):  # a new function: traced here, not taken from a CPU trace
                selected = jax.jit(lambda v: top_k_indices(v, k))(x)  # noqa: B023
                assert "top_k" not in str(jax.make_jaxpr(lambda v: top_k_indices(v, k))(x))  # noqa: B023
            np.testing.assert_array_equal(selected, jax.lax.top_k(x, k)[1], err_msg=f"{name}, k={k}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tiled", [False, True], ids=["triton", "mosaic"])
@pytest.mark.parametrize("block", [(64, 128), (16, 16)])
def test_pallas_sampled_softmax_equals_xla_with_its_gradients(dtype, tiled, block, monkeypatch):
    """Our kernels (interpreted here; GPU and TPU variants) give XLA's path's loss and gradients
    (h, the table's rows through the candidates' gather, its biases), in float32 and bfloat16,
    with accidental hits, a row whose every candidate is its target, and sizes that fill neither
    a block of rows nor a tile of candidates (at (16, 16): several of each)."""
    monkeypatch.setattr(softmax_kernels, "BLOCKS", (block,))
    monkeypatch.setattr(softmax_kernels, "TILED_BLOCK", block)
    monkeypatch.setattr(kernel_calls, "tiled", lambda: tiled)
    rng = np.random.default_rng(5)
    N, S, P, V = 37, 50, 24, 80
    h = jnp.asarray(rng.normal(size=(N, P)), jnp.float32)
    W = jnp.asarray(rng.normal(size=(V, P)) * 0.3, jnp.float32)
    b = jnp.asarray(rng.normal(size=V), jnp.float32)
    candidates = np.asarray(rng.permutation(V)[:S])
    candidates[-4:] = candidates[0]  # repeated: row 0's target is 5 of its candidates
    candidates = jnp.asarray(candidates)
    targets = jnp.asarray(rng.integers(V, size=N)).at[:6].set(candidates[:6])  # accidental hits
    log_q_candidates = jnp.asarray(rng.normal(size=S), jnp.float32)
    log_q_targets = jnp.asarray(rng.normal(size=N), jnp.float32)
    weights = jnp.asarray(rng.normal(size=N), jnp.float32)

    def loss(h, W, b, kernel):
        ce = sampled_softmax_ce(h, targets, W, b, candidates, log_q_candidates, log_q_targets, dtype, kernel)
        return jnp.sum(ce * weights)

    want, want_grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(h, W, b, "xla")
    got, got_grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(h, W, b, "pallas")
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for name, g, w in zip(("h", "W", "b"), got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * float(jnp.abs(w).max()), err_msg=name)
    # Every candidate the target: the row's log-sum-exp is -inf, its loss 0, its gradients 0.
    one = jnp.full((3,), candidates[0])
    lse, vjp = jax.vjp(
        lambda h: sampled_softmax_ce(h, targets, W, b, one, jnp.zeros(3), log_q_targets, dtype, "pallas"), h
    )
    assert lse[0] == 0 and np.all(np.isfinite(np.asarray(vjp(jnp.ones(N))[0])))
    assert np.all(np.asarray(vjp(jnp.ones(N))[0])[0] == 0)


def test_the_softmax_kernels_lower_for_a_tpu_and_declare_their_bytes():
    """Traced for a TPU, `softmax_kernel='pallas'` lowers to Mosaic kernels (the tiled variants),
    each declaring its bytes and FLOPs to `elmo-jax plan`."""
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.kernel_calls import BYTES_KEY, FLOPS_KEY

    N, S, P = 40, 300, 128
    h, W, b = jnp.zeros((N, P)), jnp.zeros((S, P)), jnp.zeros(S)
    ids, targets = jnp.arange(S), jnp.zeros(N, jnp.int32)

    def loss(h, W, b):
        return sampled_softmax_ce(h, targets, W, b, ids, jnp.zeros(S), jnp.zeros(N), "bfloat16", "pallas").sum()

    with tracing_for("tpu"):
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(h, W, b).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 2 and text.count(BYTES_KEY) == 2 and text.count(FLOPS_KEY) == 2


def test_auto_takes_our_kernels_on_accelerators_and_xla_on_cpus():
    """softmax_kernel='auto': XLA's path on a CPU, ours traced for a TPU or a GPU (where they
    compile: here no GPU is there to refuse them); a named choice is kept."""
    from types import SimpleNamespace

    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.softmax import kernel

    config = SimpleNamespace(softmax_kernel="auto", compute_dtype="bfloat16", lstm=SimpleNamespace(projection_dim=16))
    assert kernel(config) == "xla"
    for platform in ("tpu", "gpu"):
        with tracing_for(platform):
            assert kernel(config) == "pallas"
            assert kernel(SimpleNamespace(softmax_kernel="xla")) == "xla"
