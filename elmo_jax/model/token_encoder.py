"""The character-CNN token encoder shared by both LMs (docs/MODEL.md section 1).

char ids (..., C) -> char embedding (..., C, D) -> per filter (w, n): VALID conv1d with bias,
max over positions, activation -> concat (..., F) -> highway layers -> projection (..., P).
With a word embedding (ELMoForManyLangs' models), each token's ids are its word id, then its
C char ids, and the projection reads [word vector (Dw) | highway output (F)].
"""

from __future__ import annotations

import dataclasses
import functools
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.model import Params, char_kernels, kernel_calls
from elmo_jax.model.backend import backend
from elmo_jax.model.matmul import matmul, narrow, result_type, widened

_ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh}


def init_token_encoder(rng: jax.Array, config: ModelConfig) -> Params:
    """Initialisation of bilm-tf (spec section 5). Row 0 of the embedding (padding) is zero."""
    cnn, P = config.char_cnn, config.lstm.projection_dim
    F, D = cnn.n_filters, cnn.embedding_dim
    keys = iter(jax.random.split(rng, 3 + len(cnn.filters) + 2 * cnn.n_highway))
    embed = jax.random.uniform(next(keys), (cnn.n_characters, D), minval=-1.0, maxval=1.0)
    params: Params = {"char_embed": embed.at[0].set(0.0), "cnn": {}, "highway": {}}
    for i, (width, count) in enumerate(cnn.filters):
        if cnn.activation == "relu":
            w = jax.random.uniform(next(keys), (width, D, count), minval=-0.05, maxval=0.05)
        else:
            w = jax.random.normal(next(keys), (width, D, count)) * np.sqrt(1.0 / (width * D))
        params["cnn"][f"filter_{i}"] = {"W": w, "b": jnp.zeros((count,))}
    for k in range(cnn.n_highway):
        params["highway"][f"layer_{k}"] = {
            "W_carry": jax.random.normal(next(keys), (F, F)) * np.sqrt(1.0 / F),
            "b_carry": jnp.full((F,), -2.0, jnp.float32),
            "W_transform": jax.random.normal(next(keys), (F, F)) * np.sqrt(1.0 / F),
            "b_transform": jnp.zeros((F,)),
        }
    words = config.word_embedding
    if words is not None:  # a key of its own: bilm-tf models' params stay what they were
        table = jax.random.uniform(jax.random.fold_in(rng, 1), (words.n_words, words.dim), minval=-1.0, maxval=1.0)
        params["word_embed"] = table.at[0].set(0.0)
    F_in = F + (words.dim if words is not None else 0)
    params["proj"] = {"W": jax.random.normal(next(keys), (F_in, P)) * np.sqrt(1.0 / F_in), "b": jnp.zeros((P,))}
    return params


def _windows(x: jax.Array, width: int, axis: int, along: int = -1) -> jax.Array:
    """Characters (..., C, ..., D), C along `axis` (D along `along`) -> (..., C - width + 1, ...,
    width * D): the characters each position of a VALID convolution of `width` reads, side by
    side (small: D is the char embedding's 16)."""
    W = x.shape[axis] - width + 1
    return jnp.concatenate([jax.lax.slice_in_dim(x, k, k + W, axis=axis) for k in range(width)], axis=along)


def _characters(d_windows: jax.Array, width: int, D: int, axis: int) -> jax.Array:
    """`_windows`' transpose: the windows' gradient (..., W, ..., width * D), W along `axis` ->
    the characters' (..., W + width - 1, ..., D) (window w's k-th character is character w + k)."""
    pads = [(0, 0)] * d_windows.ndim
    parts = []
    for k in range(width):
        pads[axis] = (k, width - 1 - k)
        parts.append(jnp.pad(d_windows[..., k * D : (k + 1) * D], pads))
    return cast(jax.Array, sum(parts))  # width >= 1 parts: an array


