"""What the dispatcher knows of a command, and how the user called us."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from absl.flags import FlagValues


@dataclasses.dataclass(frozen=True)
class Command:
    run: Callable[[FlagValues], None]  # the command's main(flags)
    summary: str
    usage: str  # the flags after the command name
    flags: tuple[str, ...]
    required: tuple[str, ...] = ()
    stops_cleanly: bool = False  # a stop signal ends it as a success, exit 0 (train: it saves the step it is at)


def prog() -> str:
    """How the user called us: elmo-jax, python -m elmo_jax or launch.py."""
    name = Path(sys.argv[0]).name
    return "python -m elmo_jax" if name in ("__main__.py", "cli.py") else name


def usage_line(name: str, command: Command) -> str:
    return f"usage: {prog()} {name} {command.usage}"
