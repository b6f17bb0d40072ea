"""Outputs never clobber: refusals, --overwrite, and atomic replacement under kill -9; JSON is strict."""

import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import h5py
import jax
import numpy as np
import pytest
from cli import ROOT, assert_one_line_error, launch_args, run_cli, start_cli, strict_json
from tiny_models import tiny_options

from elmo_jax.config import ModelConfig
from elmo_jax.errors import UserError
from elmo_jax.interop.bilm_hdf5 import save_weights
from elmo_jax.model.bilm import init_params
from elmo_jax.outputs import HOST, Folder, replacing
from elmo_jax.strict_json import dumps


def test_replacing_refuses_existing_targets_and_inputs_and_keeps_the_old_on_error(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(UserError, match="out.txt already exists: overwrite=True replaces it"):
        with replacing(target):
            pass
    with pytest.raises(UserError, match="is \\(or holds\\) the input"):
        with replacing(target, overwrite=True, inputs=(str(target),)):
            pass
    with pytest.raises(UserError, match="is \\(or holds\\) the input"):  # a folder holding an input
        with replacing(tmp_path, overwrite=True, inputs=(str(target),)):
            pass
    with pytest.raises(RuntimeError, match="crash"):
        with replacing(target, overwrite=True) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with replacing(target, overwrite=True) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "stale.txt").write_text("from another model")
    with replacing(folder, overwrite=True, folder=Folder(("stale.txt", "fresh.txt"), ("stale.txt",))) as tmp:
        tmp.mkdir()
        (tmp / "fresh.txt").write_text("x")
    assert [p.name for p in folder.iterdir()] == ["fresh.txt"]  # an earlier output, replaced whole


def test_a_folder_output_replaces_only_an_earlier_output_and_never_the_working_directory(tmp_path, monkeypatch):
    """`export --output=. --overwrite` in a folder of one's own work deleted all of it."""
    ours = Folder(("options.json", "weights.hdf5", "vocab.txt"), ("options.json", "weights.hdf5"))
    mine = tmp_path / "mine"
    (mine / "proj").mkdir(parents=True)
    (mine / "notes.txt").write_text("my work")
    (mine / "options.json").write_text("an earlier output")
    with pytest.raises(UserError, match=r"holds what this command does not write \(notes.txt, proj\)"):
        with replacing(mine, overwrite=True, folder=ours):
            pytest.fail("refused before any work")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "options.json", "proj"]
    monkeypatch.chdir(mine / "proj")
    for where in (mine / "proj", mine, Path(".")):  # the working directory, or a folder holding it
        with pytest.raises(UserError, match="is \\(or holds\\) the working directory"):
            with replacing(where, overwrite=True, folder=ours):
                pytest.fail("refused before any work")
    empty = tmp_path / "empty"
    empty.mkdir()
    with replacing(empty, folder=ours) as tmp:  # an empty folder is taken as if absent: no overwrite needed
        tmp.mkdir()
        (tmp / "options.json").write_text("{}")
    assert [p.name for p in empty.iterdir()] == ["options.json"]
    lookalike = tmp_path / "lookalike"  # only names an output may hold, but not an output: its own vocab.txt
    lookalike.mkdir()
    (lookalike / "vocab.txt").write_text("my words")
    with pytest.raises(UserError, match=r"holds vocab.txt, which is not an earlier output of this command"):
        with replacing(lookalike, overwrite=True, folder=ours):
            pytest.fail("refused before any work")
    assert (lookalike / "vocab.txt").read_text() == "my words"


@pytest.mark.launches
@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "import", "embed", "vocab", "plot", "plan"])
def test_a_folder_holding_other_files_survives_every_command_with_overwrite(tmp_path, random_model, command):
    """Each command with an output, given a folder of one's own files and --overwrite: one line
    naming the folder, exit 2, every file still there."""
    model = [f"--options={random_model / 'options.json'}", f"--weights={random_model / 'weights.hdf5'}"]
    (tmp_path / "in.txt").write_text("the river bank\n")
    args = {
        "export": ["export", f"--workdir={random_model}"],
        "import": ["import", *model],
        "embed": ["embed", *model, f"--input={tmp_path / 'in.txt'}"],
        "vocab": ["vocab", f"--data=text:{tmp_path / 'in.txt'}"],
        "plot": ["plot", f"--workdir={random_model}"],
        "plan": ["plan", "--config=demo", "--json"],
    }[command]
    mine = tmp_path / "mine"
    (mine / "proj").mkdir(parents=True)
    (mine / "notes.txt").write_text("my work")
    (mine / "options.json").write_text("not an output of this command")
    flag = "--json" if command == "plan" else "--output"
    args = [a for a in args if a != "--json"] + [f"{flag}={mine}", "--overwrite"]
    result = run_cli(args)
    fragment = "holds what this command does not write" if command in ("export", "import") else "is a folder"
    assert_one_line_error(result, 2, f"{flag}={mine}", fragment)
    assert sorted(p.name for p in mine.rglob("*")) == ["notes.txt", "options.json", "proj"]


