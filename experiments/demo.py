"""A tiny biLM on the built-in demo corpus: 1.3 passes over its 200,000 training sentences
(3,516 steps of 32 x 20), a few minutes on a CPU (docs/PERFORMANCE.md, "make demo"), to a held-out
perplexity near the corpus's floor of 20.91.

The recipe is bilm-tf's (sampled softmax, Adagrad at 0.2 on the gradient of 20 x the loss, clip
10, carried LSTM state) with two settings for a small model on a 2,600-word vocabulary: 1024
negatives, and no dropout (a pass or two over plentiful data does not overfit).
"""

from elmo_jax.experiment import base_config


def get_config():
    config = base_config(
        {
            "lstm": {
                "dim": 128,
                "projection_dim": 64,
                "n_layers": 2,
                "cell_clip": 3,
                "proj_clip": 3,
                "use_skip_connections": True,
            },
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
    config.train.per_device_batch_size = 32
    config.train.n_negative_samples_batch = 1024
    config.train.dropout = 0.0
    config.train.n_epochs = 1.3
    config.train.log_every = 100
    config.train.eval_every = 1000
    config.train.eval_sentences = 500
    config.train.checkpoint_every = 500
    return config
