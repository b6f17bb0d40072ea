"""The published ELMo 'medium' size, trained with the original bilm-tf recipe on LM1B.

Batch and dtype: 128 rows per device in float32, as the original size. Its throughput and the
paper's run time on N devices: docs/PERFORMANCE.md.
"""

from elmo_jax.experiment import published_config


def get_config():
    return published_config("medium")
