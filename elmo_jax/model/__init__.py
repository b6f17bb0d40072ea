"""The biLM as pure functions of a params pytree (layout: elmo_jax/model/bilm.py)."""

import jax

Params = dict  # nested dicts of arrays, as elmo_jax/model/bilm.py lays them out


def shapes_by_path(params) -> dict[str, tuple[int, ...]]:
    """Each leaf's shape by its path ("token_encoder/proj/W"): of arrays, abstract arrays or
    Orbax's metadata of them."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {"/".join(str(k.key) for k in path): tuple(leaf.shape) for path, leaf in flat}