def _wide(dtype: str) -> str:
    """The operand dtype of a product whose float32 result must not be rounded: `dtype` where
    a dtype x dtype -> float32 product exists (accelerators), else float32 (XLA on CPU)."""
    return dtype if backend() != "cpu" else "float32"


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_max(x_NCD: jax.Array, w_filters: tuple[jax.Array, ...], dtype: str, kernels: bool) -> jax.Array:
    """Max over positions of each filter's VALID 1-D convolution: (N, C, D) x filters (w_i, D,
    n_i) -> (N, F = sum n_i) float32. All filters are one matmul of each position's characters
    (the widest filter's window; narrower filters' weights padded with zero rows, their windows
    past the word's end left out of the max) in `dtype`, its result (N, C - narrowest + 1, F) in
    `dtype`: the max of rounded values is the rounded max, at half the bytes of float32.

    Differentiated by hand as TF's max (the gradient split evenly among the positions that tie
    for the max): the forward pass keeps a bit for each position that holds the max
    (`_max_and_ties`), not the (N, C - narrowest + 1, F) values, and the backward pass builds the
    gradient at every position from those bits once, in `dtype`, where autodiff wrote a tie mask
    and float32 and `dtype` copies. The filter gradients are float32 sums over every word and
    position (and over devices, where the words are split), never rounded to
    a narrower compute dtype. `kernels`: the products, the max and its bits as our Pallas kernels
    (`char_kernels`), the (N, C - narrowest + 1, F) values never in device memory."""
    return _conv_max_forward(x_NCD, w_filters, dtype, kernels)[0]


def _filter_bank(w_filters: tuple[jax.Array, ...]) -> tuple[jax.Array, np.ndarray]:
    """Filters (w_i, D, n_i) -> one matrix (widest * D, F), narrower filters padded with zero
    rows, and each column's filter width (F,)."""
    widest, D = max(w.shape[0] for w in w_filters), w_filters[0].shape[1]
    columns = [jnp.pad(w.reshape(-1, w.shape[2]), ((0, (widest - w.shape[0]) * D), (0, 0))) for w in w_filters]
    return jnp.concatenate(columns, axis=1), np.concatenate([np.full(w.shape[2], w.shape[0]) for w in w_filters])


def _conv_max_forward(x_NCD, w_filters, dtype, kernels):
    (N, C, D), F = x_NCD.shape, sum(w.shape[2] for w in w_filters)
    w_KF, width_F = _filter_bank(w_filters)
    widest, narrowest = int(width_F.max()), int(width_F.min())
    # The narrowest filter's C - narrowest + 1 positions, each with the widest filter's window.
    x_NCD = jnp.pad(x_NCD, ((0, 0), (0, widest - narrowest), (0, 0)))
    if kernels:
        if x_NCD.dtype != dtype:
            raise ValueError(f"the char CNN's kernels take characters in the compute dtype {dtype}, not {x_NCD.dtype}")
        chars = _kernel_characters(x_NCD, widest)
        bank, last_F = _kernel_bank(w_KF, C - width_F, dtype)
        max_NF, count_NF, ties_MNF = char_kernels.max_and_ties(chars, bank, last_F, C - narrowest + 1, D, dtype)
        return max_NF[:N, :F].astype(jnp.float32), (chars, w_filters, ties_MNF, count_NF, bank)
    windows_NWK = _windows(x_NCD, widest, axis=1)
    y_NWF = windows_NWK.astype(dtype) @ w_KF.astype(dtype)
    max_NF, ties_MNF = _max_and_ties(jnp.where(_inside(C, width_F), y_NWF, -jnp.inf))
    return max_NF.astype(jnp.float32), (windows_NWK, w_filters, ties_MNF, None, None)


def _kernel_characters(x_NCD: jax.Array, width: int) -> jax.Array:
    """Characters (N, C, D) -> `char_kernels`' operand for the W = C - width + 1 windows of
    `width` characters, N and K = width * D padded with zeros to whole blocks: each word's
    characters flattened (N, (W - 1) * D + K), window w the slice w * D.. w * D + K; on a TPU
    (`kernel_calls.tiled()`) the windows (W, K, N) (the characters' D rows side by side, whole
    tiles of its sublanes, where XLA writes the windows in one pass)."""
    (N, C, D), padded = x_NCD.shape, kernel_calls.padded
    W, Np, K = C - width + 1, char_kernels.padded_words(N), width * D
    if kernel_calls.tiled():
        x_CDN = jnp.pad(jnp.transpose(x_NCD, (1, 2, 0)), ((0, 0), (0, 0), (0, Np - N)))
        return jnp.concatenate(
            [_windows(x_CDN, width, axis=0, along=1), jnp.zeros((W, padded(K) - K, Np), x_NCD.dtype)], axis=1
        )
    return jnp.pad(x_NCD.reshape(N, C * D), ((0, Np - N), (0, padded(K) - K)))  # C * D = (W - 1) * D + K


