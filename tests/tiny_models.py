"""options.json dicts of small models for tests."""

from elmo_jax.config import bilm_options


def tiny_options(dim: int, projection_dim: int, embedding_dim: int, filters: list[list[int]]) -> dict:
    """A 2-layer biLM with skip connections, clips 3, one highway layer and relu."""
    return bilm_options(dim, projection_dim, filters, embedding_dim=embedding_dim, n_highway=1)
