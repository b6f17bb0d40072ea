import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float32_tolerance import BFLOAT16_EPS, EPS, assert_within_rounding, value_and_rounding_spread

from elmo_jax.config import CharCNNConfig, LSTMConfig, ModelConfig
from elmo_jax.model.dropout import dropout_keep_masks
from elmo_jax.model.lstm import LSTMState, cell, lstm_stacks, split_input_weights
from elmo_jax.model.wavefront import input_gates

RATE = 0.3


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(W, b, W_p, x_BTI, mask_BT, h, c, cell_clip, proj_clip):
    """docs/MODEL.md section 1, one layer, one step at a time, float64."""
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


def numpy_stacks(params, x_DBTP, mask_BT, h0, c0, config, keep):
    """Layer after layer, each direction on its own, float64: dropout on each layer's input,
    the residual around layers >= 1."""
    params, x_DBTP, h0, c0 = jax.tree.map(lambda a: np.asarray(a, np.float64), (params, x_DBTP, h0, c0))
    cfg = config.lstm
    outputs, hs, cs = [], [], []
    layer_in = x_DBTP
    for layer in range(cfg.n_layers):
        p = params[f"layer_{layer}"]
        if keep is not None:
            layer_in = np.where(keep[layer], layer_in / (1.0 - RATE), 0.0)
        runs = [
            numpy_lstm(
                p["W_0"][d],
                p["B"][d],
                p["W_P_0"][d],
                layer_in[d],
                mask_BT,
                h0[d, layer],
                c0[d, layer],
                cfg.cell_clip,
                cfg.proj_clip,
            )
            for d in range(2)
        ]
        out = np.stack([r[0] for r in runs])
        if cfg.use_skip_connections and layer > 0:
            out = np.where(mask_BT[None, :, :, None], out + layer_in, 0.0)
        outputs.append(out)
        hs.append(np.stack([r[1] for r in runs]))
        cs.append(np.stack([r[2] for r in runs]))
        layer_in = out
    return np.stack(outputs), np.stack(hs, axis=1), np.stack(cs, axis=1)


def small_config(n_layers, skip, C=8, P=4):
    return ModelConfig(
        lstm=LSTMConfig(
            dim=C, projection_dim=P, n_layers=n_layers, cell_clip=1.5, proj_clip=0.7, use_skip_connections=skip
        ),
        char_cnn=CharCNNConfig(
            embedding_dim=4,
            filters=((1, 4),),
            n_highway=0,
            n_characters=262,
            max_characters_per_token=10,
            activation="relu",
        ),
    )


def random_case(n_layers, skip, seed=1, B=3, C=8, P=4):
    """Large weights (both clips fire), a mask with a gap and short rows, a non-zero state: B
    rows, C cells, a projection of P."""
    rng = np.random.default_rng(seed)
    config = small_config(n_layers, skip, C, P)
    T = 7
    f32 = lambda *shape: np.asarray(rng.normal(0, 1.5, shape), np.float32)  # noqa: E731
    params = {
        f"layer_{layer}": {"W_0": f32(2, 2 * P, 4 * C), "B": f32(2, 4 * C), "W_P_0": f32(2, C, P)}
        for layer in range(n_layers)
    }
    mask = np.ones((B, T), bool)
    mask[0, 2:4] = False
    mask[1, 5:] = False
    mask[2, 1:] = False
    state = LSTMState(f32(2, n_layers, B, P), f32(2, n_layers, B, C))
    keep = np.asarray(dropout_keep_masks(jax.random.key(seed), RATE, n_layers + 1, (2, B, T, P)))
    return config, params, f32(2, B, T, P), mask, state, keep