def _kernel_positions(chars: jax.Array, K: int, D: int) -> int:
    """W of `_kernel_characters`' operand for (padded) K-wide windows of D-wide characters."""
    return chars.shape[0] if kernel_calls.tiled() else (chars.shape[1] - K) // D + 1


def _kernel_bank(w_KF: jax.Array, last_F: np.ndarray, dtype: str) -> tuple[jax.Array, jax.Array]:
    """The filter bank (K, F) for `char_kernels`, in `dtype`, padded with zeros to whole blocks,
    and each column's last position (F,) int32 (-1 for the padding: never inside)."""
    (K, F), padded = w_KF.shape, kernel_calls.padded
    Kp, Fp = padded(K), padded(F, char_kernels.COLUMNS)
    bank = jnp.pad(w_KF.astype(dtype), ((0, Kp - K), (0, Fp - F)))
    return bank, jnp.asarray(np.pad(last_F, (0, Fp - F), constant_values=-1), jnp.int32)


def _inside(C: int, width_F: np.ndarray) -> np.ndarray:
    """(C - narrowest + 1, F) bool: where each column's filter fits in the word's C characters."""
    return np.arange(C - width_F.min() + 1)[:, None] <= C - width_F


def _max_and_ties(y_NWF: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(N, W, F) -> the max over the W positions (N, F) and the positions that hold it, a bit
    each: position w is bit w % 32 of word w // 32 of (M = ceil(W / 32), N, F) uint32.

    The backward pass needs only these bits, not the (N, W, F) values (its largest activation).
    On accelerators one pass over the positions' (N, F) slices carries the max and its bits
    (elementwise: XLA's GPU reduction over this middle axis moved it with transposes, and one that
    also counted ties ran far below the memory's bandwidth: docs/archive/PERFORMANCE_LOG.md). On CPU a
    max reduction, then the bits of the positions equal to it, which XLA runs faster there."""
    W = y_NWF.shape[1]
    bit_W = _position_bits(W)
    if backend() == "cpu":
        max_NF = jnp.max(y_NWF, axis=1)
        bits_NWF = jnp.where(y_NWF == max_NF[:, None], bit_W[:, None], np.uint32(0))
        return max_NF, jnp.stack([jnp.sum(bits_NWF[:, s : s + 32], axis=1) for s in range(0, W, 32)])
    max_NF = functools.reduce(jnp.maximum, [y_NWF[:, w] for w in range(W)])
    words = [
        functools.reduce(
            jnp.add, [jnp.where(y_NWF[:, w] == max_NF, bit_W[w], np.uint32(0)) for w in range(s, min(s + 32, W))]
        )
        for s in range(0, W, 32)
    ]
    return max_NF, jnp.stack(words)


def _position_bits(W: int) -> np.ndarray:
    """Each of W positions' bit in its uint32 word of `_max_and_ties`' bits: (W,) uint32."""
    return np.uint32(1) << (np.arange(W, dtype=np.uint32) % 32)


def _shares(count_NF: jax.Array, g_NF: jax.Array, dtype: str) -> jax.Array:
    """The max's gradient g (N, F) split evenly among the positions that hold it, count_NF (N, F)
    of them (an integer dtype): each one's share (N, F) in `dtype`."""
    return (g_NF / count_NF.astype(jnp.float32)).astype(dtype)


def _split_among_ties(ties_MNF: jax.Array, g_NF: jax.Array, W: int, dtype: str) -> jax.Array:
    """The gradient of the max at its positions (`_max_and_ties`' bits), split evenly among
    them as TF's max does: (N, F) -> (N, W, F) in `dtype`, zero at the other positions."""
    share_NF = _shares(jnp.sum(jax.lax.population_count(ties_MNF), axis=0), g_NF, dtype)
    bit_W = _position_bits(W)
    word_NWF = jnp.concatenate(
        [
            jnp.broadcast_to(word[:, None], (word.shape[0], min(32, W - 32 * m), word.shape[1]))
            for m, word in enumerate(ties_MNF)
        ],
        axis=1,
    )
    return jnp.where(word_NWF & bit_W[:, None] != 0, share_NF[:, None], jnp.zeros((), dtype))


def _conv_max_backward(dtype, kernels, residuals, g_NF):
    # XLA's path: the windows (N, W, widest * D), count and bank None; our kernels': their
    # operand, the max's tie count and the bank.
    inputs, w_filters, ties_MNF, count_NF, bank = residuals
    w_KF, width_F = _filter_bank(w_filters)
    (N, F), D = g_NF.shape, w_filters[0].shape[1]
    widest, narrowest = int(width_F.max()), int(width_F.min())
    if kernels:
        W, Np = _kernel_positions(inputs, bank.shape[0], D), ties_MNF.shape[1]
        share_NF = _shares(count_NF, jnp.pad(g_NF, ((0, Np - N), (0, bank.shape[1] - F))), dtype)
        dw_KF = char_kernels.filter_gradients(inputs, share_NF, ties_MNF, W, D, dtype)  # rows past widest * D dropped
        # The characters' gradient from the kernel: (N, C, D), on a TPU (C, D, N).
        dx = char_kernels.character_gradients(share_NF, ties_MNF, bank, W, widest, D, dtype, C=W + narrowest - 1)
        dx = jnp.transpose(dx[:, :, :N], (2, 0, 1)) if kernel_calls.tiled() else dx[:N]
    else:
        W = inputs.shape[1]
        g_NWF = _split_among_ties(ties_MNF, g_NF, W, dtype)
        wide = _wide(dtype)
        dw_KF = jnp.einsum("nwk,nwf->kf", inputs.astype(wide), g_NWF.astype(wide), preferred_element_type=jnp.float32)
        dx = _characters(matmul(g_NWF, w_KF.T, dtype), widest, D, axis=1)
    ends = np.cumsum([w.shape[2] for w in w_filters])
    dw = tuple(
        dw_KF[: w.shape[0] * D, end - w.shape[2] : end].reshape(w.shape).astype(w.dtype)
        for w, end in zip(w_filters, ends)
    )
    return dx[:, : W + narrowest - 1].astype(inputs.dtype), dw


_conv_max.defvjp(_conv_max_forward, _conv_max_backward)


def conv(config: ModelConfig) -> str:
    """ "xla" or "pallas": the training step's char CNN, config.char_conv with "auto" resolved
    for the default backend (our kernels on GPUs and TPUs, where they leave the step's largest
    activation out of device memory: about 3 of the 4.9 GB a train step of the published size
    moves at 128 rows on a GPU, 18 of the token encoder's 23.4 GB at 512 rows on a TPU v5p, by
    `elmo-jax plan`; XLA's elsewhere, and on a GPU whose shared memory they do not fit, said
    once)."""
    if config.char_conv != "auto":
        return config.char_conv
    return kernel_calls.auto_choice(
        "char_conv", "char CNN", lambda: char_kernels.unfit(*_kernel_sizes(config), config.compute_dtype)
    )


def resolved(config: ModelConfig) -> ModelConfig:
    """`config` with char_conv decided for the device it is traced for (`conv`) and, for our
    kernels, their blocks chosen (at the widest width): before a step is traced, so that no
    kernel is compiled inside a trace, whatever width of words a batch brings."""
    choice = conv(config)
    if choice == "pallas":
        kernel_blocks(config)
    return dataclasses.replace(config, char_conv=choice)


def kernel_blocks(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Each char CNN kernel's block of (words, filters), as `char_kernels.chosen_block` chooses it for
    the device the model is traced for."""
    sizes = _kernel_sizes(config)
    return {kernel: char_kernels.chosen_block(kernel, *sizes, config.compute_dtype) for kernel in char_kernels.KERNELS}


def _kernel_sizes(config: ModelConfig) -> tuple[int, int, int, int]:
    """W, D, K, F of the char CNN's kernels (`char_kernels`): the positions, the characters'
    width, the widest filter's window and the filters, as `_conv_max_forward` pads them."""
    cnn = config.char_cnn
    widths = [width for width, _ in cnn.filters]
    W = cnn.max_characters_per_token - min(widths) + 1
    return (
        W,
        cnn.embedding_dim,
        kernel_calls.padded(max(widths) * cnn.embedding_dim),
        kernel_calls.padded(cnn.n_filters, char_kernels.COLUMNS),
    )


def highway(layers: Params, h_NF: jax.Array, n_layers: int, dtype: str) -> jax.Array:
    """`n_layers` highway layers (`layer_0`, ...) over (N, F) float32 -> (N, F) float32. Their
    products' results, and h's gradient through them, come rounded to `dtype` (as
    `matmul(..., rounded=True)` rounds them: as XLA on CPU does, so the tests' numbers are the
    accelerators'): in bfloat16 the (N, F) products are written and read at half the bytes
    (docs/PERFORMANCE.md). In a narrower dtype than float32 differentiated by hand
    (`_highway_backward`), autodiff's ops in autodiff's order; in float32 by autodiff (its
    products' gradients are XLA's own, which `_highway_backward`'s would not match bit for bit
    on CPU)."""
    if n_layers == 0:
        return h_NF
    if dtype == "float32":
        for k in range(n_layers):
            hw = layers[f"layer_{k}"]
            gate = jax.nn.sigmoid(matmul(h_NF, hw["W_carry"], dtype) + hw["b_carry"])
            transform = jax.nn.relu(matmul(h_NF, hw["W_transform"], dtype) + hw["b_transform"])
            h_NF = gate * transform + (1.0 - gate) * h_NF
        return h_NF
    names = ("W_carry", "b_carry", "W_transform", "b_transform")
    return _highway(tuple(tuple(layers[f"layer_{k}"][name] for name in names) for k in range(n_layers)), h_NF, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _highway(weights: tuple[tuple[jax.Array, ...], ...], h_NF: jax.Array, dtype: str) -> jax.Array:
    """`highway` over each layer's (W_carry, b_carry, W_transform, b_transform)."""
    return _highway_forward(weights, h_NF, dtype)[0]


def _highway_forward(weights, h_NF, dtype):
    """The layers, as `matmul(..., rounded=True)` computes their products; saved for the
    backward pass: each layer's input (float32) and its `dtype` copy, the products' results as
    they come (in `dtype`: exact, half the bytes of float32) and the weights."""
    saved = []
    for W_c, b_c, W_t, b_t in weights:
        h_narrow, W_c_narrow, W_t_narrow = narrow(h_NF, dtype), narrow(W_c, dtype), narrow(W_t, dtype)
        pre_c = jnp.matmul(h_narrow, W_c_narrow, preferred_element_type=dtype)
        pre_t = jnp.matmul(h_narrow, W_t_narrow, preferred_element_type=dtype)
        gate = jax.nn.sigmoid(widened(pre_c) + b_c)
        transform = jax.nn.relu(widened(pre_t) + b_t)
        saved.append((h_NF, h_narrow, pre_c, pre_t, W_c, b_c, W_t, b_t))
        h_NF = gate * transform + (1.0 - gate) * h_NF
    return h_NF, tuple(saved)


def _highway_backward(dtype, saved, g_NF):
    """Autodiff's gradients, op for op (the same numbers run op by op: tests/test_bilm.py; under
    jit XLA's fusions may round the bias sums and h's gradient an ulp differently, as they do
    autodiff's own), in the dtypes of the params and h, written so that XLA reads each layer's
    (N, F) values once: on an H200 (`elmo-jax plan`, 512 rows in bfloat16) the token encoder's
    backward pass moved 0.59 GB less than autodiff's.

    - The carry gate's pre-activation gradient d_c goes to its product (in `dtype`) and to its
      bias's sum. XLA would not compute it (an exp and a division) in both the product's
      operand and the sum, and wrote it in float32 for a second kernel to read. Here the sum
      gets its own copy, -((-d_gate) * s) (the same number: negation is exact), which XLA
      computes inside the kernel that writes the products' operands. XLA's simplifier folds
      neither form today; a jaxlib that does would only show in `plan`'s bytes: check them on
      upgrading.
    - Each layer's products' operands, its biases' sums and the gradient it carries past the
      gate, (1 - gate) * dy, pass an optimization barrier before the products: XLA had put a
      layer's bias sums in the next layer's kernel, which then read this layer's dy, h and
      products again; after the barrier it reads only the carried gradient."""
    grads = []
    for h_NF, h_narrow, pre_c, pre_t, W_c, b_c, W_t, b_t in reversed(saved):
        gate = jax.nn.sigmoid(widened(pre_c) + b_c)
        y_t = widened(pre_t) + b_t
        keep = 1.0 - gate
        d_gate = -(g_NF * h_NF) + g_NF * jnp.maximum(y_t, 0.0)
        d_t = jnp.where(y_t > 0, gate * g_NF, 0.0)
        d_c = d_gate * (gate * keep)
        barrier = (narrow(d_t, dtype), narrow(d_c, dtype), jnp.sum(d_t, axis=0))
        barrier += (jnp.sum(-((-d_gate) * (gate * keep)), axis=0), keep * g_NF)
        g_t, g_c, db_t, db_c, carried = jax.lax.optimization_barrier(barrier)
        dx_t = jnp.matmul(g_t, narrow(W_t, dtype).T, preferred_element_type=dtype)
        dx_c = jnp.matmul(g_c, narrow(W_c, dtype).T, preferred_element_type=dtype)
        dW_t = jnp.tensordot(h_narrow, g_t, axes=((0,), (0,)), preferred_element_type=result_type(dtype))
        dW_c = jnp.tensordot(h_narrow, g_c, axes=((0,), (0,)), preferred_element_type=result_type(dtype))
        g_NF = (carried + widened(dx_t)) + widened(dx_c)
        grads.append(
            (
                widened(dW_c).astype(W_c.dtype),
                db_c.astype(b_c.dtype),
                widened(dW_t).astype(W_t.dtype),
                db_t.astype(b_t.dtype),
            )
        )
    return tuple(reversed(grads)), g_NF.astype(saved[0][0].dtype)


_highway.defvjp(_highway_forward, _highway_backward)


def encode_tokens(params: Params, ids_NI: jax.Array, config: ModelConfig, kernels: bool = False) -> jax.Array:
    """Token ids (N, I = config.token_width): char ids (N, C) (+1 shifted, 0 = padded slot),
    after a word id column where the model has a word embedding -> token vectors (N, P) float32;
    matmuls and convolutions in config.compute_dtype. The embeddings must have a row for every
    id (JAX's gather would silently clamp a larger id onto the last row). `kernels`: the char CNN
    as our Pallas kernels (`char_kernels`: the training step's, per device under shard_map, where
    `conv(config)` says so)."""
    rows, n_characters = params["char_embed"].shape[0], config.char_cnn.n_characters
    if rows != n_characters:
        raise ValueError(
            f"char_embed has {rows} rows; the char ids need {n_characters} (a zero padding row 0, then "
            f"the model's {n_characters - 1} rows: prepend a zero row to a {n_characters - 1}-row table)"
        )
    words = config.word_embedding
    if words is not None and params["word_embed"].shape != (words.n_words, words.dim):
        shape = (words.n_words, words.dim)
        raise ValueError(f"word_embed has shape {params['word_embed'].shape}; the config says {shape}")
    chars_NC = ids_NI if words is None else ids_NI[:, 1:]
    activation, dtype = _ACTIVATIONS[config.char_cnn.activation], config.compute_dtype
    x_NCD = params["char_embed"][chars_NC].astype(dtype)
    filters = [params["cnn"][f"filter_{i}"] for i in range(len(config.char_cnn.filters))]
    # One matmul (or our kernels) for all filters on accelerators (a few large kernels); one per
    # filter on CPU, where the narrower filters' zero rows cost more than the launches they save.
    banks = [filters] if backend() != "cpu" or kernels else [[f] for f in filters]
    pooled_NF = jnp.concatenate(
        [_conv_max(x_NCD, tuple(f["W"] for f in bank), dtype, kernels) for bank in banks], axis=1
    )
    h_NF = activation(pooled_NF + jnp.concatenate([f["b"] for f in filters]))
    h_NF = highway(params["highway"], h_NF, config.char_cnn.n_highway, dtype)
    if words is not None:
        h_NF = jnp.concatenate([params["word_embed"][ids_NI[:, 0]], h_NF], axis=1)
    return matmul(h_NF, params["proj"]["W"], dtype) + params["proj"]["b"]
