"""The command line: `elmo-jax COMMAND --flag=value ...`, `python -m elmo_jax ...` and
`python launch.py ...` all come here (elmo_jax/cli.py parses, elmo_jax/commands/ runs)."""

import os
import signal
import sys


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        # SIGTERM before training installs its own handler: nothing has run, so nothing to save.
        # Exit at once: a SystemExit raised inside the import machinery's callbacks is ignored,
        # and the run went on.
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    from elmo_jax.platforms import cpu_unless_accelerated

    cpu_unless_accelerated()
    from elmo_jax.cli import run

    run()


if __name__ == "__main__":
    main()