def test_an_output_in_missing_folders_makes_them_and_a_failed_one_leaves_none(tmp_path):
    """As `train` makes its workdir: `export --output=exported/demo` needs no `mkdir` first."""
    target = tmp_path / "exported" / "nested" / "demo"
    with pytest.raises(RuntimeError, match="crash"):
        with replacing(target) as tmp:
            tmp.mkdir()
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []  # the folders made for it went with it
    with replacing(target) as tmp:
        tmp.mkdir()
        (tmp / "options.json").write_text("{}")
    assert (target / "options.json").read_text() == "{}"
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UserError, match="a_file is a file, not a folder"):
        with replacing(tmp_path / "a_file" / "demo"):
            pass


@pytest.mark.launches
def test_commands_refuse_to_overwrite_their_inputs_and_existing_outputs(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the river bank\nthe money bank\n")
    result = run_cli(["vocab", f"--data=text:{corpus}", f"--output={corpus}", "--overwrite"])
    assert_one_line_error(result, 2, "--output", "corpus.txt", "input")
    result = run_cli(
        ["embed", f"--input={corpus}", f"--output={corpus}", "--options=x.json", "--weights=y.hdf5", "--overwrite"]
    )
    assert_one_line_error(result, 2, "--output", "corpus.txt", "input")
    assert corpus.read_text() == "the river bank\nthe money bank\n"

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("mine\n")
    assert_one_line_error(
        run_cli(["vocab", f"--data=text:{corpus}", f"--output={vocab}"]), 2, "already exists", "--overwrite"
    )
    assert vocab.read_text() == "mine\n"
    assert run_cli(["vocab", f"--data=text:{corpus}", f"--output={vocab}", "--overwrite"]).returncode == 0
    assert vocab.read_text().splitlines()[:4] == ["<S>", "</S>", "<UNK>", "bank"]


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    """options.json + weights.hdf5 of a random biLM with the published CNN (slow enough to kill)."""
    folder = tmp_path_factory.mktemp("model")
    options = tiny_options(64, 16, 8, [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256]])
    (folder / "options.json").write_text(json.dumps(options))
    config = ModelConfig.from_options(options)
    save_weights(
        folder / "weights.hdf5", jax.tree.map(np.asarray, init_params(jax.random.key(0), config, None)), config
    )
    return folder


def _kill_while_writing(args, target, seed: int) -> bool:
    """Starts a command and kills it (-9) soon after its temporary output appears beside
    `target`; whether it was seen (else the command ended first)."""
    proc = start_cli(args)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if list(target.parent.glob(f".{target.name}.tmp-*")):
            time.sleep(random.Random(seed).uniform(0, 0.3))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.005)
    proc.wait()
    return False


