import jax
import numpy as np

from elmo_jax.model.lstm import lstm_layer


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(W, b, W_p, x_BTI, mask_BT, h, c, cell_clip, proj_clip):
    """ELMO_SPEC.md section 1, one step at a time, float64."""
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
    rng = np.random.default_rng(0)
    B, T, I, C, P = 3, 7, 5, 8, 4
    W = rng.normal(0, 1.5, (I + P, 4 * C))
    b = rng.normal(0, 1.0, 4 * C)
    W_p = rng.normal(0, 1.5, (C, P))
    x = rng.normal(0, 2.0, (B, T, I))
    mask = np.ones((B, T), bool)
    mask[1, 5:] = False
    mask[2, 2:] = False
    h0, c0 = rng.normal(0, 1, (B, P)), rng.normal(0, 1, (B, C))
    cell_clip, proj_clip = 1.5, 0.7
    want, want_h, want_c = numpy_lstm(W, b, W_p, x, mask, h0, c0, cell_clip, proj_clip)
    # Both clips must be active somewhere, or this test would not test them.
    assert np.isclose(np.abs(want).max(), proj_clip) and np.isclose(np.abs(want_c).max(), cell_clip)
    params = {"W_0": W, "B": b, "W_P_0": W_p}
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    for unroll in (1, 4):
        out, h, c = jax.jit(lstm_layer, static_argnums=(5, 6, 7))(
            jax.tree.map(f32, params), f32(x), mask, f32(h0), f32(c0), cell_clip, proj_clip, unroll
        )
        np.testing.assert_allclose(out, want, atol=1e-5)
        np.testing.assert_allclose(h, want_h, atol=1e-5)
        np.testing.assert_allclose(c, want_c, atol=1e-5)
    assert (np.asarray(out)[~mask] == 0).all()
