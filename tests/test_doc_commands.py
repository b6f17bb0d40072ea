"""Every command the docs name exists, with the flags they give it: `elmo-jax` commands (and
`python -m elmo_jax`, `launch.py`) and their flags and `--config.SECTION.NAME` settings, the
benchmarks' modules and their flags, make targets and scripts. The reference docs only (README,
docs/, benchmarks/README.md): docs/archive/ keeps commands as they were run on the day."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from elmo_jax import settings
from elmo_jax.commands import COMMANDS
from elmo_jax.commands.flags import COMMON_FLAGS

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_CODE = re.compile(r"```(?:bash|sh|console)?\n(.*?)```|`([^`\n]+)`", re.S)
_ELMO_JAX = re.compile(r"(?:elmo-jax|python3? -m elmo_jax|python3? launch\.py)\s+([a-z_]+)(.*)")
_BENCHMARK = re.compile(r"python3? -m (benchmarks(?:\.\w+)+)(.*)")
_MAKE = re.compile(r"\bmake ([a-z][\w-]*)")
_SCRIPT = re.compile(r"\bbash ((?:benchmarks|\.ci)/[\w./-]+)")
_FLAG = re.compile(r"(?<![\w-])--([a-z][\w.]*)")


def _snippets(path: Path) -> list[str]:
    """The doc's code: each line of its code blocks (continuations joined) and each inline span."""
    out = []
    for block, span in _CODE.findall(path.read_text()):
        out += block.replace("\\\n", " ").splitlines() if block else [span]
    return [re.split(r"\s(?:&&|\||;|#)\s", s)[0] for s in out]


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


def test_each_make_target_and_script_a_doc_names_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    for doc, (target,) in _named(_MAKE):
        assert target in targets, f"{doc}: make {target}: no such target"
    for doc, (script,) in _named(_SCRIPT):
        assert (ROOT / script).is_file(), f"{doc}: bash {script}: no such file"
