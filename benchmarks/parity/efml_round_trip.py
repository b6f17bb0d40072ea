"""An ELMoForManyLangs model fine-tuned here and exported, read back by their own code: `train
--config.train.init_from=FOLDER` for a few steps on a text, `export` of the run (their folder),
then their `Embedder(export).sents2elmo(sentences, -2)` in its own environment
(tests/reference/efml.py: built from the package registry on first use, cached) against ours on
the run's workdir. Prints a markdown table and a JSON line.

    python -m benchmarks.parity.efml_round_trip --train=TEXT --out=runs/efml [--model=FOLDER] [--steps=20]

--model defaults to the fixture model with a word embedding (tests/fixtures/efml/cnn_word_elmo);
the sentences are the fixtures' awkward ones and the first 20 lines of the text.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT
from elmo_jax.efml_embed import EfmlEmbedder
from elmo_jax.model_io import export_model, load_model
from tests.reference import efml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, help="the text to fine-tune on, one sentence a line")
    parser.add_argument("--out", required=True, help="a folder for the run and the export (replaced)")
    parser.add_argument("--model", default=str(ROOT / "tests" / "fixtures" / "efml" / "cnn_word_elmo"))
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    flags = [f"--config.data.train=text:{args.train}", f"--config.train.init_from={args.model}"]
    flags += [f"--config.train.max_steps={args.steps}", "--config.train.sample_softmax=false"]
    flags += ["--config.train.per_device_batch_size=8", "--config.data.heldout="]
    subprocess.run(
        [sys.executable, "-m", "elmo_jax", "train", "--config=demo", f"--workdir={out / 'run'}", *flags], check=True
    )
    export_model(load_model(out / "run"), out / "exported")
    record = json.loads((ROOT / "tests" / "fixtures" / "efml" / "sentences.json").read_text(encoding="utf-8"))
    lines = [line.split() for line in Path(args.train).read_text(encoding="utf-8").splitlines()[:20]]
    sentences = record["sentences"] + [s for s in lines if s]
    ours = EfmlEmbedder(out / "run").sents2elmo(sentences, -2)
    theirs = efml.embed(out / "exported", sentences)
    original = EfmlEmbedder(args.model).sents2elmo(sentences, -2)
    result = {
        "steps": args.steps,
        "sentences": len(sentences),
        "max_abs_ours_vs_theirs": max(float(np.abs(a - b).max(initial=0.0)) for a, b in zip(ours, theirs)),
        "max_abs_moved_from_the_model": max(float(np.abs(a - b).max(initial=0.0)) for a, b in zip(ours, original)),
    }
    print("| steps | sentences | max abs, ours (workdir) vs their Embedder (export) | max abs moved by fine-tuning |")
    print("|---|---|---|---|")
    print(f"| {args.steps} | {len(sentences)} | {result['max_abs_ours_vs_theirs']:.2e} | "
          f"{result['max_abs_moved_from_the_model']:.3g} |")  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
