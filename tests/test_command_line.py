"""The command line as a user meets it: the installed `elmo-jax` command and `python -m elmo_jax`
from any folder, help on every command, one flag spelling, and one-line errors with the usage."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli import ROOT, assert_one_line_error, launch_args, run_cli, strict_json
from test_training_run import TINY_FLAGS

from elmo_jax import settings
from elmo_jax.commands import COMMANDS
from elmo_jax.commands.flags import COMMON_FLAGS

ELMO_JAX = Path(sys.executable).parent / "elmo-jax"  # the console script pip installs beside python


@pytest.mark.launches
def test_help_lists_the_commands_and_every_flag_of_each():
    top = run_cli(["--help"])
    assert top.returncode == 0 and top.stdout.startswith("usage: launch.py COMMAND")
    assert all(f"  {name} " in top.stdout for name in COMMANDS)
    for name, command in COMMANDS.items():
        shown = run_cli([name, "--help"])
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(f"usage: launch.py {name} "), shown.stdout
        for flag in command.flags + COMMON_FLAGS:
            assert f"--{flag} " in shown.stdout or f"--[no]{flag} " in shown.stdout, (name, flag)
        others = {f for c in COMMANDS.values() for f in c.flags} - set(command.flags)
        assert not [f for f in others if f"  --{f} " in shown.stdout or f"--[no]{f} " in shown.stdout], name
    train_help = run_cli(["train", "--help"]).stdout
    assert "packaged experiments: cpu_peer, demo," in train_help
    for section, declared in settings.SECTIONS.items():  # every setting, its value in the base recipe
        for name, value in {k: v for cls in declared for k, v in settings.defaults(cls).items()}.items():
            assert f"  {section}.{name}={json.dumps(value)} " in train_help, (section, name)


@pytest.mark.parametrize(
    "args, fragments",
    [
        ([], ["launch.py: no command", "usage: launch.py COMMAND"]),
        (["trian"], ["unknown command 'trian'", "train"]),
        (["train", "--workdir=w"], ["launch.py train: --config required", "usage: launch.py train --config="]),
        (["import", "--options=o"], ["--output required", "usage: launch.py import"]),
        (["import", "--options=o", "--output=x"], ["give one model: --model=NAME|URL | --options=FILE --weights"]),
        (["embed", "--input=i", "--output=o", "--workdir=w", "--model=small"], ["give one model: --workdir=DIR |"]),
        (["vocab", "--data=demo", "--min-count=3", "--output=v"], ["--min-count: flags are spelled", "--min_count"]),
        (["eval", "--workdir=w", "--max-sentences", "5"], ["--max_sentences"]),
        (["export", "--workdir=w", "--out=o"], ["--out is now --output"]),
        (["train", "--config=demo", "--workdir=w", "--layers=top"], ["--layers is not a flag of train"]),
        (["eval", "--workdir=w", "--config.train.seed=1"], ["--config.train.seed is not a flag of eval"]),
        (["embed", "--input=i", "--output=o", "--nostateful", "--config=demo"], ["--config is not a flag of embed"]),
        (["train", "--config=nosuch", "--workdir=w"], ["--config=nosuch: not a packaged experiment", "demo"]),
        (
            ["train", "--config=demo", "--workdir=w", "--config.train.learning_rat=1"],
            ["--config.train.learning_rat: unknown config key, did you mean --config.train.learning_rate?"],
        ),
        (
            ["train", "--config=demo", "--workdir=w", "--config.train.nope=1"],
            ["--config.train.nope: unknown config key (every key: launch.py train --help)"],
        ),
        (
            ["embed", "--model=smal", "--input=README.md", "--output=nowhere/out.h5"],
            ["model folder not found: smal", "(small, medium, original, original_5.5b): did you mean small?"],
        ),
        (["plot", "--workdir=w", "--nosuchflag=1"], ["Unknown command line flag 'nosuchflag'"]),
        (["plot", "--workdir=w", "extra"], ["unexpected arguments extra", "usage: launch.py plot"]),
        (["plan", "--config=demo", "--target=v5e", "--devices=3"], ["--devices=3: v5e slices here have [1, 4, 8]"]),
    ],
)
@pytest.mark.launches
def test_bad_command_lines_are_one_line_with_the_usage_and_exit_2(args, fragments):
    assert_one_line_error(run_cli(args), 2, *fragments)


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.launches
@pytest.mark.slow
@pytest.mark.skipif(not ELMO_JAX.is_file(), reason=f"elmo_jax is not installed ({ELMO_JAX} not found)")
def test_installed_command_trains_a_packaged_experiment_from_any_folder(tmp_path, text_data):
    pytest.importorskip("matplotlib")
    workdir = tmp_path / "demo"  # a folder named like the experiment: --config=demo is still the experiment
    workdir.mkdir()
    data = [
        f"--config.data.train=text:{text_data / 'train.txt'}",
        f"--config.data.heldout=text:{text_data / 'heldout.txt'}",
    ]
    steps = ["--config.train.max_steps=6", "--config.train.checkpoint_every=3"]
    command = [str(ELMO_JAX), "train", "--config=demo", "--workdir=demo", "--nocompile_cache", *steps, *data]
    train = _run([*command, *TINY_FLAGS], tmp_path)
    assert "compiled jit(train_step) in " in train.stdout  # compiles are logged with their time
    assert (workdir / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn at the end
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        strict_json(line)
    environment = strict_json((workdir / "config.json").read_text())["environment"]
    assert environment["packages"]["jax"] and environment["device_kind"] == "cpu"
    assert environment["git_commit"] is None or len(environment["git_commit"].split("-")[0]) == 40

    evaluated = _run([sys.executable, "-m", "elmo_jax", "eval", f"--workdir={workdir}"], tmp_path)
    result = strict_json(evaluated.stdout.strip().splitlines()[-1])
    final = strict_json(train.stdout.strip().splitlines()[-1])
    assert result["step"] == 6 and result["perplexity"] == pytest.approx(final["perplexity"], rel=1e-6)

    picture = tmp_path / "curves.png"
    _run([sys.executable, "-m", "elmo_jax", "plot", f"--workdir={workdir}", f"--output={picture}"], cwd=tmp_path)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_one_line_error(run_cli(["plot", f"--workdir={workdir}", f"--output={picture}"]), 2, "already exists")
    drawn = (workdir / "training_curves.png").read_bytes()  # the default output, drawn by training, is no exception
    assert_one_line_error(run_cli(["plot", f"--workdir={workdir}"]), 2, "training_curves.png already exists")
    assert (workdir / "training_curves.png").read_bytes() == drawn
    assert run_cli(["plot", f"--workdir={workdir}", "--overwrite"]).returncode == 0


@pytest.mark.launches
def test_the_wheel_holds_the_package_and_the_experiments(tmp_path):
    """What `pip install .` installs: every module of elmo_jax, the experiments, the command."""
    import importlib.util
    import zipfile

    if importlib.util.find_spec("pip") is None:
        pytest.skip("no pip in this environment (a uv venv) to build the wheel with")
    wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)]
    built = subprocess.run(wheel, capture_output=True, text=True)  # builds as `pip install .` does
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {str(p.relative_to(ROOT)) for p in (ROOT / "elmo_jax").rglob("*.py")}
    assert source <= names, source - names
    experiments = {f"elmo_jax/experiments/{p.name}" for p in (ROOT / "experiments").glob("*.py")}
    assert experiments <= names and "elmo_jax/experiments/demo.py" in experiments
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "elmo-jax = elmo_jax.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


EXITING = """
import atexit, sys, threading, time, types
from elmo_jax.commands.process import run_command
out = sys.argv[1]

