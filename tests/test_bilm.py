import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import tiny_options

from elmo_jax.config import ModelConfig
from elmo_jax.model.bilm import bilm_layers, init_params, reverse_within
from elmo_jax.model.lstm import LSTMState
from elmo_jax.text.chars import token_char_ids

TINY = tiny_options(16, 8, 4, [[1, 4], [2, 8]])


def sentence_chars(sentences, T):
    out = np.zeros((len(sentences), T, 50), np.int32)
    for i, s in enumerate(sentences):
        tokens = ["<S>", *s.split(), "</S>"]
        out[i, : len(tokens)] = token_char_ids(tokens)
    return out


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.from_options(TINY)
    params = init_params(jax.random.key(1), config, vocab_size=None)
    run = jax.jit(lambda p, chars, state: bilm_layers(p, chars, state, config))
    return config, params, run


def test_reverse_within():
    x = jnp.arange(10).reshape(2, 5)
    np.testing.assert_array_equal(reverse_within(x, jnp.array([3, 5])), [[2, 1, 0, 3, 4], [9, 8, 7, 6, 5]])


def test_padding_changes_neither_state_nor_output(model):
    config, params, run = model
    alone = sentence_chars(["the river bank"], 5)
    padded = sentence_chars(["the river bank", "a sentence about the money bank ."], 9)
    zero1, zero2 = LSTMState.zeros(config, 1), LSTMState.zeros(config, 2)
    layers1, mask1, state1 = run(params, alone, zero1)
    layers2, mask2, state2 = run(params, padded, zero2)
    assert layers2.shape == (3, 2, 9, 16)
    np.testing.assert_allclose(layers2[:, 0, :5], layers1[:, 0], atol=1e-6)
    assert (np.asarray(layers2[:, 0, 5:]) == 0).all()
    assert np.asarray(mask2).sum(1).tolist() == [5, 9]
    for a, b in zip(state1, state2):
        np.testing.assert_allclose(a[:, :, 0], b[:, :, 0], atol=1e-6)
    # Layer 0 is the token layer twice; the backward half of layer 1 reads the sentence reversed.
    np.testing.assert_array_equal(layers1[0, 0, :, :8], layers1[0, 0, :, 8:])


def test_backward_lstm_reads_from_the_end(model):
    """Changing the first word changes every forward position, but backward positions only at
    and before it (here: position 1 and the <S> at 0)."""
    config, params, run = model
    zero = LSTMState.zeros(config, 1)
    a, _, _ = run(params, sentence_chars(["bank of the river"], 6), zero)
    b, _, _ = run(params, sentence_chars(["shore of the river"], 6), zero)
    diff = np.abs(np.asarray(a - b))[1, 0]  # layer 1, (T, 2P)
    forward, backward = diff[:, :8].max(-1), diff[:, 8:].max(-1)
    assert (forward[1:] > 1e-6).all()
    assert (backward[:2] > 1e-6).all() and (backward[2:] == 0).all()


def test_carried_state_changes_the_next_batch(model):
    config, params, run = model
    chars = sentence_chars(["the river bank"], 5)
    first, _, state = run(params, chars, LSTMState.zeros(config, 1))
    second, _, _ = run(params, chars, state)
    assert np.abs(np.asarray(first[1:] - second[1:])).max() > 1e-4
    np.testing.assert_array_equal(first[0], second[0])  # the token layer has no state


def test_dropping_padding_columns_keeps_every_token_vector():
    """The batcher cuts a batch's character columns to the longest word + the widest filter:
    each filter's max still sees a window of padding only, so the vectors are unchanged."""
    from elmo_jax.model.token_encoder import encode_tokens
    from elmo_jax.text.batcher import StreamBatcher
    from elmo_jax.text.corpus import Sentences
    from elmo_jax.text.vocab import Vocabulary

    config = ModelConfig.from_options(tiny_options(16, 8, 4, [[1, 4], [3, 8], [7, 8]]))
    params = init_params(jax.random.key(2), config, vocab_size=None)
    # Untrained, a padding-only window can be the max; make it so for some filters.
    params["token_encoder"]["char_embed"] = params["token_encoder"]["char_embed"].at[261].set(2.0)
    sentences = [["a", "bank", "of", "the", "river"], ["supercalifragilistic", "x"]]
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "a"])
    corpus = Sentences(sentences, "c")
    cut = next(StreamBatcher(corpus, vocab, 2, 6, shuffle=False, char_window=config.char_cnn.widest_filter))
    full = next(StreamBatcher(corpus, vocab, 2, 6, shuffle=False))
    assert cut.chars.shape[1] == 32 and full.chars.shape[1] == 50  # 22 + 7, rounded to 8
    np.testing.assert_array_equal(cut.chars, full.chars[:, :32])
    np.testing.assert_allclose(
        encode_tokens(params["token_encoder"], cut.chars, config),
        encode_tokens(params["token_encoder"], full.chars, config),
        atol=1e-6,
    )


