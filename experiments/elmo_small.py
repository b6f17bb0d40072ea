"""The published ELMo 'small' size, trained with the original bilm-tf recipe on LM1B."""

from elmo_jax.experiment import published_config


def get_config():
    return published_config("small")
