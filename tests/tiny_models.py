"""options.json dicts of small models for tests."""


def tiny_options(dim: int, projection_dim: int, embedding_dim: int, filters: list[list[int]]) -> dict:
    """A 2-layer biLM with skip connections, clips 3, one highway layer and relu."""
    return {
        "lstm": {
            "dim": dim,
            "projection_dim": projection_dim,
            "n_layers": 2,
            "cell_clip": 3,
            "proj_clip": 3,
            "use_skip_connections": True,
        },
        "char_cnn": {
            "embedding": {"dim": embedding_dim},
            "filters": filters,
            "n_highway": 1,
            "n_characters": 262,
            "max_characters_per_token": 50,
            "activation": "relu",
        },
    }
