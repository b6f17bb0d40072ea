"""Errors the user can fix (a file, a flag, a setting, a format): the command line prints them
as one line and exits 2, without a traceback."""

from __future__ import annotations

import re


class UserError(ValueError):
    """A bad input, named in the message (the file and line, the key or the field).

    `arguments`: the keyword arguments of the call the error is about, which the message spells
    `name=value` (`name=True` for a switch); the command line, whose flags carry the same names,
    spells them `--name=value` and `--name` (`as_flags`)."""

    def __init__(self, message: str, arguments: tuple[str, ...] = ()):
        super().__init__(message)
        self.arguments = arguments


def as_flags(error: UserError) -> str:
    """The message with its arguments spelled as the command line's flags."""
    message = str(error)
    for name in error.arguments:
        message = re.sub(rf"(?<![\w-]){name}=True\b", f"--{name}", message)
        message = re.sub(rf"(?<![\w-]){name}=", f"--{name}=", message)
    return message


class MissingFile(UserError, FileNotFoundError):
    """A file or folder the user named that is not there."""


class RunFailed(RuntimeError):
    """A run that cannot go on (divergence, a failed save, a non-finite model): one line, exit 1."""
