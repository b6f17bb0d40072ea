"""Every command the docs name exists, with the flags they give it: `elmo-jax` commands (and
`python -m elmo_jax`, `launch.py`) and their flags and `--config.SECTION.NAME` settings (their
--help: tests/test_command_line.py), the benchmarks' modules and their flags (each run with
--help), make targets and scripts. The reference docs only (README,
docs/, benchmarks/README.md): docs/archive/ keeps commands as they were run on the day."""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from elmo_jax import settings
from elmo_jax.commands import COMMANDS
from elmo_jax.commands.flags import COMMON_FLAGS

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Fenced blocks, inline spans (which may wrap a line) and indented blocks (4 spaces after a blank line).
_CODE = re.compile(r"```[\w-]*\n(.*?)```|`([^`\n]+(?:\n[^`\n]+)*)`|(?:^|\n)\n((?: {4}.*(?:\n|$))+)", re.S)
_ELMO_JAX = re.compile(r"(?:elmo-jax|python3? -m elmo_jax|python3? launch\.py)\s+([a-z_]+)(.*)")
_BENCHMARK = re.compile(r"python3? -m (benchmarks(?:\.\w+)+)(.*)")
_MAKE = re.compile(r"\bmake ([a-z][\w-]*)")
_SCRIPT = re.compile(r"\bbash ((?:benchmarks|\.ci)/[\w./-]+)")
_FLAG = re.compile(r"(?<![\w-])--([a-z][\w.]*)")


def _snippets(path: Path) -> list[str]:
    """The doc's code: each line of its code blocks (continuations joined) and each inline span."""
    out = []
    for fenced, span, indented in _CODE.findall(path.read_text()):
        block = fenced or indented
        out += block.replace("\\\n", " ").splitlines() if block else [span.replace("\n", " ")]
    return [re.split(r"\s(?:&&|\||;|#)\s", s)[0] for s in out]


@functools.cache
def _named(pattern: re.Pattern) -> list[tuple[str, tuple[str, ...]]]:
    """(doc, the match's groups) of every command `pattern` finds in the docs."""
    return [
        (p.relative_to(ROOT).as_posix(), m.groups()) for p in DOCS for s in _snippets(p) for m in pattern.finditer(s)
    ]


def _setting(key: str) -> bool:
    section, _, name = key.partition(".")
    if section == "model":
        return True  # options.json's fields (the model's sizes), read by ModelConfig.from_options
    return any(name in settings.names(cls) for cls in settings.SECTIONS.get(section, ()))


def test_the_docs_name_commands_at_all():
    assert len(_named(_ELMO_JAX)) > 20 and len(_named(_BENCHMARK)) > 10 and _named(_MAKE) and _named(_SCRIPT)


@pytest.mark.parametrize("doc, command", sorted({(d, g[0]) for d, g in _named(_ELMO_JAX)}))
def test_each_elmo_jax_command_a_doc_names_exists_with_its_flags(doc, command):
    assert command in COMMANDS, f"{doc}: elmo-jax {command}: no such command"
    flags = set(COMMANDS[command].flags) | set(COMMON_FLAGS) | {"help"}
    for d, (name, rest) in _named(_ELMO_JAX):
        if (d, name) != (doc, command):
            continue
        for flag in _FLAG.findall(rest):
            if flag.startswith("config."):
                assert command in ("train", "plan") and _setting(flag[len("config.") :]), f"{doc}: {command} --{flag}"
            else:
                assert flag in flags or (flag.startswith("no") and flag[2:] in flags), f"{doc}: {command} --{flag}"


@pytest.mark.parametrize("doc, module", sorted({(d, g[0]) for d, g in _named(_BENCHMARK)}))
def test_each_benchmark_a_doc_names_exists_with_its_flags(doc, module):
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{doc}: python -m {module}: no such module"
    source = Path(spec.origin).read_text()
    for d, (name, rest) in _named(_BENCHMARK):
        if (d, name) == (doc, module):
            for flag in _FLAG.findall(rest):
                assert f'"--{flag}"' in source, f"{doc}: python -m {module} --{flag}: no such flag"


@pytest.mark.launches
@pytest.mark.parametrize("module", sorted({g[0] for _, g in _named(_BENCHMARK)}))
def test_each_benchmark_a_doc_names_runs_its_help_with_the_flags_the_docs_give(module):
    shown = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("usage:"), shown.stderr[-2000:]
    for doc, (name, rest) in _named(_BENCHMARK):
        for flag in _FLAG.findall(rest) if name == module else ():
            assert f"--{flag}" in shown.stdout, f"{doc}: python -m {module} --{flag}: not in its --help"


def test_each_make_target_and_script_a_doc_names_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    for doc, (target,) in _named(_MAKE):
        assert target in targets, f"{doc}: make {target}: no such target"
    for doc, (script,) in _named(_SCRIPT):
        assert (ROOT / script).is_file(), f"{doc}: bash {script}: no such file"
