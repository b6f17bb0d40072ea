"""Errors the user can fix (a file, a flag, a setting, a format): the command line prints them
as one line and exits 2, without a traceback."""


class UserError(ValueError):
    """A bad input, named in the message (the file and line, the key or the field)."""


class MissingFile(UserError, FileNotFoundError):
    """A file or folder the user named that is not there."""


class RunFailed(RuntimeError):
    """A run that cannot go on (divergence, a failed save, a non-finite model): one line, exit 1."""