def main(flags):
    atexit.register(lambda: open(out + ".atexit", "w").close())
    if sys.argv[2] == "thread":  # still working when the command returns: joined, not cut off
        threading.Thread(target=lambda: (time.sleep(0.5), open(out + ".thread", "w").close())).start()
    print("a line without its end", end="")

flags = types.SimpleNamespace(compile_cache=False, coordinator=None, num_processes=None, process_id=None, verbose=False)
run_command("probe", main, flags)
"""


@pytest.mark.launches
@pytest.mark.parametrize("thread", ["none", "thread"])
def test_a_finished_command_exits_0_with_its_output_and_exit_handlers(tmp_path, thread):
    """A command's end skips the interpreter's teardown (process.py); what it writes, its atexit
    handlers and a thread still running must not be lost to that."""
    out = tmp_path / "probe"
    done = subprocess.run([sys.executable, "-c", EXITING, str(out), thread], capture_output=True, text=True, cwd=ROOT)
    assert (done.returncode, done.stdout) == (0, "a line without its end"), done.stderr[-2000:]
    assert (out.with_suffix(".atexit")).exists() and (out.with_suffix(".thread")).exists() == (thread == "thread")


def test_jax_is_kept_to_the_cpu_only_where_no_accelerator_is_attached(tmp_path):
    from elmo_jax.platforms import cpu_unless_accelerated

    dev = tmp_path / "dev"
    (dev / "vfio").mkdir(parents=True)
    (dev / "vfio" / "vfio").touch()  # the VFIO control file alone: no TPU
    environ = {}
    cpu_unless_accelerated(environ, dev)
    assert environ == {"JAX_PLATFORMS": "cpu"}
    environ = {"JAX_PLATFORMS": "cuda"}  # the user's choice stands
    cpu_unless_accelerated(environ, dev)
    assert environ == {"JAX_PLATFORMS": "cuda"}
    for attached in ("nvidia0", "accel0", "vfio/0", "kfd"):
        (dev / attached).touch()
        environ = {}
        cpu_unless_accelerated(environ, dev)
        assert environ == {}, attached
        (dev / attached).unlink()


@pytest.mark.launches
def test_a_command_without_accelerators_is_quiet_whatever_plugins_are_installed(tmp_path, fixtures_dir):
    """The plan extra installs JAX's CUDA plugin and libtpu; on a machine with neither a GPU nor
    a TPU they must not probe for one and print their tracebacks (cuDNN, TPU worker hostnames)
    around every command's output. JAX_PLATFORMS is unset here, as a user's shell has it."""
    import importlib.util

    from elmo_jax.platforms import accelerator_attached

    if accelerator_attached():
        pytest.skip("an accelerator is attached: its plugin is meant to start")
    if not [name for name in ("jax_cuda12_plugin", "libtpu") if importlib.util.find_spec(name)]:
        pytest.skip("no accelerator plugin installed (the plan extra): nothing to keep quiet")
    (tmp_path / "in.txt").write_text("The river bank .\n")
    model = fixtures_dir / "elmo"
    args = ["embed", f"--options={model / 'options.json'}", f"--weights={model / 'lm_weights.hdf5'}"]
    args += [f"--input={tmp_path / 'in.txt'}", f"--output={tmp_path / 'out.h5'}"]
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    result = subprocess.run(launch_args(*args), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    for noise in ("cuDNN", "CUDA", "TPU", "Traceback", "plugin"):
        assert noise not in result.stderr + result.stdout, result.stderr + result.stdout


LIBRARY = """
import os, sys
from elmo_jax import Elmo, batch_to_ids
elmo = Elmo(sys.argv[1], num_output_representations=1, dropout=0.0)
out = elmo(batch_to_ids([["The", "river", "bank"]]))
print(out["elmo_representations"][0].shape, os.environ.get("JAX_PLATFORMS"))
"""


@pytest.mark.launches
def test_the_library_is_quiet_too_and_leaves_the_environment_alone(tmp_path, fixtures_dir):
    """The README's snippet, from Python, with the plan extra's plugins installed: it printed 26
    lines of cuDNN and libtpu errors. JAX's own config keeps it to the CPU; JAX_PLATFORMS stays
    unset for the processes the user starts."""
    import importlib.util

    from elmo_jax.platforms import accelerator_attached

    if accelerator_attached():
        pytest.skip("an accelerator is attached: its plugin is meant to start")
    if not [name for name in ("jax_cuda12_plugin", "libtpu") if importlib.util.find_spec(name)]:
        pytest.skip("no accelerator plugin installed (the plan extra): nothing to keep quiet")
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    result = subprocess.run([sys.executable, "-c", LIBRARY, str(fixtures_dir / "elmo")], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "(1, 3, 32) None\n" and result.stderr == "", result.stderr


@pytest.mark.launches
@pytest.mark.parametrize("args", [["--help"], ["embed", "--help"], ["vocab", "--data=text:{corpus}", "--output={out}"]])
def test_a_closed_pipe_ends_a_command_quietly(tmp_path, args):
    """`elmo-jax --help | head -1` printed a 20-line BrokenPipeError traceback."""
    (tmp_path / "corpus.txt").write_text("the river bank\n" * 100)
    args = [a.format(corpus=tmp_path / "corpus.txt", out=tmp_path / "vocab.txt") for a in args]
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    proc = subprocess.Popen(launch_args(*args), stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    os.close(write)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGPIPE and stderr == "", stderr


@pytest.mark.launches
def test_embed_of_a_text_without_words_is_refused_before_the_model_loads(tmp_path):
    """It wrote an HDF5 of no sentences and exited 0."""
    for name, text in (("empty.txt", ""), ("blank.txt", "\n  \n\t\n")):
        (tmp_path / name).write_text(text)
        args = ["embed", f"--input={tmp_path / name}", f"--output={tmp_path / 'out.h5'}", "--model=nowhere"]
        assert_one_line_error(run_cli(args), 2, f"--input={tmp_path / name} has no words", "nothing to embed")
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.launches
def test_a_start_that_fails_is_one_line_and_leaves_no_workdir(tmp_path):
    """Neither the config (printed once the run starts) nor a workdir holding only train.lock."""
    for override, fragment in [
        ("--config.data.train=text:/nonexistent/train-*.txt", "no file matches /nonexistent/train-*.txt"),
        ("--config.train.dropout=1.5", "config.train.dropout=1.5: must be in [0, 1)"),
    ]:
        workdir = tmp_path / "runs" / "demo"
        assert_one_line_error(run_cli(["train", "--config=demo", f"--workdir={workdir}", override]), 2, fragment)
        assert not (tmp_path / "runs").exists()


@pytest.mark.launches
def test_eval_of_a_model_folder_says_it_has_no_softmax_to_score(fixtures_dir):
    result = run_cli(["eval", f"--workdir={fixtures_dir / 'elmo'}"])
    assert_one_line_error(result, 2, "is a model folder", "no run config, checkpoint or softmax", "init_from")


def _integer_flags() -> list[tuple[str, str, int]]:
    """(command, flag, a value below its bound) for every integer flag of every command."""
    from absl import flags

    from elmo_jax.commands.flags import FLAGS

    cases = []
    for name, command in COMMANDS.items():
        for flag in command.flags + COMMON_FLAGS:
            if isinstance(FLAGS[flag].parser, flags.IntegerParser):
                cases.append((name, flag, FLAGS[flag].parser.lower_bound - 1))
    return cases


def test_every_integer_flag_has_a_lower_bound():
    from absl import flags

    from elmo_jax.commands.flags import FLAGS

    names = set(COMMON_FLAGS) | {f for c in COMMANDS.values() for f in c.flags}
    integers = [n for n in names if isinstance(FLAGS[n].parser, flags.IntegerParser)]
    assert integers and not [n for n in integers if FLAGS[n].parser.lower_bound is None]


@pytest.mark.launches
def test_a_flag_out_of_range_is_one_line_naming_it_before_any_work():
    """Every command, every integer flag: 0 devices, 0 rows, a negative shard... refused as
    the flags are read, before a file is opened or a model loaded (a required flag missing too)."""
    for command, flag, bad in _integer_flags():
        result = run_cli([command, f"--{flag}={bad}"])
        assert_one_line_error(result, 2, f"--{flag}={bad}")
