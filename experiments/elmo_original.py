"""The published ELMo 'original' size, trained with the original bilm-tf recipe on LM1B.

Batch and dtype: 128 rows per device, the recipe's per-GPU batch (its global batch was 3 x 128),
in float32 (TF32 matmuls on an H200); `--config.train.compute_dtype=bfloat16` runs the matmuls in
bfloat16. Its throughput, the paper's run time on N devices, and what `elmo-jax plan` estimates
for larger batches: docs/PERFORMANCE.md.
"""

from elmo_jax.experiment import published_config


def get_config():
    return published_config("original")
