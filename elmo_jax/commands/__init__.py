"""The commands of `elmo-jax`, one module each: its `COMMAND` (summary, usage, the flags it
reads) and `main(flags)`. Their flags are declared in `flags.py`, the process they run in is set
up by `process.py`, and `elmo_jax.cli` parses the command line and dispatches."""

from elmo_jax.commands import embed, eval, export, import_model, plan, plot, train, vocab
from elmo_jax.commands.command import Command

# In the order `elmo-jax --help` lists them.
COMMANDS: dict[str, Command] = {
    "vocab": vocab.COMMAND,
    "train": train.COMMAND,
    "eval": eval.COMMAND,
    "import": import_model.COMMAND,
    "export": export.COMMAND,
    "embed": embed.COMMAND,
    "plan": plan.COMMAND,
    "plot": plot.COMMAND,
}
