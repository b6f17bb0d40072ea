"""The README's Python examples for downstream use run as written (on the fixture model instead
of the demo workdir, which takes minutes to train, and with fewer classifier steps)."""

import re

from conftest import ROOT

SECTION = ("## ELMo in your JAX model", "### Embedding a file")


def readme_python_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(SECTION[0]) : readme.index(SECTION[1])]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_the_downstream_examples_run(fixtures_dir, capsys):
    blocks = readme_python_blocks()
    assert len(blocks) == 4 and any("class SenseClassifier" in b for b in blocks)
    namespace: dict = {}
    for block in blocks:  # the fixture model, and 5 training steps instead of 100
        block = block.replace('"workdirs/demo"', repr(str(fixtures_dir / "elmo"))).replace(
            "steps: int = 100", "steps: int = 5"
        )
        exec(compile(block, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out
    accuracy = re.search(r"test accuracy: frozen biLM ([\d.]+)%, fine-tuned ([\d.]+)%", printed)
    assert accuracy, printed
    assert namespace["out"]["elmo_representations"][0].shape == (2, 5, 32)
    assert "(3, 7, 32)" in printed  # the Embedder example's shape for the fixture model (P = 16)
