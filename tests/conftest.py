"""Shared test set-up: JAX on CPU with 8 devices (to test sharding; code that should use one
sets config.train.devices = 1) compiled without LLVM's optimizations, full float32 matmuls, a
persistent compile cache, freed host memory kept in the process (elmo_jax/host_memory.py, as
the commands do: elmo_jax/commands/process.py), and where the fixtures of the original code are.

`fixtures_dir` is the project's own set, tests/fixtures (made by `make fixtures`: what bilm-tf
and AllenNLP compute, tests/fixtures/README.md). A test that takes `fixture_set` instead runs
on it and on the extra set in ELMO_JAX_FIXTURES (by default a `shared/fixtures` folder beside
the checkout: the fixtures bilm-tf and AllenNLP publish) where there is one; without it those
tests run on the project's set alone, unless ELMO_JAX_REQUIRE_FIXTURES=1 (as .ci/run sets),
which makes its absence an error.

A test that starts a Python process (the command line, a script: each imports JAX and compiles,
seconds) must be marked `launches`, so that `make test-fast` (`-m "not launches and not slow"`)
leaves it out; one that is not marked and starts one fails, naming the marker. (Other programs,
such as those matplotlib and `platform` run once, are let through.)
"""

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The commands' persistent compilation cache ($XDG_CACHE_HOME/elmo_jax) inside the repository.
os.environ["XDG_CACHE_HOME"] = str(Path(__file__).resolve().parent.parent / ".jax_cache" / "xdg")
# The tests' models are tiny, so compiling is most of their time: LLVM at level 0 (instead of 2)
# compiles a train step in about 40% less time; results differ from level 2's by rounding only.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)

from elmo_jax.host_memory import keep_freed_memory  # noqa: E402

keep_freed_memory()  # as the commands do

import jax  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_compilation_cache_dir", str(ROOT / ".jax_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

PROJECT_FIXTURES = ROOT / "tests" / "fixtures"
EXTRA_FIXTURES = Path(os.environ.get("ELMO_JAX_FIXTURES", ROOT.parent / "shared" / "fixtures"))
FIXTURE_FILES = ("elmo/options.json", "bilm-tf/model/options.json", "bilm_tf_training/fixture.hdf5")  # a set has all


def _extra_set() -> Path | None:
    """The extra fixture set, None where there is none: a folder that ELMO_JAX_FIXTURES names
    (or, not set, one beside the checkout) must hold FIXTURE_FILES, and must exist where it is
    named or required."""
    named, required = "ELMO_JAX_FIXTURES" in os.environ, os.environ.get("ELMO_JAX_REQUIRE_FIXTURES") == "1"
    missing = [name for name in FIXTURE_FILES if not (EXTRA_FIXTURES / name).is_file()]
    if not missing:
        return EXTRA_FIXTURES
    if len(missing) == len(FIXTURE_FILES) and not (named or required):
        return None
    why = "ELMO_JAX_REQUIRE_FIXTURES=1 needs one" if required and not named else "ELMO_JAX_FIXTURES names it"
    raise pytest.UsageError(f"no extra fixture set at {EXTRA_FIXTURES} ({why}): it lacks {', '.join(missing)}")


def pytest_configure(config):
    config.extra_fixture_set = _extra_set()  # a UsageError is one line, before any test


def pytest_generate_tests(metafunc):
    """`fixture_set`: the project's fixtures and the extra set where there is one."""
    if "fixture_set" not in metafunc.fixturenames:
        return
    extra = metafunc.config.extra_fixture_set
    sets = {"project": PROJECT_FIXTURES, **({"extra": extra} if extra else {})}
    metafunc.parametrize("fixture_set", list(sets.values()), ids=list(sets), scope="session")


def _is_python(args, executable) -> bool:
    program = os.fsdecode(executable or (args if isinstance(args, (str, bytes, os.PathLike)) else args[0]))
    return program == sys.executable or Path(program.split()[0]).name.startswith(("python", "elmo-jax"))


@pytest.fixture(autouse=True)
def _python_processes_only_where_marked(request, monkeypatch):
    if request.node.get_closest_marker("launches"):
        return
    start = subprocess.Popen._execute_child

    def refuse_python(self, args, executable, *rest):
        if _is_python(args, executable):
            pytest.fail(f"{request.node.nodeid} starts a Python process ({args!r:.80}): mark it launches")
        return start(self, args, executable, *rest)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse_python)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The project's fixtures (tests/fixtures): models in bilm-tf's format and what the original
    code computes from them."""
    return PROJECT_FIXTURES


@pytest.fixture(scope="session")
def text_data(tmp_path_factory) -> Path:
    """A small corpus in LM1B's format: train.txt and heldout.txt of demo sentences."""
    from elmo_jax.text.demo_corpus import DemoCorpus

    folder = tmp_path_factory.mktemp("text")
    corpus = DemoCorpus("train", seed=5, size=300)
    (folder / "train.txt").write_text("\n".join(" ".join(corpus[i]) for i in range(240)) + "\n")
    (folder / "heldout.txt").write_text("\n".join(" ".join(corpus[i]) for i in range(240, 300)) + "\n")
    return folder
