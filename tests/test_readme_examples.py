"""The Python examples of the README and of docs/DOWNSTREAM.md (up to "Embedding a file") run as
written (on the fixture model instead of the demo workdir, which takes minutes to train, and with
fewer classifier steps)."""

import re

import pytest
from conftest import ROOT

DOWNSTREAM = ("docs/DOWNSTREAM.md", "# ELMo in your JAX model", "## Embedding a file")


def python_blocks(path: str, start: str | None = None, end: str | None = None) -> list[str]:
    text = (ROOT / path).read_text()
    section = text[text.index(start) if start else 0 : text.index(end) if end else len(text)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def run_blocks(blocks: list[str], fixtures_dir, source: str) -> dict:
    namespace: dict = {}
    for block in blocks:  # the fixture model, and 5 training steps instead of 100
        block = block.replace('"workdirs/demo"', repr(str(fixtures_dir / "elmo"))).replace(
            "steps: int = 100", "steps: int = 5"
        )
        exec(compile(block, source, "exec"), namespace)
    return namespace


def test_the_readme_tour_runs(fixtures_dir):
    (block,) = python_blocks("README.md")
    namespace = run_blocks([block], fixtures_dir, "README.md")
    assert namespace["vectors"].shape == (2, 3, 32)  # the fixture model: P = 16


@pytest.mark.slow
def test_the_downstream_examples_run(fixtures_dir, capsys):
    blocks = python_blocks(*DOWNSTREAM)
    assert len(blocks) == 4 and any("class SenseClassifier" in b for b in blocks)
    namespace = run_blocks(blocks, fixtures_dir, DOWNSTREAM[0])
    printed = capsys.readouterr().out
    accuracy = re.search(r"test accuracy: frozen biLM ([\d.]+)%, fine-tuned ([\d.]+)%", printed)
    assert accuracy, printed
    assert namespace["out"]["elmo_representations"][0].shape == (2, 5, 32)
    assert "(3, 7, 32)" in printed  # the Embedder example's shape for the fixture model (P = 16)


@pytest.mark.launches
@pytest.mark.slow
def test_the_readme_tours_commands_run_as_written(tmp_path):
    """The tour's train, eval and embed on a fresh workdir, in a checkout (its sample input);
    the published model's download and plan's compile (minutes) are left to their own tests."""
    from cli import run_cli

    (block,) = re.findall(r"## A tour\n\n```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    commands = [line.split("#")[0].split() for line in block.splitlines() if line.startswith("elmo-jax")]
    ran = 0
    for command in commands:
        if command[1] not in ("train", "eval", "embed") or any(a.startswith("--model=") for a in command):
            continue
        args = [a.replace("/tmp/", f"{tmp_path}/") for a in command[1:]]
        result = run_cli(args)
        assert result.returncode == 0, (command, result.stderr[-2000:])
        ran += 1
    assert ran == 3 and (tmp_path / "layers.h5").is_file()
