"""The command line: `elmo-jax COMMAND --flag=value ...`, `python -m elmo_jax ...` and
`python launch.py ...` all come here (elmo_jax/cli.py parses, elmo_jax/commands/ runs)."""

import sys

from elmo_jax import stop_signals


def main() -> None:
    stop_signals.install()  # first: a signal at any later instant ends in one line (elmo_jax/stop_signals.py)
    try:
        from elmo_jax.platforms import cpu_unless_accelerated

        cpu_unless_accelerated()
        from elmo_jax.cli import run

        run()
    except stop_signals.Stopped as stop:  # before the command began: its imports, its flags
        from elmo_jax.commands.process import exit_now, stopped_before_it_began

        exit_now(stopped_before_it_began(sys.argv, stop))
    except BrokenPipeError:  # `elmo-jax --help | head -1`: the reader left; end quietly
        from elmo_jax.commands.process import CLOSED_PIPE, exit_now

        exit_now(CLOSED_PIPE)


if __name__ == "__main__":
    main()
