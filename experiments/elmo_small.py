"""The published ELMo 'small' size, trained with the original bilm-tf recipe on LM1B.

Batch and dtype: 128 rows per device in float32, as the original size. Measured on one H200
(2026-11-30, code before the layer wavefront; docs/PERFORMANCE.md) only at 256 rows per device:
260,168 tokens/s, so 10 LM1B epochs take about 8.2 hours on 1 H200 at that batch.
"""

from elmo_jax.experiment import published_config


def get_config():
    return published_config("small")
