"""Figures in the reference docs (README, docs/, benchmarks/README.md; docs/archive/ records the
day's figures as they were) cannot drift: a measured figure (a perplexity to 2 decimals or more, a
time, a rate, a size) sits in a section that names the date, the commit and the command it came
from, and the figures the code can give today are computed here and compared."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHARED_DATA = ROOT.parent / "shared" / "data"

# A measurement: a perplexity to 2 decimals or more, a duration, a rate, a size in bytes.
MEASURED = re.compile(
    r"perplexity (?:of |ended at |is )?\**\d+\.\d{2,}"
    r"|(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:ms|s|seconds|min|minutes|hours?)\b(?!-)"
    r"|\d[\d,.]*[kM]? tokens/s|\d[\d,.]* [GMT]B\b"
)
PROVENANCE = (re.compile(r"20\d\d-\d\d-\d\d"), re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"), re.compile(r"`[^`]+`"))
CODE = re.compile(r"```.*?```", re.S)


def _sections(path: Path) -> list[tuple[str, str]]:
    """(heading, text) of each section (a heading of any level and what follows, to the next; a
    comment in a code block is no heading)."""
    text = CODE.sub(lambda m: m.group(0).replace("\n#", "\n "), path.read_text())
    parts = re.split(r"(?m)^(#{1,4} .*)$", text)
    return [("(top)", parts[0])] + list(zip(parts[1::2], parts[2::2]))


def _unsourced() -> list[str]:
    out = []
    for path in DOCS:
        for heading, body in _sections(path):
            found = MEASURED.findall(body)
            if found and not all(p.search(heading + body) for p in PROVENANCE):
                out.append(f"{path.relative_to(ROOT)} {heading.strip()}: {found[:4]}")
    return out


def test_every_measured_figure_names_its_date_commit_and_command():
    """A section with a measured figure names, somewhere in it, the date (YYYY-MM-DD), the commit
    and the command (in backticks) it came from."""
    assert _unsourced() == []


def test_the_check_finds_a_figure_without_its_source(tmp_path, monkeypatch):
    doc = tmp_path / "doc.md"
    doc.write_text("## A run\n\nIt took 3 min 2 s.\n\n## Another (2026-12-06, 576d3d1, `make demo`)\n\n12.5 GB.\n")
    monkeypatch.setattr(f"{__name__}.DOCS", [doc])
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert _unsourced() == ["doc.md ## A run: ['3 min', '2 s']"]


def _text(path: str) -> str:
    """The doc's words, each run of white space one space (lines wrap anywhere)."""
    return " ".join((ROOT / path).read_text().split())


def test_the_demo_corpus_figures_are_what_the_code_gives():
    """The demo corpus's floor, sizes and run length, as the docs state them."""
    import math

    from elmo_jax.experiments import demo

    from elmo_jax.text.batcher import StreamBatcher
    from elmo_jax.text.demo_corpus import DemoCorpus, grammar
    from elmo_jax.text.vocab import build_vocabulary

    floor = f"{grammar().floor_perplexity:.2f}"
    assert f"best possible perplexity ({floor})" in _text("README.md")
    training = _text("docs/TRAINING.md")
    assert f"*floor*, is {floor} per predicted token" in training
    train, heldout = DemoCorpus("train"), DemoCorpus("heldout")
    vocab, stats = build_vocabulary(train.stream())
    assert f"over the built-in corpus's {len(train):,} training sentences" in training
    assert f"{len(grammar().words):,} distinct words" in training
    config = demo.get_config()
    t = config.train
    batcher = StreamBatcher(train, vocab, t.per_device_batch_size, t.unroll_steps, seed=t.seed)
    steps = math.ceil(t.n_epochs * batcher.steps_per_epoch())
    assert f"({steps:,} steps of {t.per_device_batch_size} x {t.unroll_steps})" in training
    positions = sum(len(s) + 1 for s in heldout.stream())
    assert f"over {positions} tokens (floor {floor})" in training
    assert stats["vocabulary"] == len(grammar().words) + 3


@pytest.mark.skipif(not (SHARED_DATA / "fortunes").is_dir(), reason=f"no real text at {SHARED_DATA / 'fortunes'}")
def test_the_real_texts_figures_are_what_the_code_gives():
    """Debian's fortunes, the real English text of the comparisons: its lines, words and
    vocabulary as the docs state them (the training text's words were given as 504,326 in one
    doc and 504,348 in another)."""
    from elmo_jax.text.sources import open_corpus
    from elmo_jax.text.vocab import build_vocabulary

    fortunes = SHARED_DATA / "fortunes"
    train = open_corpus(f"text:{fortunes / 'train.txt'}", "train")
    heldout = list(open_corpus(f"text:{fortunes / 'heldout.txt'}", "heldout").stream())
    vocab, stats = build_vocabulary(train.stream())
    words, held_words = stats["tokens"], sum(map(len, heldout))
    assert f"{words:,} training tokens, a {len(vocab):,}-word vocabulary, {held_words:,} held-out tokens" in _text(
        "docs/TRAINING.md"
    )
    comparison = _text("docs/BILM_TF_COMPARISON.md")
    lines = sum(1 for line in (fortunes / "train.txt").read_text().splitlines() if line.strip())
    assert f"{lines:,} lines, {words:,} training words, a {len(vocab):,}-word vocabulary" in comparison
    assert f"{held_words:,} held-out words, {held_words + len(heldout):,} positions" in comparison
