"""elmo_jax command line: python launch.py {train,eval} --flag=value ... (see README.md)."""

from absl import app

from elmo_jax.cli import main, parse_flags

if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