@pytest.mark.parametrize("schedule", ["wavefront", "layers"])
@pytest.mark.parametrize("n_layers, skip", [(1, False), (2, True), (3, True), (3, False)])
def test_stacks_match_numpy_layer_after_layer(n_layers, skip, schedule):
    """Both schedules (all layers in one loop, one loop per layer) equal the float64 reference
    run layer after layer, with both clips firing, masked steps, a carried state, dropout and
    the residual, up to what float32 rounding can move each output in this case."""
    config, params, x, mask, state, keep = random_case(n_layers, skip)
    config = dataclasses.replace(config, lstm_schedule=schedule)
    for keep_masks in (None, keep):

        def reference(params, x, h, c, keep_masks=keep_masks):
            return numpy_stacks(params, x, mask, h, c, config, keep_masks)

        want, spread = value_and_rounding_spread(reference, (params, x, state.h, state.c))
        assert np.isclose(np.abs(want[2]).max(), config.lstm.cell_clip)
        for unroll in (1, 4):
            run = jax.jit(lstm_stacks, static_argnames=("config", "dropout"))
            unrolled = dataclasses.replace(config, scan_unroll=unroll)
            out, new = run(params, x, mask, state, unrolled, keep_masks=keep_masks, dropout=RATE)
            for name, got, w, s in zip(["outputs", "h", "c"], (out, new.h, new.c), want, spread):
                assert_within_rounding(got, w, s, name)
    assert (np.asarray(out)[:, :, ~mask] == 0).all()


def test_precomputed_input_gates_need_layer_0_in_a_loop_of_its_own():
    """They replace the input matmul before layer 0's own loop; the wavefront has none to replace."""
    config, params, x, mask, state, _ = random_case(2, True)
    gates = input_gates(params["layer_0"]["W_0"], params["layer_0"]["B"], x)
    reset = np.zeros_like(mask)
    layers = dataclasses.replace(config, lstm_schedule="layers")
    want, _ = lstm_stacks(params, x, mask, state, layers, reset_BT=reset)
    got, _ = lstm_stacks(params, x, mask, state, layers, reset_BT=reset, gates_2BTG=gates)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    moved, _ = lstm_stacks(params, x, mask, state, layers, reset_BT=reset, gates_2BTG=gates + 1.0)
    assert np.abs(np.asarray(moved) - np.asarray(want)).max() > 0.1  # they are what layer 0 reads
    with pytest.raises(ValueError, match="layers schedule"):
        lstm_stacks(
            params,
            x,
            mask,
            state,
            dataclasses.replace(config, lstm_schedule="wavefront"),
            reset_BT=reset,
            gates_2BTG=gates,
        )


def test_split_weights_give_the_same_layers_in_loops_of_one_layer():
    """W_0's halves, split once for inference (the input half of each row-block, then h's)."""
    config, params, x, mask, state, _ = random_case(2, True)
    reset = np.zeros_like(mask)
    reset[1, 3] = True  # a second sentence in row 1
    layers = dataclasses.replace(config, lstm_schedule="layers")
    split = split_input_weights(params)
    assert "W_0" not in split["layer_1"] and split["layer_1"]["W_x"].shape == (
        2,
        config.lstm.projection_dim,
        4 * config.lstm.dim,
    )
    want, want_state = lstm_stacks(params, x, mask, state, layers, reset_BT=reset)
    got, got_state = lstm_stacks(split, x, mask, state, layers, reset_BT=reset)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_state.c, want_state.c)
    swapped = {k: {**v, "W_x": v["W_h"], "W_h": v["W_x"]} for k, v in split.items()}
    assert np.abs(np.asarray(lstm_stacks(swapped, x, mask, state, layers, reset_BT=reset)[0]) - want).max() > 0.1
    for schedule, reset_BT in (("wavefront", reset), ("layers", None)):
        with pytest.raises(ValueError, match="split weights need layers in loops of their own"):
            lstm_stacks(split, x, mask, state, dataclasses.replace(config, lstm_schedule=schedule), reset_BT=reset_BT)


def _custom_and_autodiff(n_layers: int, skip: bool):
    """The wavefront's gradient function (its hand-written VJP), autodiff's of the same forward
    loop (lstm_stacks with reset_BT, never True here, is differentiated by JAX), their args
    (params, x, state) and the output weights of the loss sum(weights * outputs)."""
    config, params, x, mask, state, keep = random_case(n_layers, skip, seed=2)
    config = dataclasses.replace(config, lstm_schedule="wavefront", lstm_cell="xla")
    rng = np.random.default_rng(3)
    out, new = lstm_stacks(params, x, mask, state, config, keep_masks=keep, dropout=RATE)
    weights = [rng.normal(size=a.shape).astype(np.float32) for a in (out, new.h, new.c)]

    def loss(reset_BT):
        def f(weights, params, x, state):
            out, new = lstm_stacks(params, x, mask, state, config, keep_masks=keep, dropout=RATE, reset_BT=reset_BT)
            return sum(jnp.sum(w * y) for w, y in zip(weights, (out, new.h, new.c)))

        return jax.jit(jax.grad(f, argnums=(1, 2, 3)))

    return loss(None), loss(np.zeros(mask.shape, bool)), (params, x, state), weights