@pytest.mark.launches
@pytest.mark.slow
@pytest.mark.parametrize("command", ["embed", "import", "export"])
def test_sigterm_and_sigint_stop_a_writing_command_with_nothing_left_behind(tmp_path, random_model, text_data, command):
    """The status of a process the signal killed (128 + its number), one line saying what
    became of the output, and no temporary beside it (nor the folder made for it); a signal
    that comes once the output is in place changes nothing (exit 0, the output whole)."""
    files = [f"--options={random_model / 'options.json'}", f"--weights={random_model / 'weights.hdf5'}"]
    args = {
        "embed": ["embed", *files, f"--input={tmp_path / 'in.txt'}"],
        "import": ["import", *files],
        "export": ["export", f"--workdir={tmp_path / 'imported'}"],
    }[command]
    (tmp_path / "in.txt").write_text((text_data / "train.txt").read_text() * 10)
    if command == "export":
        assert run_cli(["import", *files, f"--output={tmp_path / 'imported'}"]).returncode == 0
    out = tmp_path / "out" / "target"
    for signum in (signal.SIGTERM, signal.SIGINT):
        for _ in range(10):  # until a signal lands while the output is written
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen(launch_args(*args, f"--output={out}"), cwd=ROOT, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
            deadline = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline:
                if out.parent.is_dir() and list(out.parent.glob(".target.tmp-*")):
                    proc.send_signal(signum)
                    break
                time.sleep(0.002)
            _, stderr = proc.communicate(timeout=120)
            if proc.returncode == 0:  # the signal came after the output was in place
                assert out.exists() and "Traceback" not in stderr, stderr
                shutil.rmtree(out.parent)
                continue
            assert proc.returncode == 128 + signum, stderr
            assert stderr.strip().splitlines() == [
                f"launch.py {command}: stopped by {signal.Signals(signum).name}: removed the unfinished {out}; "
                "earlier outputs are as they were"
            ]
            assert not out.parent.exists()
            break
        else:
            pytest.fail(f"{command} was never stopped while writing")


@pytest.mark.launches
@pytest.mark.slow
def test_kill_9_during_embed_and_export_leaves_the_old_output_or_the_whole_new_one(tmp_path, random_model, text_data):
    model = [f"--options={random_model / 'options.json'}", f"--weights={random_model / 'weights.hdf5'}"]
    src = tmp_path / "in.txt"
    src.write_text((text_data / "train.txt").read_text() * 10)
    out = tmp_path / "out.h5"
    out.write_bytes(b"the old output")
    killed = []
    for seed in range(3):
        killed.append(
            _kill_while_writing(["embed", f"--input={src}", f"--output={out}", "--overwrite", *model], out, seed)
        )
        if out.read_bytes() != b"the old output":
            with h5py.File(out) as f:
                assert len(f) == 2401  # 2,400 lines and sentence_to_index: complete
    assert any(killed)  # at least one kill landed while the output was being written

    imported = tmp_path / "imported"
    assert run_cli(["import", *model, f"--output={imported}"]).returncode == 0
    again = run_cli(["import", *model, f"--output={imported}"])
    assert_one_line_error(again, 2, "already exists", "--overwrite")
    exported = tmp_path / "exported"  # an earlier export, of a model with a vocabulary
    exported.mkdir()
    for name in ("options.json", "weights.hdf5", "vocab.txt"):
        (exported / name).write_text(f"the earlier {name}\n")
    for seed in range(3):
        _kill_while_writing(["export", f"--workdir={imported}", f"--output={exported}", "--overwrite"], exported, seed)
        names = sorted(p.name for p in exported.iterdir())
        assert names in (["options.json", "vocab.txt", "weights.hdf5"], ["options.json", "weights.hdf5"]), names
    result = run_cli(["export", f"--workdir={imported}", f"--output={exported}", "--overwrite"])
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in exported.iterdir()) == ["options.json", "weights.hdf5"]  # no stale vocab.txt
    assert f"exported {imported} to {exported}: options.json, weights.hdf5\n" in result.stdout  # every file written
    assert not list(tmp_path.glob(".exported.*"))  # what the killed exports left is cleared


def test_strict_json_writes_non_finite_numbers_as_null_and_names_them():
    text = dumps({"perplexity": math.inf, "loss": -math.inf, "nested": {"x": math.nan, "y": [1.5, math.nan]}})
    assert strict_json(text) == {
        "perplexity": None,
        "loss": None,
        "nested": {"x": None, "y": [1.5, None]},
        "non_finite": {"perplexity": "inf", "loss": "-inf"},
    }
    assert strict_json(dumps({"tokens": 3, "ppl": 2.5})) == {"tokens": 3, "ppl": 2.5}


def _ended_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.mark.slow
def test_what_ended_processes_left_beside_an_output_is_cleared_by_the_next_writer(tmp_path, caplog):
    """A kill between the two renames of a folder swap leaves the old folder aside and no
    target: it is put back. Temporaries of ended processes go; a live process's stay."""
    caplog.set_level(logging.INFO)
    target, dead, alive = tmp_path / "model", _ended_pid(), os.getppid()
    (tmp_path / f".model.old-{HOST}-{dead}").mkdir()
    (tmp_path / f".model.old-{HOST}-{dead}" / "weights.hdf5").write_text("the old output")
    (tmp_path / f".model.tmp-{HOST}-{dead}").mkdir()  # the new output, complete but not in place
    (tmp_path / f".model.tmp-{dead}").write_text("an older elmo_jax's temporary")
    (tmp_path / f".model.tmp-{HOST}-{alive}").write_text("being written by a live process")
    (tmp_path / f".model.tmp-otherhost-{dead}").write_text("another host's: its process is unknown here")
    with pytest.raises(UserError, match="already exists"):  # put back, so refused without --overwrite
        with replacing(target, folder=Folder(("weights.hdf5",), ("weights.hdf5",))):
            pass
    assert (target / "weights.hdf5").read_text() == "the old output"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model", f".model.tmp-{HOST}-{alive}", f".model.tmp-otherhost-{dead}"]
    )
    assert f"put {target} back" in caplog.text
    removed = f"removed what ended processes left beside {target}: .model.tmp-{dead}, .model.tmp-{HOST}-{dead}\n"
    assert removed in caplog.text
