"""A tiny biLM on the built-in demo corpus: finishes on 2 CPU cores in a few minutes."""

from elmo_jax.experiment import base_config


def get_config():
    config = base_config(
        {
            "lstm": {"dim": 128, "projection_dim": 32, "n_layers": 2, "cell_clip": 3, "proj_clip": 3, "use_skip_connections": True},
            "char_cnn": {
                "embedding": {"dim": 8},
                "filters": [[1, 16], [2, 16], [3, 32], [4, 32]],
                "n_highway": 1,
                "n_characters": 262,
                "max_characters_per_token": 50,
                "activation": "relu",
            },
        }
    )
    config.train.batch_size = 32
    config.train.n_negative_samples_batch = 256
    config.train.n_epochs = 1.0
    config.train.log_every = 100
    config.train.eval_every = 1000
    config.train.eval_sentences = 500
    config.train.checkpoint_every = 500
    return config
