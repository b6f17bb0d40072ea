"""The published ELMo 'original' size, trained with the original bilm-tf recipe on LM1B.

Batch and dtype: 128 rows per device, the recipe's per-GPU batch (its global batch was 3 x 128),
in float32 (TF32 matmuls on an H200). Measured on one H200 (2026-11-30, code before the layer
wavefront, the sparse softmax update and bfloat16; docs/PERFORMANCE.md): 85,355 tokens/s at
128 rows, so the paper's 10 LM1B epochs take about 25 hours on 1 H200 and 3.3 on 8 (projected,
formula in docs/PERFORMANCE.md; 8 x 128 rows is 2.7 times the recipe's global batch). 512 rows
per device ran at 137,615 tokens/s (15.5 hours on 1), 4 times the recipe's batch per device.
`--config.train.compute_dtype=bfloat16` is not yet measured on a GPU (benchmarks/gpu.sh does).
"""

from elmo_jax.experiment import published_config


def get_config():
    return published_config("original")
