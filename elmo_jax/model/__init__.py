"""The biLM as pure functions of a params pytree (layout: elmo_jax/model/bilm.py)."""

import jax

from elmo_jax.platforms import cpu_in_jax_unless_accelerated

# Quiet as a library: no accelerator plugin probing for a GPU or TPU this machine does not have.
cpu_in_jax_unless_accelerated()

Params = dict  # nested dicts of arrays, as elmo_jax/model/bilm.py lays them out


def shapes_by_path(params) -> dict[str, tuple[int, ...]]:
    """Each leaf's shape by its path ("token_encoder/proj/W"): of arrays, abstract arrays or
    Orbax's metadata of them."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {"/".join(str(k.key) for k in path): tuple(leaf.shape) for path, leaf in flat}
