"""ScalarMix: a learned, softmax-normalised weighting of the ELMo layers, times gamma
(Peters et al. 2018, eq. 1), as a Flax NNX module for downstream models.

With `do_layer_norm`, each layer is first normalised over all its unmasked elements, as
AllenNLP computes it (boundaries included, eps 1e-13; docs/MODEL.md section 7).
Linen users wrap it with `flax.nnx.bridge.ToLinen` (docs/DOWNSTREAM.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx


@nnx.register_variable_name("frozen")
class Frozen(nnx.Variable):
    """A weight that is not trained: `nnx.grad` and `nnx.Optimizer` (which default to
    `nnx.Param`) leave it alone; linen's collection "frozen" under `nnx.bridge.ToLinen`."""


class ScalarMix(nnx.Module):
    """(L, B, T, D) layers -> gamma x sum_l softmax(s)_l x layer_l, (B, T, D).

    `initial_scalar_parameters` (L,) starts s elsewhere than 0 (an equal mix); `trainable=False`
    keeps s and gamma fixed, as AllenNLP's `scalar_mix_parameters` does."""

    def __init__(
        self,
        num_layers: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
    ):
        s = (
            jnp.zeros((num_layers,))
            if initial_scalar_parameters is None
            else jnp.asarray(initial_scalar_parameters, jnp.float32)
        )
        if s.shape != (num_layers,):
            raise ValueError(
                f"ScalarMix of {num_layers} layers got {s.shape[0] if s.ndim else 0} initial scalar parameters"
            )
        kind = nnx.Param if trainable else Frozen
        self.num_layers, self.do_layer_norm = num_layers, do_layer_norm
        self.scalar_parameters = kind(s)
        self.gamma = kind(jnp.ones(()))

    def __call__(self, layers_LBTD: jax.Array, mask_BT: jax.Array | None = None) -> jax.Array:
        """(L, B, T, D) layers (and a (B, T) mask for layer norm) -> (B, T, D)."""
        if layers_LBTD.shape[0] != self.num_layers:
            raise ValueError(f"ScalarMix of {self.num_layers} layers got {layers_LBTD.shape[0]}")
        weights = jax.nn.softmax(self.scalar_parameters[...])
        if self.do_layer_norm:
            if mask_BT is None:
                raise ValueError("ScalarMix with do_layer_norm needs the mask")
            m = mask_BT[None, :, :, None].astype(layers_LBTD.dtype)
            n = jnp.sum(m) * layers_LBTD.shape[-1]
            mean = jnp.sum(layers_LBTD * m, axis=(1, 2, 3), keepdims=True) / n
            var = jnp.sum(((layers_LBTD - mean) * m) ** 2, axis=(1, 2, 3), keepdims=True) / n
            layers_LBTD = (layers_LBTD - mean) / jnp.sqrt(var + 1e-13)
        return self.gamma[...] * jnp.einsum("l,lbtd->btd", weights, layers_LBTD)
