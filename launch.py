"""elmo_jax's command line from a source checkout: `python launch.py COMMAND --flag=value ...`,
the same as the installed `elmo-jax` command (see README.md, elmo_jax/cli.py and elmo_jax/commands/)."""

from elmo_jax.__main__ import main

if __name__ == "__main__":
    main()