def _conv_then_max(x, w):
    """Autodiff's char CNN filter: lax's convolution, then jnp.max over positions."""
    y = jax.lax.conv_general_dilated(x, w.astype(x.dtype), (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"))
    return jnp.max(y, axis=1).astype(jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_char_cnn_max_keeps_a_bit_for_every_tied_position(dtype):
    """`_max_and_ties` over 45 positions (two words of bits): on a CPU reductions, traced for a
    GPU one pass over the positions' slices. Both give the max and exactly the positions equal
    to it, ties among small integers and -inf outside a filter's positions included; the
    backward pass's split (`_split_among_ties`) gives each tied position its share."""
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.token_encoder import _max_and_ties, _split_among_ties

    rng = np.random.default_rng(3)
    N, W, F = 16, 45, 12
    y = jnp.asarray(rng.integers(-3, 4, size=(N, W, F)), dtype).at[:, 40:, 7:].set(-jnp.inf)
    y = y.at[:, 33, 5].set(9)  # the max only in the second word
    want_max = np.asarray(y, np.float32).max(axis=1)
    hits = np.asarray(y, np.float32) == want_max[:, None]
    g = jnp.asarray(rng.normal(size=(N, F)), jnp.float32)
    want_split = np.where(hits, np.asarray((g / hits.sum(axis=1)).astype(dtype), np.float32)[:, None], 0)
    for platform in (None, "gpu"):
        with tracing_for(platform) if platform else contextlib.nullcontext():
            max_NF, ties_MNF = jax.jit(_max_and_ties)(y)
        assert ties_MNF.shape == (2, N, F) and ties_MNF.dtype == jnp.uint32
        np.testing.assert_array_equal(np.asarray(max_NF, np.float32), want_max)
        bits = (np.asarray(ties_MNF)[np.arange(W) // 32] >> (np.arange(W) % 32)[:, None, None]) & 1
        np.testing.assert_array_equal(bits.transpose(1, 0, 2) == 1, hits)
        split = _split_among_ties(ties_MNF, g, W, dtype)
        assert split.dtype == dtype
        np.testing.assert_array_equal(np.asarray(split, np.float32), want_split)
    assert (hits.sum(axis=1) > 1).mean() > 0.3 and hits[:, 33, 5].all()  # many ties; the second word


@pytest.mark.parametrize("traced_for", ["this CPU", "gpu", "pallas"])
def test_char_filter_gradients_split_ties_and_sum_in_float32(traced_for):
    """The char CNN's filters (`_conv_max`: one matmul of each position's characters for all
    filters, then the max, differentiated by hand), three widths. Small integers make every
    convolution value exact in bfloat16 too, so ties are exact: padding-only windows tie for the
    max. Its gradient splits each max's among the tied positions as TF's (and autodiff's) does:
    in float32 value and gradients are autodiff's of one convolution per filter. In bfloat16
    its filter gradients are still float32 sums over every word and position (what the devices
    then sum is float32), not rounded to bfloat16 as autodiff's are. Traced for a GPU too (the
    max and its ties over the positions' slices, bfloat16 products with float32 results), and as
    our Pallas kernels (`char_kernels`, interpreted here: blocks of words and filters, the words
    and filters padded to whole blocks)."""
    from elmo_jax.model.backend import tracing_for

    with tracing_for("gpu") if traced_for == "gpu" else contextlib.nullcontext():
        _check_char_filter_gradients(kernels=traced_for == "pallas")


def _check_char_filter_gradients(kernels: bool):
    from elmo_jax.model.token_encoder import _conv_max

    rng = np.random.default_rng(0)
    N, C, D = 64, 40, 16  # 40 positions: two words of bits
    x64 = rng.integers(-2, 3, size=(N, C, D)).astype(np.float64)
    x64[:, 18:] = 1.0  # padding: every window from 18 on holds the same characters
    w64 = [rng.integers(-2, 3, size=(width, D, n)).astype(np.float64) for width, n in ((3, 8), (1, 4), (2, 4))]
    g = jnp.asarray(rng.normal(size=(N, 16)), jnp.float32)
    y64 = [sum(np.einsum("nwd,dc->nwc", x64[:, k : C - len(w) + 1 + k], w[k]) for k in range(len(w))) for w in w64]
    hits = [y == y.max(axis=1, keepdims=True) for y in y64]
    pooled64 = np.concatenate([y.max(axis=1) for y in y64], axis=1)
    assert np.mean(np.concatenate([hit.sum(axis=1) > 1 for hit in hits], axis=1)) > 0.05  # some maxima tie

    def bank(dtype):
        return lambda x, *ws: _conv_max(x, ws, dtype, kernels)

    def autodiff(x, *ws):
        return jnp.concatenate([_conv_then_max(x, w) for w in ws], axis=1)

    x, ws = jnp.asarray(x64, jnp.float32), [jnp.asarray(w, jnp.float32) for w in w64]
    pooled, vjp = jax.vjp(bank("float32"), x, *ws)
    got, want = vjp(g), jax.vjp(autodiff, x, *ws)[1](g)
    np.testing.assert_array_equal(pooled, pooled64)
    for d, d_ad in zip(got, want):
        np.testing.assert_allclose(d, d_ad, atol=1e-6 * np.abs(d_ad).max())

    xb = jnp.asarray(x64, jnp.bfloat16)
    pooled, vjp = jax.vjp(bank("bfloat16"), xb, *ws)
    dx, *dws = vjp(g)
    rounded = jax.vjp(autodiff, xb, *[w.astype(jnp.bfloat16) for w in ws])[1](g)[1:]
    assert pooled.dtype == jnp.float32 and dx.dtype == jnp.bfloat16
    np.testing.assert_array_equal(pooled, pooled64)
    dx_exact, start = 0.0, 0
    for w, hit, dw, dw_ad in zip(w64, hits, dws, rounded):
        share = np.asarray(jnp.asarray(np.asarray(g[:, start : start + w.shape[2]]) / hit.sum(axis=1), jnp.bfloat16))
        d_y = np.where(hit, share.astype(np.float64)[:, None], 0.0)
        W = C - len(w) + 1
        exact = np.stack([np.einsum("nwd,nwc->dc", x64[:, k : k + W], d_y) for k in range(len(w))])
        error, rounded_error = (np.abs(np.asarray(d, np.float64) - exact).max() for d in (dw, dw_ad))
        assert dw.dtype == jnp.float32 and dw_ad.dtype == jnp.bfloat16
        assert error < 1e-6 * np.abs(exact).max() and rounded_error > 30 * error
        dx_exact += sum(
            np.pad(np.einsum("nwc,dc->nwd", d_y, w[k]), ((0, 0), (k, C - W - k), (0, 0))) for k in range(len(w))
        )
        start += w.shape[2]
    np.testing.assert_allclose(np.asarray(dx, np.float64), dx_exact, atol=2**-7 * np.abs(dx_exact).max())  # bf16


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block", [(64, 128), (16, 32)])
def test_the_char_cnn_kernels_compute_what_xla_does_over_many_blocks(dtype, block, monkeypatch):
    """Our char CNN kernels (`char_kernels`, interpreted here) against XLA's path of the same
    function: 200 words over 4 blocks of rows (padded from 200 to 256, 4 partial sums of the filter
    gradient), 200 filters over 2 blocks of columns (padded to 256), 37 positions (two words of
    bits), small integers so that the products are exact and tie. The same max; the same gradients
    (so the same ties) but for the order of their sums and, in bfloat16, XLA's rounding on CPU.
    In the largest block and in the smallest a GPU may choose (`char_kernels.chosen_block`)."""
    from elmo_jax.model import char_kernels

    monkeypatch.setattr(char_kernels, "BLOCKS", (block,))  # what chosen_block takes off a GPU
    _check_char_kernels_against_xla(dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("D, C, block", [(8, 40, (64, 128)), (24, 34, (16, 32)), (50, 40, (64, 128))])
def test_the_char_cnn_gpu_kernels_sum_characters_of_any_width_over_many_blocks(dtype, D, C, block, monkeypatch):
    """The GPU's character gradient kernel (`char_kernels.character_gradients`: a program a block
    of words, a character and 16 of its columns, the sum over the windows that hold it) where
    the characters are 8 wide (the demo's: padded to Triton's smallest dot dimension, 16), 24
    (two programs a character, the second's columns half padding) or 50 (ELMoForManyLangs'),
    widths 5 and 3 (the widest filter's windows past the word's end read the padding that lets
    the narrowest's last positions in), words of 40 characters and of 34 (32 positions: their
    bits fill one word), against XLA's path as above. The max and filter gradient kernels read
    each window from the flattened characters at w * D: with 24 and 50, K = 128 and 256 are not
    whole characters (their last window reads the zero padding past the word)."""
    from elmo_jax.model import char_kernels

    monkeypatch.setattr(char_kernels, "BLOCKS", (block,))
    _check_char_kernels_against_xla(dtype, D=D, widths=((5, 120), (3, 80)), C=C)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block, chunks", [((256, 512), 8), ((128, 128), 1)])
def test_the_char_cnn_tpu_kernels_compute_what_xla_does(dtype, block, chunks, monkeypatch):
    """The kernels' TPU variants (`kernel_calls.tiled`: windows (W, K, N), VMEM blocks of whole
    positions, the max and its bits and the filter gradient's sums kept in their outputs' blocks
    across the grid, the windows' gradient in VMEM summed into the characters'), interpreted
    here, against XLA's path as above: words padded to 256 (whole blocks of LANES), in one block
    of 256 words by 256 filters, and in 2 by 2 blocks of 128 x 128; the filter gradient's 2
    blocks of LANES words in 2 chunks, and in 1 of 2."""
    from elmo_jax.model import char_kernels, kernel_calls

    monkeypatch.setattr(kernel_calls, "tiled", lambda: True)
    monkeypatch.setattr(char_kernels, "TILED_ROWS", block[0])
    monkeypatch.setattr(char_kernels, "TILED_COLUMNS", block[1])
    monkeypatch.setattr(char_kernels, "CHUNKS", chunks)
    _check_char_kernels_against_xla(dtype)


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("D", [8, 24, 50])
def test_the_char_cnn_max_kernel_counts_the_positions_that_tie(tiled, D, monkeypatch):
    """The max kernel's count of the positions that hold each max (`char_kernels.max_and_ties`:
    the backward pass's divisor, int8) is the number of their bits, in its GPU variant and its
    TPU variant (interpreted here): words whose padding characters make the positions from 18 on
    tie, the widest filter's last positions past the word's end (-inf), the padding words (all
    0) and filters (all -inf: every position tied) included."""
    from elmo_jax.model import char_kernels, kernel_calls
    from elmo_jax.model.token_encoder import _conv_max

    monkeypatch.setattr(kernel_calls, "tiled", lambda: tiled)
    results = []
    max_and_ties = char_kernels.max_and_ties
    monkeypatch.setattr(char_kernels, "max_and_ties", lambda *a: results.append(max_and_ties(*a)) or results[-1])
    rng = np.random.default_rng(2)
    N, C, W = 200, 40, 38  # 2 words of bits; padded to 256 words and (200 filters) 256 filters
    x = rng.integers(-1, 2, size=(N, C, D)).astype(np.float32)
    x[:, 18:] = 1.0
    ws = tuple(jnp.asarray(rng.integers(-1, 2, size=(width, D, n)), jnp.float32) for width, n in ((5, 120), (3, 80)))
    _conv_max(jnp.asarray(x), ws, "float32", True)
    _, count_NF, ties_MNF = (np.asarray(a) for a in results[0])
    assert count_NF.dtype == np.int8 and count_NF.shape == ties_MNF.shape[1:] == (256, 256)
    np.testing.assert_array_equal(count_NF, np.bitwise_count(ties_MNF).sum(axis=0))
    # The padding words: each filter's positions that it fits (the widest's 36) tie; the padding filters' all W.
    np.testing.assert_array_equal(count_NF[N:], np.broadcast_to(np.where(np.arange(256) < 120, 36, W), (56, 256)))
    assert (count_NF[:, 200:] == W).all()
    assert 0.05 < (count_NF[:N, :200] > 1).mean() < 0.95


def test_the_char_cnn_max_kernel_counts_more_ties_than_int8_holds_in_int32():
    """Words of 130 positions all tied (zero characters): counted in int32, each 130."""
    from elmo_jax.model import char_kernels

    chars, bank = jnp.zeros((16, 129 * 16 + 128)), jnp.zeros((128, 128))
    _, count_NF, _ = char_kernels.max_and_ties(chars, bank, jnp.full(128, 129, jnp.int32), 130, 16, "float32")
    assert count_NF.dtype == jnp.int32 and (np.asarray(count_NF) == 130).all()


def _check_char_kernels_against_xla(dtype: str, D: int = 16, widths=((4, 120), (2, 80)), C: int = 40):
    from elmo_jax.model.token_encoder import _conv_max

    rng = np.random.default_rng(1)
    N = 200
    x = jnp.asarray(rng.integers(-1, 2, size=(N, C, D)), dtype)
    ws = [jnp.asarray(rng.integers(-1, 2, size=(width, D, n)), jnp.float32) for width, n in widths]
    g = jnp.asarray(rng.normal(size=(N, 200)), jnp.float32)
    xla, xla_vjp = jax.vjp(lambda x, *ws: _conv_max(x, ws, dtype, False), x, *ws)
    ours, our_vjp = jax.vjp(lambda x, *ws: _conv_max(x, ws, dtype, True), x, *ws)
    np.testing.assert_array_equal(ours, xla)
    # The characters' gradient in bfloat16: XLA on CPU rounds each window's product, ours its sum.
    tolerances = (2e-6 if dtype == "float32" else 2**-6, 2e-6, 2e-6)
    for got, want, tolerance in zip(our_vjp(g), xla_vjp(g), tolerances, strict=True):
        assert got.dtype == want.dtype
        scale = np.abs(np.asarray(want, np.float32)).max()
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tolerance * scale)


def test_the_char_cnn_kernels_lower_for_a_tpu_and_declare_their_bytes():
    """Traced for a TPU, `char_conv='pallas'` lowers to Mosaic kernels (its tiled variants), each
    declaring the bytes it moves to `elmo-jax plan`; the CPU's interpreter still runs them here."""
    from elmo_jax.model import char_kernels
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.kernel_calls import BYTES_KEY
    from elmo_jax.model.token_encoder import _conv_max

    x, w = jnp.zeros((4, 10, 16)), jnp.zeros((2, 16, 8))
    _conv_max(x, (w,), "float32", True)  # on this CPU: interpreted

    def value_and_grads(x, w):
        return jax.value_and_grad(lambda x, w: _conv_max(x, (w,), "float32", True).sum(), argnums=(0, 1))(x, w)

    with tracing_for("tpu"):
        text = jax.jit(value_and_grads).trace(x, w).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == len(char_kernels.KERNELS) and text.count(BYTES_KEY) == 3


def test_bfloat16_matmul_gradients_are_float32_products():
    """A bfloat16 matmul's gradients (traced for a GPU, whose bfloat16 products have float32
    results) are the products of the bfloat16 operands and the output gradient rounded to
    bfloat16 once, with float32 results: not rounded to bfloat16 as autodiff's are (its weight
    gradient then summed over devices), and not float32 x bfloat16 (TF32) products."""
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.matmul import matmul

    rng = np.random.default_rng(0)
    x, w, g = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in ((4, 64, 48), (48, 32), (4, 64, 32)))
    x64, w64, g64 = (np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) for a in (x, w, g))
    exact = (g64 @ w64.T, np.einsum("bnk,bnc->kc", x64, g64))
    with tracing_for("gpu"):
        y, vjp = jax.vjp(lambda x, w: matmul(x, w, "bfloat16"), x, w)
        autodiff = jax.vjp(lambda x, w: jnp.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)), x, w)[1]
        got, rounded = vjp(g), autodiff(g.astype(jnp.bfloat16))
    np.testing.assert_allclose(y, x64 @ w64, rtol=1e-6, atol=1e-5)
    for name, d, r, want in zip(("x", "w"), got, rounded, exact):
        assert d.dtype == jnp.float32, name
        error, rounded_error = (np.abs(np.asarray(a, np.float64) - want).max() / np.abs(want).max() for a in (d, r))
        assert error < 1e-6 and rounded_error > 100 * error, (name, error, rounded_error)


def _highway_layers(rng: np.random.Generator, n_layers: int, F: int) -> dict:
    """Random float32 params of `n_layers` highway layers of width F."""
    return {
        f"layer_{k}": {
            "W_carry": jnp.asarray(rng.normal(size=(F, F)) / np.sqrt(F), jnp.float32),
            "b_carry": jnp.asarray(rng.normal(size=F), jnp.float32),
            "W_transform": jnp.asarray(rng.normal(size=(F, F)) / np.sqrt(F), jnp.float32),
            "b_transform": jnp.asarray(rng.normal(size=F), jnp.float32),
        }
        for k in range(n_layers)
    }


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_the_highway_backward_pass_is_autodiffs_bit_for_bit(platform):
    """`highway` in bfloat16 is differentiated by hand (`_highway_backward`: fewer bytes on
    accelerators); its output and every gradient are autodiff's of the plain layers (products by
    `matmul(..., rounded=True)`) exactly, traced for each platform, op by op (eager) on this CPU."""
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.matmul import matmul
    from elmo_jax.model.token_encoder import highway

    def autodiff(layers, h_NF):
        for k in range(3):
            hw = layers[f"layer_{k}"]
            gate = jax.nn.sigmoid(matmul(h_NF, hw["W_carry"], "bfloat16", rounded=True) + hw["b_carry"])
            transform = jax.nn.relu(matmul(h_NF, hw["W_transform"], "bfloat16", rounded=True) + hw["b_transform"])
            h_NF = gate * transform + (1.0 - gate) * h_NF
        return h_NF

    rng = np.random.default_rng(1)
    N, F = 40, 24
    layers = _highway_layers(rng, 3, F)
    h = jnp.asarray(np.where(rng.random((N, F)) < 0.2, 0.0, rng.normal(size=(N, F))), jnp.float32)
    g = jnp.asarray(rng.normal(size=(N, F)), jnp.float32)
    for k in range(3):  # a transform pre-activation exactly 0: relu's gradient there is 0
        layers[f"layer_{k}"]["W_transform"] = layers[f"layer_{k}"]["W_transform"].at[:, 0].set(0.0)
        layers[f"layer_{k}"]["b_transform"] = layers[f"layer_{k}"]["b_transform"].at[0].set(0.0)
    with tracing_for(platform):
        results = []
        for f in (lambda layers, h: highway(layers, h, 3, "bfloat16"), autodiff):
            y, vjp = jax.vjp(f, layers, h)
            results.append(jax.tree.leaves((y, vjp(g))))
    for ours, theirs in zip(*results):
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs)


