import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.model.lstm import _Clips, _forward, _recurrence, lstm_layer


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(W, b, W_p, x_BTI, mask_BT, h, c, cell_clip, proj_clip):
    """docs/MODEL.md section 1, one step at a time, float64."""
    outputs = np.zeros(x_BTI.shape[:2] + (W_p.shape[1],))
    for t in range(x_BTI.shape[1]):
        z = np.concatenate([x_BTI[:, t], h], axis=-1) @ W + b
        i, j, f, o = np.split(z, 4, axis=-1)
        c_new = np.clip(sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j), -cell_clip, cell_clip)
        h_new = np.clip((sigmoid(o) * np.tanh(c_new)) @ W_p, -proj_clip, proj_clip)
        m = mask_BT[:, t, None]
        h, c = np.where(m, h_new, h), np.where(m, c_new, c)
        outputs[:, t] = np.where(m, h_new, 0.0)
    return outputs, h, c


def test_lstm_layer_matches_numpy_with_both_clips_firing():
    """Two directions with their own weights, time-major, against the float64 reference."""
    rng = np.random.default_rng(1)
    D, B, T, I, C, P = 2, 3, 7, 5, 8, 4
    W = rng.normal(0, 1.5, (D, I + P, 4 * C))
    b = rng.normal(0, 1.0, (D, 4 * C))
    W_p = rng.normal(0, 1.5, (D, C, P))
    x = rng.normal(0, 2.0, (D, B, T, I))
    mask = np.ones((B, T), bool)
    mask[0, 2:4] = False
    mask[1, 5:] = False
    mask[2, 2:] = False
    h0, c0 = rng.normal(0, 1, (D, B, P)), rng.normal(0, 1, (D, B, C))
    cell_clip, proj_clip = 1.5, 0.7
    want = [numpy_lstm(W[d], b[d], W_p[d], x[d], mask, h0[d], c0[d], cell_clip, proj_clip) for d in range(D)]
    # Both clips must be active somewhere, or this test would not test them.
    for want_out, _, want_c in want:
        assert np.isclose(np.abs(want_out).max(), proj_clip) and np.isclose(np.abs(want_c).max(), cell_clip)
    params = {"W_0": W, "B": b, "W_P_0": W_p}
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    for unroll in (1, 4):
        out, h, c = jax.jit(lstm_layer, static_argnums=(5, 6, 7))(
            jax.tree.map(f32, params), f32(x), mask, f32(h0), f32(c0), cell_clip, proj_clip, unroll
        )
        for d, (want_out, want_h, want_c) in enumerate(want):
            np.testing.assert_allclose(out[d], want_out, atol=1e-5)
            np.testing.assert_allclose(h[d], want_h, atol=1e-5)
            np.testing.assert_allclose(c[d], want_c, atol=1e-5)
    assert (np.asarray(out)[:, ~mask] == 0).all()


def test_hand_written_gradient_equals_autodiff_of_the_scan():
    """A layer's custom VJP against JAX's own derivative of the same forward pass, with both
    clips firing, masked steps (a gap and ends) and gradients flowing into the outputs and the
    final state."""
    rng = np.random.default_rng(1)
    D, B, T, I, C, P = 2, 3, 6, 5, 8, 4
    f32 = lambda *shape: np.asarray(rng.normal(0, 1.5, shape), np.float32)  # noqa: E731
    args = f32(D, I + P, 4 * C), f32(D, 4 * C), f32(D, C, P), f32(D, B, T, I)
    h0, c0 = f32(D, B, P), f32(D, B, C)
    mask = np.ones((B, T), bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    mask[0, 2:4] = False
    weights = f32(D, B, T, P), f32(D, B, P), f32(D, B, C)
    clips = _Clips(cell=1.5, proj=0.7)

    def loss(layer):
        def f(W_0, b, W_p, x, h0, c0):
            out, h, c = layer(W_0, b, W_p, x, mask, h0, c0)
            return sum(jnp.sum(w * y) for w, y in zip(weights, (out, h, c)))

        return jax.jit(jax.grad(f, argnums=tuple(range(6))))

    def autodiff(*args):
        return _forward(*args, clips, 1, "float32", residuals=False)[0]

    out, _, c = autodiff(*args, mask, h0, c0)
    assert np.isclose(np.abs(out).max(), clips.proj) and np.isclose(np.abs(c).max(), clips.cell)
    want = loss(autodiff)(*args, h0, c0)
    got = loss(lambda *args: _recurrence(*args, clips, 1, "float32"))(*args, h0, c0)
    for name, g, w in zip(["W_0", "B", "W_P_0", "x", "h0", "c0"], got, want):
        assert np.abs(w).max() > 0.1, name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)