@pytest.mark.parametrize("n_layers, skip", [(1, False), (3, True)])
def test_hand_written_gradient_equals_autodiff_of_the_loop(n_layers, skip):
    """The wavefront's custom VJP against JAX's own derivative of the same forward loop, with
    both clips firing, masked steps, dropout between layers, the residual, and gradients
    flowing into every layer's outputs and the final state."""
    custom, reference, args, weights = _custom_and_autodiff(n_layers, skip)
    # Both run the same forward pass: they differ by the rounding of the backward pass, which
    # moving the output gradients (the weights) by a float32 spacing measures.
    want, spread = value_and_rounding_spread(lambda weights: reference(weights, *args), (weights,))
    got = custom(weights, *args)
    named = jax.tree_util.tree_flatten_with_path(want)[0]
    for (path, w), g, s in zip(named, jax.tree.leaves(got), jax.tree.leaves(spread), strict=True):
        name = jax.tree_util.keystr(path)
        assert np.abs(w).max() > 0.1, name
        assert_within_rounding(g, w, s, name)


def test_bfloat16_gradient_is_float32s_within_bfloat16_rounding():
    """With bfloat16 matmuls the forward saves the gate activations in bfloat16 (the loop's
    cells read them back from there) and the backward keeps d_gates and d_h_raw in bfloat16 for
    the weight gradients' matmuls (the bias gradient one more row of W_0's). At weights of
    a trained model's scale (no gate saturated, clips rarely firing), every gradient stays within
    1% (root mean square, relative) of float32's, and within 2x the error of autodiff's bfloat16
    gradient (lstm_stacks with reset_BT), which keeps all of these in float32 (XLA on CPU rounds
    the bias's gradient matmul's result to bfloat16 there)."""
    rng = np.random.default_rng(0)
    L, B, T, C, P = 2, 32, 20, 256, 64
    normal = lambda scale, *shape: np.asarray(rng.normal(0, scale, shape), np.float32)  # noqa: E731
    W_0, b, W_p, x = (
        normal(0.08, L, 2, 2 * P, 4 * C),
        normal(0.1, L, 2, 4 * C),
        normal(0.08, L, 2, C, P),
        normal(1, 2, B, T, P),
    )
    params = {f"layer_{l}": {"W_0": W_0[l], "B": b[l], "W_P_0": W_p[l]} for l in range(L)}
    mask, state = (
        np.ones((B, T), bool),
        LSTMState(np.zeros((2, L, B, P), np.float32), np.zeros((2, L, B, C), np.float32)),
    )
    weights = [normal(1, L, 2, B, T, P), normal(1, 2, L, B, P), normal(1, 2, L, B, C)]
    lstm = LSTMConfig(dim=C, projection_dim=P, n_layers=L, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True)
    config = dataclasses.replace(small_config(L, True), lstm=lstm, lstm_schedule="wavefront", lstm_cell="xla")

    def gradient(dtype, reset_BT=None):
        def loss(params, x):
            out, new = lstm_stacks(
                params, x, mask, state, dataclasses.replace(config, compute_dtype=dtype), reset_BT=reset_BT
            )
            return sum(jnp.sum(w * y) for w, y in zip(weights, (out, new.h, new.c)))

        d_params, d_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
        stacked = [np.stack([d_params[f"layer_{l}"][name] for l in range(L)]) for name in ("W_0", "B", "W_P_0")]
        return [*stacked, d_x]

    def error(got, want):
        return np.sqrt(np.mean((np.asarray(got) - want) ** 2) / np.mean(np.asarray(want) ** 2))

    truth, autodiff = gradient("float32"), gradient("bfloat16", reset_BT=np.zeros((B, T), bool))
    for name, g, want, a in zip(["W_0", "B", "W_P_0", "x"], gradient("bfloat16"), truth, autodiff):
        assert g.dtype == np.float32, name
        assert error(g, want) < 0.01 and error(g, want) < 2 * error(a, want), (name, error(g, want), error(a, want))


