"""The experiment configs, one file each whose `get_config()` returns a locked ml_collections
ConfigDict. Installed as the package `elmo_jax.experiments`, so `elmo-jax train --config=NAME`
finds them by name from any folder (elmo_jax/experiment.py: `experiment_file`)."""
