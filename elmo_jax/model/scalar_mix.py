"""ScalarMix: a learned, softmax-normalised weighting of the ELMo layers, times gamma
(Peters et al. 2018, eq. 1), as a Flax module for downstream models.

With `do_layer_norm`, each layer is first normalised over all its unmasked elements, as
AllenNLP computes it (boundaries included, eps 1e-13; ELMO_SPEC.md section 3).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class ScalarMix(nn.Module):
    num_layers: int
    do_layer_norm: bool = False

    @nn.compact
    def __call__(self, layers_LBTD: jax.Array, mask_BT: jax.Array | None = None) -> jax.Array:
        """(L, B, T, D) layers (and a (B, T) mask for layer norm) -> (B, T, D)."""
        if layers_LBTD.shape[0] != self.num_layers:
            raise ValueError(f"ScalarMix of {self.num_layers} layers got {layers_LBTD.shape[0]}")
        weights = jax.nn.softmax(self.param("scalar_parameters", nn.initializers.zeros, (self.num_layers,)))
        gamma = self.param("gamma", nn.initializers.ones, ())
        if self.do_layer_norm:
            if mask_BT is None:
                raise ValueError("ScalarMix with do_layer_norm needs the mask")
            m = mask_BT[None, :, :, None].astype(layers_LBTD.dtype)
            n = jnp.sum(m) * layers_LBTD.shape[-1]
            mean = jnp.sum(layers_LBTD * m, axis=(1, 2, 3), keepdims=True) / n
            var = jnp.sum(((layers_LBTD - mean) * m) ** 2, axis=(1, 2, 3), keepdims=True) / n
            layers_LBTD = (layers_LBTD - mean) / jnp.sqrt(var + 1e-13)
        return gamma * jnp.einsum("l,lbtd->btd", weights, layers_LBTD)