def test_both_schedules_give_the_same_gradients():
    """The gradient of every layer's outputs and the final state with respect to the params,
    the inputs and the initial state: the wavefront against one loop per layer."""
    config, params, x, mask, state, keep = random_case(3, True, seed=4)
    rng = np.random.default_rng(5)
    weights = rng.normal(size=(3, 2) + x.shape[1:]), rng.normal(size=state.h.shape), rng.normal(size=state.c.shape)

    def grads(schedule):
        def loss(params, x, state):
            out, new = lstm_stacks(
                params,
                x,
                mask,
                state,
                dataclasses.replace(config, lstm_schedule=schedule),
                keep_masks=keep,
                dropout=RATE,
            )
            return sum(jnp.sum(w * y) for w, y in zip(weights, (out, new.h, new.c)))

        return jax.jit(lambda *args: jax.tree.leaves(jax.grad(loss, argnums=(0, 1, 2))(*args)))

    # The schedules' forward passes round differently: moving the params, inputs and state by a
    # float32 spacing measures how far that carries into the gradients.
    args, layers = (params, x, state), grads("layers")
    want, spread = value_and_rounding_spread(layers, args)
    for got, w, s in zip(grads("wavefront")(*args), want, spread):
        assert np.abs(w).max() > 0.1
        assert_within_rounding(got, w, s)


# The cell kernels' blocks in test_the_pallas_cell_computes_what_xlas_does: as small as they go
# (B = 3 rows, C = 8 cells, P = 4: blocks of one row, several blocks every way), and the smallest
# that Triton's products take on a GPU (16 each way: B = 16, C = 32, P = 64, several blocks of
# P's columns and chunks of its depth).
_KERNEL_BLOCKS = {
    "tiny": ((3, 8, 4), dict(_PART_COLUMNS=2, _PART_ALIGN=1, _FUSED_DEPTH_BYTES=8, _FUSED_BACK_Q_BYTES=8,
                             _BACK_DEPTH_BYTES=8, _PROJ_COLUMNS=2, _PROJ_DEPTH_BYTES=8)),
    "triton": ((16, 32, 64), dict(_PART_COLUMNS=16, _FUSED_DEPTH_BYTES=64, _FUSED_BACK_Q_BYTES=64,
                                  _BACK_DEPTH_BYTES=64, _PROJ_COLUMNS=16, _PROJ_DEPTH_BYTES=64)),
}  # fmt: skip


