"""Fine-tuning a trained biLM on new text with its own vocabulary (docs/TRAINING.md, "Fine-tuning").

The architecture and the starting weights come from `config.train.init_from`: a training
workdir (e.g. `workdirs/demo` after `make demo`), a folder made by `elmo-jax import` or
`elmo-jax export`, or the published weights exported that way. The token encoder and the LSTMs
are its own; softmax rows of words it knew are kept, the others start fresh. Point the data at
your text:

    elmo-jax train --config=finetune --workdir=runs/finetune \\
        --config.train.init_from=workdirs/demo \\
        --config.data.train='text:/data/mytext/train-*.txt' --config.data.heldout='text:/data/mytext/heldout.txt'
"""

from elmo_jax.config import PUBLISHED_OPTIONS
from elmo_jax.experiment import base_config


def get_config():
    config = base_config(PUBLISHED_OPTIONS["small"])  # replaced by the architecture of init_from
    config.train.init_from = "workdirs/demo"
    config.train.per_device_batch_size = 32
    config.train.n_negative_samples_batch = 1024  # below the vocabulary of a small corpus
    config.train.n_epochs = 1.0
    config.train.eval_every = 500
    config.train.eval_sentences = 500
    config.train.checkpoint_every = 500
    config.data.train = "text:data/finetune/train-*.txt"
    config.data.heldout = "text:data/finetune/heldout.txt"
    return config
