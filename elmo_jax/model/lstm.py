"""The LSTM with projection and clipping (TF `LSTMCell`, docs/MODEL.md section 1): both
directions of a biLM in each time loop, its layers in one loop (wavefront) or one each (layers).

Layer params hold both directions stacked on axis 0 (0 forward, 1 backward), in bilm-tf's
layout: `W_0` (2, 2P, 4C) with rows [input; h_prev] and gate blocks i, j, f, o; `B` (2, 4C)
without the +1 forget bias; `W_P_0` (2, C, P). For inference in loops of one layer, W_0 may be
split once into its input and recurrent halves `W_x`, `W_h` (`split_input_weights`).

Two schedules of the layers, the same numbers (`ModelConfig.lstm_schedule`):

- wavefront: layer l at time t needs only layer l - 1 at time t, so loop step s runs layer l at
  time s - l for every l at once, and a train step's forward and backward passes are T + L - 1
  dependent steps each instead of L x T: fewer, wider steps where each step's latency bounds
  the loop (accelerators). Layers >= 1 then read their input weights inside the loop.
- layers: one loop of T steps per layer, whose input half of the gate matmul runs for all T
  steps in one matmul before the loop: each step reads only the recurrent weights, the faster
  schedule where reading weights bounds the loop (this CPU at the published sizes).

Both run `wavefront.wavefront` (a single layer is a wavefront of one); its gradient is written
by hand and runs the same diagonal backwards. With several layers, the training step's cell can
run as Pallas kernels of our own, two a step each way (`ModelConfig.lstm_cell`, `cell_kernels`).
Letters as in `wavefront`'s doc.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.config import ModelConfig
from elmo_jax.model import Params
from elmo_jax.model.backend import backend
from elmo_jax.model.cell_kernels import products_fit
from elmo_jax.model.dropout import apply_dropout
from elmo_jax.model.kernel_calls import say_once
from elmo_jax.model.wavefront import Clips, Stack, wave_infer, wavefront, with_bias

Leaf = TypeVar("Leaf")


class LSTMState(NamedTuple, Generic[Leaf]):
    """Carried state of every LSTM: h (2, L, B, P) and c (2, L, B, C); axis 0 = direction (a
    pytree, whose leaves may also be their shardings or shapes)."""

    h: Leaf
    c: Leaf

    @staticmethod
    def zeros(config: ModelConfig, batch_size: int) -> LSTMState[jax.Array]:
        L, C, P = config.lstm.n_layers, config.lstm.dim, config.lstm.projection_dim
        return LSTMState(jnp.zeros((2, L, batch_size, P)), jnp.zeros((2, L, batch_size, C)))


def _glorot_uniform(rng: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    fan_in, fan_out = shape[-2], shape[-1]
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(rng, shape, minval=-limit, maxval=limit)


def init_lstm(rng: jax.Array, config: ModelConfig) -> Params:
    """Glorot-uniform kernels and zero biases (bilm-tf), both directions, every layer."""
    C, P = config.lstm.dim, config.lstm.projection_dim
    params = {}
    for layer, key in enumerate(jax.random.split(rng, config.lstm.n_layers)):
        k_w, k_p = jax.random.split(key)
        params[f"layer_{layer}"] = {
            "W_0": _glorot_uniform(k_w, (2, P + P, 4 * C)),
            "B": jnp.zeros((2, 4 * C)),
            "W_P_0": _glorot_uniform(k_p, (2, C, P)),
        }
    return params


def split_input_weights(lstm_params: Params) -> Params:
    """The LSTM params with each layer's W_0 (D, 2P, 4C) as its input half `W_x` (D, P, 4C) and
    recurrent half `W_h` (D, P, 4C): for inference in loops of one layer (the layers schedule,
    `lstm_stacks` with reset_BT), split once instead of at every call (XLA copies the slices of a
    weight each time its program runs)."""
    out = {}
    for name, layer in lstm_params.items():
        P = layer["W_0"].shape[1] // 2
        rest = {k: v for k, v in layer.items() if k != "W_0"}
        out[name] = {**rest, "W_x": layer["W_0"][:, :P], "W_h": layer["W_0"][:, P:]}
    return out


def _stacked(layers: list[Params], name: str) -> jax.Array:
    """One param of several layers, stacked on a new axis 0."""
    return jnp.stack([layer[name] for layer in layers])


def lstm_stacks(
    params: Params,
    x_2BTP: jax.Array,
    mask_BT: jax.Array,
    state: LSTMState,
    config: ModelConfig,
    *,
    keep_masks: jax.Array | None = None,
    dropout: float = 0.0,
    reset_BT: jax.Array | None = None,
    gates_2BTG: jax.Array | None = None,
    mark: Callable[[jax.Array], jax.Array] | None = None,
    top_only: bool = False,
) -> tuple[jax.Array, LSTMState]:
    """Both directions' L layers over inputs (2, B, T, P) -> outputs (L, 2, B, T, P), new state;
    with `top_only`, the top layer's outputs alone (1, 2, B, T, P), where nothing reads the others
    (training: the time loop's backward then reads no output gradient of the layers below).

    With `keep_masks` (at least L, 2, B, T, P; bool), layer l's input is dropped out where
    keep_masks[l] is False and scaled by 1 / (1 - dropout) elsewhere, as bilm-tf's
    DropoutWrapper does, and the residual (layers >= 1 with skip connections) adds the
    dropped-out input. Outputs are 0 where mask is False, and masked positions leave the state
    unchanged. Matmuls run in `config.compute_dtype`; `config.scan_unroll` unrolls the time loop; the layers
    run as `schedule(config)` says, to the same numbers. `reset_BT` (B, T; bool) restarts the
    state from zero where True, so that a row can hold several sentences back to back; it is
    for inference: with it, gradients come from JAX's own differentiation of the loop, not the
    hand-written one. `gates_2BTG` (2, B, T, 4C): layer 0's `input_gates` of x_2BTP, already
    computed (gathered from a table of distinct tokens), for the layers schedule and with `reset_BT`;
    so are params whose W_0 is split (`split_input_weights`). `mark` is applied to the weights a
    time loop reads once stacked (under shard_map: marking them device-varying, so that their
    gradients are summed over devices as the loop's backward makes them, a stack at a time).
    """
    cfg = config.lstm
    st = _stack(config, dropout, x_2BTP.shape[1])
    groups = (
        [range(cfg.n_layers)]
        if schedule(config) == "wavefront"
        else [range(layer, layer + 1) for layer in range(cfg.n_layers)]
    )
    split = "W_h" in params["layer_0"]
    if (gates_2BTG is not None or split) and (len(groups[0]) > 1 or reset_BT is None):
        raise ValueError(
            "precomputed input gates and split weights need layers in loops of their own (the layers schedule) "
            "and reset_BT"
        )
    mark = mark or (lambda x: x)
    outputs, hs, cs, layer_in = [], [], [], x_2BTP
    for layers in groups:  # one time loop each
        first, L = layers[0], len(layers)
        each = [params[f"layer_{layer}"] for layer in layers]
        if keep_masks is not None:
            layer_in = apply_dropout(keep_masks[first], layer_in, dropout)
        keep = None if keep_masks is None or L == 1 else keep_masks[first + 1 : first + L]
        h0, c0 = jnp.swapaxes(state.h[:, first : first + L], 0, 1), jnp.swapaxes(state.c[:, first : first + L], 0, 1)
        if top_only and first + L == cfg.n_layers:  # the loop of the top layer returns it alone
            st = st._replace(top_only=True)
        if reset_BT is None:
            W_0b, W_proj = mark(with_bias(_stacked(each, "W_0"), _stacked(each, "B"))), mark(_stacked(each, "W_P_0"))
            out, h, c = wavefront(W_0b, W_proj, layer_in, mask_BT, keep, h0, c0, st)
        else:
            W_0 = (_stacked(each, "W_x"), _stacked(each, "W_h")) if split else _stacked(each, "W_0")
            b, W_proj = _stacked(each, "B"), _stacked(each, "W_P_0")
            gates = gates_2BTG if first == 0 else None
            out, h, c = wave_infer(
                W_0, b, W_proj, layer_in, mask_BT, keep, h0, c0, st, reset_BT=reset_BT, gates_DBTG=gates
            )
        if cfg.use_skip_connections and first > 0:  # the wavefront adds the residual of its layers >= 1 itself
            # (first > 0: a loop of one layer, whose out[0] is that layer's, top_only or not)
            out = out.at[0].set(jnp.where(mask_BT[None, :, :, None], out[0] + layer_in, 0.0))
        outputs.append(out)
        hs.append(h)
        cs.append(c)
        layer_in = out[-1]
    return outputs[-1] if top_only else jnp.concatenate(outputs), LSTMState(
        jnp.swapaxes(jnp.concatenate(hs), 0, 1), jnp.swapaxes(jnp.concatenate(cs), 0, 1)
    )


def schedule(config: ModelConfig) -> str:
    """ "wavefront" or "layers": config.lstm_schedule, with "auto" resolved for the default
    backend (layers on CPU, where weight traffic bounds the loops of the published sizes)."""
    if config.lstm_schedule != "auto":
        return config.lstm_schedule
    return "layers" if backend() == "cpu" else "wavefront"


def cell(config: ModelConfig, rows: int | None = None) -> str:
    """ "xla", "pallas" or "fused": config.lstm_cell, with "auto" resolved for the default backend
    (our kernels on GPUs, where they measured faster than XLA's cell (docs/PERFORMANCE.md), for
    the wavefront of 2+ layers that they are written for, at sizes whose products Triton takes
    (`cell_kernels.products_fit`, at `rows` a device where given); XLA's cell elsewhere).
    "fused" (the gates' matmuls in the cell's kernels) is never auto's: it has not run on a GPU
    yet."""
    if config.lstm_cell != "auto":
        return config.lstm_cell
    cfg = config.lstm
    if not (backend() == "gpu" and schedule(config) == "wavefront" and cfg.n_layers >= 2):
        return "xla"
    if rows is not None and not products_fit(rows, cfg.dim, cfg.projection_dim):
        say_once(
            f"lstm_cell='auto': XLA's cell, as ours need rows per device, cell and projection in multiples of 16 "
            f"(here {rows}, {cfg.dim}, {cfg.projection_dim})"
        )
        return "xla"
    return "pallas"


def _stack(config: ModelConfig, dropout: float, rows: int) -> Stack:
    """What the wavefront needs of the config besides arrays (`wavefront.Stack`), at `rows` a device."""
    cfg = config.lstm
    clips = Clips(cell=cfg.cell_clip, proj=cfg.proj_clip)
    dtype, chosen = config.compute_dtype, cell(config, rows)
    return Stack(clips, cfg.use_skip_connections, dropout, config.scan_unroll, dtype, chosen)