@pytest.mark.parametrize("blocks", sorted(_KERNEL_BLOCKS))
@pytest.mark.parametrize("ours", ["pallas", "fused"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n_layers, skip, dropout", [(3, True, True), (2, False, False)])
def test_the_pallas_cell_computes_what_xlas_does(ours, dtype, n_layers, skip, dropout, blocks, monkeypatch):
    """The wavefront's training step with its cell and outputs as our Pallas kernels, forward
    and backward (interpreted here, as everywhere but on GPUs): every layer's outputs, the final
    state and every gradient equal the XLA cell's, with masked steps, a carried state, with both
    clips firing, dropout and the residual, and with none of them, and blocks of one row (B = 3).
    The gates' transposed product, which contracts over the cell, runs as 4 partial products of
    2 of the C = 8 cell columns each (the kernels' blocks as wide), which the kernel after it
    adds (in bfloat16, whose products this CPU rounds, added and rounded once, as the XLA
    cell's). The projection runs in the outputs' kernel, each program's block of P = 4 columns 2
    wide and 8 bytes of the cell's columns at a time (2 or 4 partial products, rounded once in
    bfloat16 as the XLA cell's), from the slot the cell wrote: a program that read another slot
    or another block's columns of W_proj fails this. The same with the gates' matmul in the
    forward's kernel ("fused"), which multiplies its block of rows by W 8 bytes of a row at a
    time (of [inputs; h]'s Q = 8 here: 4 or 2 partial products added in float32, as a GPU's
    matmul adds its parts), and its transpose in the backward's, whose programs for each 8 bytes
    of Q's columns compute their block's gradients again, the first of them writing the cell
    gradient that the others read. The backward cell kernel ("pallas") multiplies its block's
    d_h_raw by W_proj's 8 bytes of P at a time (the gradient of o tanh(c), which the XLA cell
    gets from a matmul). Again at the smallest blocks that Triton's products take, which a GPU
    runs (benchmarks/gpu.sh runs this test there; it refuses the tiny blocks)."""
    from elmo_jax.model import cell_kernels

    if blocks == "tiny" and jax.default_backend() == "gpu":
        pytest.skip("Triton's products take blocks of 16 or more each way")
    (B, C, P), constants = _KERNEL_BLOCKS[blocks]
    for name, value in constants.items():
        monkeypatch.setattr(cell_kernels, name, value)
    config, params, x, mask, state, keep = random_case(n_layers, skip, seed=4, B=B, C=C, P=P)
    keep = keep if dropout else None
    config = dataclasses.replace(config, lstm_schedule="wavefront", compute_dtype=dtype)
    if not dropout:  # and without clips (options.json may have none)
        config = dataclasses.replace(config, lstm=dataclasses.replace(config.lstm, cell_clip=None, proj_clip=None))
    rng = np.random.default_rng(5)
    weights = (
        rng.normal(size=(n_layers, 2) + x.shape[1:]),
        rng.normal(size=state.h.shape),
        rng.normal(size=state.c.shape),
    )

    def loss(params, x, state, cell):
        out, new = lstm_stacks(
            params, x, mask, state, dataclasses.replace(config, lstm_cell=cell), keep_masks=keep, dropout=RATE
        )
        return sum(jnp.sum(w * y) for w, y in zip(weights, (out, new.h, new.c)))

    def value_and_grads(cell):
        return jax.jit(lambda *args: jax.tree.leaves(jax.value_and_grad(loss, argnums=(0, 1, 2))(*args, cell)))

    args = (params, x, state)
    program = str(jax.make_jaxpr(jax.grad(lambda *a: loss(*a, ours)))(*args))
    fused = ("gates_and_forward_cell", "backward_cell_and_gates_product")
    own = ("projection_and_output", "backward_output")
    kernels = (*(fused if ours == "fused" else ("forward_cell", "backward_cell")), *own)
    assert all(f"lstm_{kernel}" in program for kernel in kernels)
    # On a GPU the two add the same products in other orders (float32), which the bfloat16
    # roundings that follow can amplify: there, the spread of one bfloat16 rounding of the inputs.
    on_gpu_in_bfloat16 = dtype == "bfloat16" and jax.default_backend() != "cpu"
    eps = BFLOAT16_EPS if on_gpu_in_bfloat16 else EPS
    want, spread = value_and_rounding_spread(value_and_grads("xla"), args, eps=eps)
    for got, w, s in zip(value_and_grads(ours)(*args), want, spread, strict=True):
        assert_within_rounding(got, w, s)


def test_the_cell_kernels_split_a_contraction_over_the_cell_where_its_result_is_small():
    """As XLA splits such a matmul's contraction (until its result has ~128 blocks of 128 x 128):
    at the original size (4 layers x directions, C = 4096) and 128 rows the projection (P = 512)
    in 8 parts, the gates' transposed product ([inputs; h], 1024) in 4; at 512 rows in 2 and 1;
    the demo's (C = 128, 32 rows) in 4 and 4; parts of 32 columns at the least."""
    from elmo_jax.model.cell_kernels import parts

    assert [parts(4096, 4 * rows * n) for rows in (128, 512) for n in (512, 1024)] == [8, 4, 2, 1]
    assert [parts(128, 4 * 32 * n) for n in (64, 128)] == [4, 4]
    assert parts(4096, 1) == 128 and parts(384, 1) == 8 and parts(8, 1) == 1
    assert parts(80, 1) == 1 and parts(96, 1) == 2  # parts of whole 16s (80 not in two of 40)


def test_the_pallas_cell_is_refused_where_it_cannot_run():
    """Its kernels are Triton's (GPUs). Traced for a TPU it says so, rather than running Pallas's
    interpreter there; on a CPU the interpreter runs them (these tests), but not inside the
    data-parallel train step (JAX's interpreter fails on device-varying arrays): it says so.
    On a GPU they run there."""
    from elmo_jax.errors import UserError
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.cell_kernels import forward_cell

    L, D, B, S, C = 2, 2, 4, 3, 8
    slots = jnp.zeros((L, D, B, S, 4 * C)), jnp.zeros((L, D, B, S, C)), jnp.zeros((L, D, B, S, C))

    def cell(z):
        c0 = z[:, :, 0, :, 0]
        return forward_cell(
            0, z, b_LDG=jnp.zeros((L, D, 4 * C)), c0_LDBC=c0, mask_LBS=jnp.ones((L, B, S), jnp.int32),
            acts_LDBSG=slots[0], c_LDBSC=slots[1], a_LDBSC=slots[2], clip=3.0,
        )  # fmt: skip

    z = jnp.zeros((L, D, 1, B, 4, C))  # the cell's columns in 1 part
    cell(z)  # on this CPU, outside shard_map: runs
    with (
        tracing_for("tpu"),
        pytest.raises(UserError, match="lstm_cell='pallas' or 'fused' has kernels for GPUs .* none for TPUs"),
    ):
        cell(z)
    mesh = jax.make_mesh((1,), ("data",))
    data_parallel = jax.shard_map(cell, mesh=mesh, in_specs=jax.P("data"), out_specs=jax.P("data"))
    z = jax.device_put(z, jax.NamedSharding(mesh, jax.P("data")))
    if jax.default_backend() == "cpu":
        with pytest.raises(UserError, match="inside the data-parallel train step"):
            jax.jit(data_parallel)(z)
    else:  # a GPU (benchmarks/gpu.sh runs these tests there): Triton's kernels run in the step
        jax.jit(data_parallel)(z)


def test_the_kernels_with_products_are_refused_where_their_blocks_are_too_small_for_triton():
    """Traced for a GPU, the kernels with a matmul in them (the fused cell's, the projection's,
    which both of our cells run, and the pallas backward cell's) refuse blocks under 16 rows (B =
    4 rows here), which Triton's matmuls do not take, naming the cell that still runs. Sizes that
    `products_fit` passes trace: a cell of 80 columns (16 x 5) stays in one part of 80, not 40."""
    from elmo_jax.errors import UserError
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.cell_kernels import backward_cell, gates_and_forward_cell, products_fit, projection_and_output

    L, D, B, S, C, Q, P = 2, 2, 4, 3, 64, 32, 16
    mask = jnp.ones((L, B, S), jnp.int32)
    with tracing_for("gpu"), pytest.raises(UserError, match=r"\(4, 64, 32\).*use lstm_cell='xla'"):
        gates_and_forward_cell(
            0, jnp.zeros((L, D, B, Q)), jnp.zeros((L, D, 1, Q, 4, C)), b_LDG=jnp.zeros((L, D, 4 * C)),
            c0_LDBC=jnp.zeros((L, D, B, C)), mask_LBS=mask, acts_LDBSG=jnp.zeros((L, D, B, S, 4 * C)),
            c_LDBSC=jnp.zeros((L, D, B, S, C)), a_LDBSC=jnp.zeros((L, D, B, S, C)), clip=None,
        )  # fmt: skip
    slots = jnp.zeros((L, D, B, S, P))
    with tracing_for("gpu"), pytest.raises(UserError, match=r"\(4, 16, 64\).*use lstm_cell='xla'"):
        projection_and_output(
            0, jnp.zeros((L, D, B, S, C), jnp.bfloat16), jnp.zeros((L, D, C, P), jnp.bfloat16),
            jnp.zeros((L, D, B, P)), mask_LBS=mask, x_DBSP=slots[0], keep_UDBSP=None, h_LDBSP=slots,
            out_LDBSP=slots, clip=None, skip=True, rate=None,
        )  # fmt: skip
    with tracing_for("gpu"), pytest.raises(UserError, match=r"\(4, 64, 16\).*use lstm_cell='xla'"):
        backward_cell(
            0, jnp.zeros((L, D, B, P), jnp.bfloat16), jnp.zeros((L, D, C, P), jnp.bfloat16), jnp.zeros((L, D, B, C)),
            c0_LDBC=jnp.zeros((L, D, B, C)), mask_LBS=mask, acts_LDBSG=jnp.zeros((L, D, B, S, 4 * C), jnp.bfloat16),
            c_LDBSC=jnp.zeros((L, D, B, S, C)), d_gates_LDBSG=jnp.zeros((L, D, B, S, 4 * C), jnp.bfloat16), J=1,
            clip=None,
        )  # fmt: skip
    config, params, x, mask, state, _ = random_case(2, True, B=16, C=80, P=16)
    config = dataclasses.replace(config, lstm_schedule="wavefront", compute_dtype="bfloat16", lstm_cell="pallas")
    assert products_fit(16, 80, 16)
    with tracing_for("gpu"):
        jax.make_jaxpr(jax.grad(lambda p, x, s: lstm_stacks(p, x, mask, s, config)[0].sum()))(params, x, state)


def test_the_default_cell_is_ours_on_gpus_for_the_wavefront_of_layers(caplog):
    """lstm_cell='auto' (the default) is the Pallas cell where it was measured faster (a GPU, its
    default wavefront schedule, 2+ layers) and XLA's cell elsewhere, and where the rows a device
    runs, the cell or the projection are not multiples of 16 (Triton's products in its kernels
    need blocks of 16 each way: said once); a cell named is kept."""
    from elmo_jax.model import kernel_calls
    from elmo_jax.model.backend import tracing_for

    two, one = random_case(2, True)[0], random_case(1, True)[0]
    wide = dataclasses.replace(two, lstm=dataclasses.replace(two.lstm, dim=32, projection_dim=16))
    assert two.lstm_cell == "auto" and cell(two) == "xla"  # this CPU
    with tracing_for("gpu"):
        assert cell(two) == "pallas"  # "fused" only where named: it has not run on a GPU yet
        kernel_calls.say_once.cache_clear()
        assert (cell(wide, 32), cell(wide, 24), cell(two, 32)) == ("pallas", "xla", "xla")  # two: C = 8, P = 4
        assert "as ours need rows per device, cell and projection in multiples of 16 (here 24," in caplog.text
        assert cell(dataclasses.replace(two, lstm_cell="fused")) == "fused"
        assert cell(dataclasses.replace(two, lstm_schedule="layers")) == "xla"
        assert cell(one) == "xla"
        assert cell(dataclasses.replace(two, lstm_cell="xla")) == "xla"
    with tracing_for("tpu"):
        assert cell(two) == "xla"


def _bits(x):
    x = np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


@pytest.mark.parametrize(
    "schedule, ours, dtype",
    [("wavefront", ours, dtype) for ours in ("xla", "pallas", "fused") for dtype in ("float32", "bfloat16")]
    + [("layers", "xla", "float32")],
)
def test_the_top_layer_alone_is_the_full_paths_top_layer_bit_for_bit(schedule, ours, dtype, monkeypatch):
    """lstm_stacks(top_only=True), as training runs it (only the top layer feeds the loss): its
    top layer's outputs, the final state and every gradient equal, bit for bit, those of every
    layer's outputs of which the loss reads the top, with the XLA cell and our kernels
    (interpreted), both clips firing, masked steps, a carried state, dropout and the residual.
    Its backward takes the top layer's output gradient alone: the layers' below are 0 without
    being read (the XLA loop's a zeros value, the kernel's not loaded)."""
    from elmo_jax.model import cell_kernels

    (B, C, P), constants = _KERNEL_BLOCKS["tiny"]
    for name, value in constants.items():
        monkeypatch.setattr(cell_kernels, name, value)
    n_layers = 3
    config, params, x, mask, state, keep = random_case(n_layers, True, seed=4, B=B, C=C, P=P)
    config = dataclasses.replace(config, lstm_schedule=schedule, compute_dtype=dtype, lstm_cell=ours)
    rng = np.random.default_rng(5)
    weights = (rng.normal(size=x.shape), rng.normal(size=state.h.shape), rng.normal(size=state.c.shape))

    def loss(params, x, state, top_only):
        out, new = lstm_stacks(params, x, mask, state, config, keep_masks=keep, dropout=RATE, top_only=top_only)
        assert out.shape == ((1,) if top_only else (n_layers,)) + x.shape
        return sum(jnp.sum(w * y) for w, y in zip(weights, (out[-1], new.h, new.c)))

    def outputs_and_grads(top_only):
        def run(params, x, state):
            out, new = lstm_stacks(params, x, mask, state, config, keep_masks=keep, dropout=RATE, top_only=top_only)
            return out[-1], new, jax.grad(loss, argnums=(0, 1, 2))(params, x, state, top_only)

        return jax.tree.leaves(jax.jit(run)(params, x, state))

    program = str(jax.make_jaxpr(jax.grad(lambda *a: loss(*a, True)))(params, x, state))
    assert ("lstm_backward_output" in program) == (ours != "xla")
    want, got = outputs_and_grads(False), outputs_and_grads(True)
    assert np.abs(want[0]).max() > 0.1
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and np.array_equal(_bits(g), _bits(w))