def test_the_highway_rounds_its_products_on_a_gpu_as_xla_on_cpu_does():
    """In bfloat16 the highway's products and h's gradient through them come rounded to
    bfloat16 on accelerators too (`matmul(..., rounded=True)`: half their bytes), as XLA on CPU
    rounds them: traced for a GPU, the layers' output and input gradient are this CPU's exactly;
    the weights' gradients stay float32 sums there (rounded to bfloat16 here)."""
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.token_encoder import highway

    rng = np.random.default_rng(0)
    N, F = 48, 32
    layers = _highway_layers(rng, 2, F)
    h, g = (jnp.asarray(rng.normal(size=(N, F)), jnp.float32) for _ in range(2))

    def run():
        y, vjp = jax.vjp(lambda layers, h: highway(layers, h, 2, "bfloat16"), layers, h)
        return y, *vjp(g)

    y_cpu, d_layers_cpu, dh_cpu = run()
    with tracing_for("gpu"):
        y_gpu, d_layers_gpu, dh_gpu = run()
    np.testing.assert_array_equal(y_gpu, y_cpu)
    np.testing.assert_array_equal(dh_gpu, dh_cpu)
    d_W_cpu, d_W_gpu = (d["layer_0"]["W_carry"] for d in (d_layers_cpu, d_layers_gpu))
    assert not np.array_equal(d_W_gpu, d_W_cpu)
    np.testing.assert_allclose(d_W_gpu, d_W_cpu, rtol=2**-7, atol=2**-7 * np.abs(d_W_cpu).max())
