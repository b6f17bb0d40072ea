"""The process every command runs in: logging, freed host memory kept, the persistent compile
cache, the multi-process start-up, and errors reported as one line with their exit status."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from absl.flags import FlagValues

from elmo_jax import stop_signals
from elmo_jax.commands.command import prog
from elmo_jax.errors import RunFailed, UserError, as_flags
from elmo_jax.outputs import abandon_unfinished
from elmo_jax.progress import log_handler
from elmo_jax.switches import switch

CLOSED_PIPE = 128 + signal.SIGPIPE  # the status a shell reports for a writer a closed pipe killed


def stop_status(command: str, stop: stop_signals.Stopped) -> int:
    """A stopped command's exit status: 0 where it `stops_cleanly` (train), else that of a
    process the signal killed (128 + its number)."""
    from elmo_jax.commands import COMMANDS

    return 0 if command in COMMANDS and COMMANDS[command].stops_cleanly else 128 + stop.signum


def stopped_before_it_began(argv: list[str], stop: stop_signals.Stopped) -> int:
    """Says in one line that the command was stopped before it began; returns its exit status."""
    command = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else ""
    print(f"{prog()} {command}: stopped by {stop.name} before it began: nothing was written", file=sys.stderr)
    return stop_status(command, stop)


def _stopped(name: str, stop: stop_signals.Stopped) -> int:
    """Says in one line what a stop left (outputs being written are removed); returns the exit
    status. A closed stdout ends the command quietly."""
    said = abandon_unfinished()
    if stop.signum == signal.SIGPIPE:
        return CLOSED_PIPE
    print(f"{prog()} {name}: stopped by {stop.name}: {said}", file=sys.stderr)
    return stop_status(name, stop)


def run_command(name: str, main: Callable[[FlagValues], None], flags: FlagValues) -> None:
    """Sets the process up, then runs `main(flags)`. Errors the user can fix exit 2, a run that
    cannot go on exits 1, each one line (--verbose or ELMO_JAX_TRACEBACK=1: the traceback).
    SIGTERM and SIGINT stop it (elmo_jax/stop_signals.py), its unfinished output removed, with
    one line and `stop_status`; a closed stdout ends it quietly."""
    from elmo_jax.compile_time import use_persistent_cache  # JAX: only once the flags are good
    from elmo_jax.host_memory import keep_freed_memory

    _setup_logging()
    keep_freed_memory()
    if flags.compile_cache:
        use_persistent_cache(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "elmo_jax" / "jax")
    try:
        switch("ELMO_JAX_TRACEBACK")  # a value it cannot be is refused before any work
        stop_signals.check()  # one that came while the command's modules were imported
        _start_processes(flags)
        main(flags)
        for signum in stop_signals.SIGNALS:  # done: a signal now would only cut the exit short
            signal.signal(signum, signal.SIG_IGN)
    except stop_signals.Stopped as stop:
        exit_now(_stopped(name, stop))
    except BrokenPipeError:  # stdout's reader left (`elmo-jax eval ... | head -1`)
        exit_now(CLOSED_PIPE)
    except (UserError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        _report(name, e, 2, flags.verbose)
    except (RunFailed, OSError) as e:
        _report(name, e, 1, flags.verbose)
    except KeyboardInterrupt:  # a second SIGINT in train's steps: quit at once
        print(f"{prog()} {name}: interrupted: nothing saved since the last checkpoint", file=sys.stderr)
        exit_now(128 + signal.SIGINT)
    _exit_without_teardown()


def _exit_without_teardown() -> None:
    """A finished command ends as the interpreter would (the atexit handlers run: logs, event
    files, JAX's shutdown), then skips the teardown of every module and object that would
    follow: about 0.3 s of every command's exit, spent freeing what the process is about to give
    back anyway. Where a thread other than daemons is still running, the interpreter exits as
    usual (it joins the thread first)."""
    if any(not t.daemon for t in threading.enumerate() if t is not threading.current_thread()):
        return
    atexit._run_exitfuncs()
    exit_now(0)


def exit_now(status: int) -> None:
    """Ends the process with `status` once its output is flushed, without the interpreter's
    teardown. Where stdout's reader has gone, what it could not take is dropped, and a command
    that ended well says so by the status of a writer a closed pipe killed (CLOSED_PIPE)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            stop_signals.closed_pipe()
    if status == 0 and stop_signals.requested() == "SIGPIPE":
        status = CLOSED_PIPE
    os._exit(status)


def _start_processes(flags: FlagValues) -> None:
    """A multi-process run (--coordinator) joins the others before the command starts."""
    if flags.coordinator is not None:
        from elmo_jax.distributed import initialize

        try:
            initialize(flags.coordinator, flags.num_processes, flags.process_id, flags.coordinator_timeout)
        except ConnectionError as e:
            raise UserError(str(e)) from None
    elif flags.num_processes is not None or flags.process_id is not None:
        raise UserError("--num_processes and --process_id need --coordinator=HOST:PORT (or auto)")


def _not_an_orbax_thread_error(record: logging.LogRecord) -> bool:
    """Orbax logs a failed asynchronous save from each of its threads, with tracebacks; the
    error also reaches the training loop, which reports it in one line."""
    return not (record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname)


def _setup_logging() -> None:
    handler = log_handler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    handler.addFilter(_not_an_orbax_thread_error)
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    for noisy in ("absl", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _report(name: str, error: BaseException, status: int, verbose: bool) -> None:
    """One line, unless --verbose or ELMO_JAX_TRACEBACK=1 asks for the traceback."""
    with contextlib.suppress(UserError):  # refused in run_command
        verbose = verbose or switch("ELMO_JAX_TRACEBACK")
    if verbose:
        raise error
    message = as_flags(error) if isinstance(error, UserError) else str(error)
    print(f"{prog()} {name}: {message}", file=sys.stderr)
    exit_now(status)  # no atexit handlers either: a failed save's threads would print their own tracebacks
