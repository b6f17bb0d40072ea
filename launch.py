"""elmo_jax command line: python launch.py {train,eval} --flag=value ... (see README.md)."""

import os
import signal
import sys

if len(sys.argv) > 1 and sys.argv[1] == "train":
    # SIGTERM before training installs its own handler: nothing has run, so nothing to save. Exit
    # at once: a SystemExit raised inside the import machinery's callbacks is ignored, and the run
    # went on.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

from absl import app  # noqa: E402

from elmo_jax.cli import main, parse_flags  # noqa: E402

if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
