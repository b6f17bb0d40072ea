"""The biLM as pure functions of a params pytree (layout: elmo_jax/model/bilm.py)."""

Params = dict  # nested dicts of arrays, as elmo_jax/model/bilm.py lays them out
