"""The `cpu_peer` sizes (LSTM 256 with projection 64, 2 layers, a 256-filter char CNN) with the
original bilm-tf recipe at 32 rows per device and 1,024 negatives: the model this project
compares with the original bilm-tf code on one machine (benchmarks/speed/throughput.py,
benchmarks/parity/bilm_tf_learning.py, docs/BILM_TF_COMPARISON.md). Point the data at your text:

    elmo-jax train --config=cpu_peer --workdir=runs/peer \\
        --config.data.train='text:train.txt' --config.data.heldout='text:heldout.txt'
"""

from elmo_jax.config import bilm_options
from elmo_jax.experiment import base_config


def get_config():
    config = base_config(
        bilm_options(256, 64, [[1, 16], [2, 16], [3, 32], [4, 64], [5, 128]], embedding_dim=16, n_highway=1)
    )
    config.train.per_device_batch_size = 32
    config.train.n_negative_samples_batch = 1024
    config.train.n_epochs = 1.0
    return config
