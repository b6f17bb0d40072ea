"""`elmo-jax train`: a biLM trained from an experiment config, or the run in --workdir resumed."""

from __future__ import annotations

from typing import Any

from absl.flags import FlagValues

from elmo_jax import strict_json
from elmo_jax.commands.command import Command
from elmo_jax.errors import UserError
from elmo_jax.experiment import packaged_experiments


def main(flags: FlagValues) -> None:
    from elmo_jax.train.loop import train

    try:
        flags.config.keys()
    except OSError as e:  # ml_collections keeps a config file that failed to load as an error object
        reason = [line.strip() for line in str(e).splitlines() if line.strip()][-1]
        config_flag: Any = flags["config"]  # ml_collections' config flag, which keeps the file's name
        raise UserError(
            f"--config={config_flag.config_filename}: cannot be loaded ({reason}); "
            f"packaged experiments: {', '.join(sorted(packaged_experiments()))}"
        ) from None
    result = train(flags.config, flags.workdir)
    if result:
        print(strict_json.dumps(result))


COMMAND = Command(
    main,
    "Train a biLM from an experiment config, or resume the run in --workdir.",
    "--config=NAME|FILE --workdir=DIR [--config.SECTION.KEY=VALUE ...]",
    ("config", "workdir"),
    ("config", "workdir"),
    stops_cleanly=True,
)
