"""Stop signals (elmo_jax/stop_signals.py): the handler writes nothing and raises nothing at the
first signal, a second one stops at once, a critical stretch is never parted, and an output
swapped into place under a signal is whole and said to be."""

import os
import signal

import pytest

from elmo_jax import outputs, stop_signals


@pytest.fixture
def installed():
    assert stop_signals.install()
    outputs._GIVEN_UP.clear()  # what earlier tests' outputs left in this process's record
    outputs._FINISHED.clear()
    try:
        yield
    finally:
        stop_signals.uninstall()


def _signal(signum: int = signal.SIGTERM) -> None:
    os.kill(os.getpid(), signum)  # the handler runs before kill returns to Python code


class Unwritable:
    def write(self, text):
        raise AssertionError(f"the handler wrote {text!r}")

    def flush(self):
        raise AssertionError("the handler flushed")


def test_the_first_signal_is_only_recorded_and_raised_at_the_next_check(installed, monkeypatch):
    """The handler used to print and exit from where the signal landed (inside a log line's
    write, a module's import, a finaliser that swallowed what it raised)."""
    monkeypatch.setattr("sys.stderr", Unwritable())
    monkeypatch.setattr("sys.stdout", Unwritable())
    _signal()
    assert stop_signals.requested() == "SIGTERM"
    monkeypatch.undo()
    with pytest.raises(stop_signals.Stopped) as stop:
        stop_signals.check()
    assert stop.value.name == "SIGTERM" and stop.value.signum == signal.SIGTERM


def test_a_second_signal_stops_at_once_and_later_ones_do_not_cut_the_stop_short(installed):
    _signal(signal.SIGINT)
    with pytest.raises(stop_signals.Stopped):
        _signal(signal.SIGTERM)  # the user insists
    _signal(signal.SIGTERM)  # a stop is under way: nothing raised into its clean-up
    assert stop_signals.requested() == "SIGINT"


def test_a_critical_stretch_is_never_parted(installed):
    done = []
    with pytest.raises(stop_signals.Stopped):
        with stop_signals.critical():
            _signal()
            _signal()  # even insisting
            done.append("both halves")
    assert done == ["both halves"]


def test_deferred_steps_record_and_a_second_sigint_quits(installed):
    with stop_signals.deferred():
        _signal(signal.SIGINT)
        assert stop_signals.requested() == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            _signal(signal.SIGINT)
    stop_signals.uninstall()
    stop_signals.install()
    with stop_signals.deferred(quit_at_sigint=1):  # a multi-process run cannot stop at one step on SIGINT
        with pytest.raises(KeyboardInterrupt):
            _signal(signal.SIGINT)


def test_a_signal_between_a_folders_two_renames_leaves_the_new_output_whole_and_says_so(
    installed, tmp_path, monkeypatch
):
    """A signal between the renaming aside of the old folder and the renaming in of the new one
    left the target missing while the message said earlier outputs were as they were."""
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights.hdf5").write_text("old")
    real_rename = os.rename

    def rename_then_signal(source, destination):
        real_rename(source, destination)
        if str(destination).endswith(f".old-{outputs.HOST}-{os.getpid()}"):
            _signal()
            _signal()  # a second, insisting, in the window too

    monkeypatch.setattr(outputs.os, "rename", rename_then_signal)
    with pytest.raises(stop_signals.Stopped):
        with outputs.replacing(
            target, overwrite=True, folder=outputs.Folder(("weights.hdf5",), ("weights.hdf5",))
        ) as tmp:
            tmp.mkdir()
            (tmp / "weights.hdf5").write_text("new")
    assert (target / "weights.hdf5").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert outputs.abandon_unfinished() == f"{target} complete and in place"


def test_a_signal_before_an_output_is_in_place_gives_it_up(installed, tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(stop_signals.Stopped):
        with outputs.replacing(target, overwrite=True) as tmp:
            tmp.write_text("new")
            _signal()
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    assert outputs.abandon_unfinished().startswith(f"removed the unfinished {target}")


def test_once_quitting_every_sigint_quits_again(installed):
    """After the second SIGINT of the steps (quit at once), a third while the loop's clean-up
    waits for a save quits too: it was recorded and ignored."""
    with pytest.raises(KeyboardInterrupt):
        with stop_signals.deferred():
            _signal(signal.SIGINT)
            _signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        _signal(signal.SIGINT)


def test_a_closed_pipe_stops_but_is_no_first_signal(installed):
    stop_signals.closed_pipe()
    assert stop_signals.requested() == "SIGPIPE"
    _signal(signal.SIGTERM)  # the first real signal: recorded, nothing raised
    with pytest.raises(stop_signals.Stopped) as stop:
        stop_signals.check()
    assert stop.value.name == "SIGTERM"
