"""`elmo_jax.Elmo` and `batch_to_ids` against AllenNLP's `Elmo` and `batch_to_ids`, on the same
weights and sentences.

    bash $SHARED/tools/allennlp/setup_refvenv.sh          # once: /tmp/refvenv
    python -m benchmarks.parity.allennlp_elmo [--reference_python=/tmp/refvenv/bin/python] \\
        [--fixtures=DIR (default: $ELMO_JAX_FIXTURES)]

Runs AllenNLP 2.10.1 in its own venv on the fixture model (`elmo/options.json`,
`lm_weights.hdf5`) and the 30 fixture sentences plus a few awkward tokens (long, multi-byte,
the literal `<S>`), in one batch, for each setting of `do_layer_norm` and
`keep_sentence_boundaries` (a fixed mix, no dropout, a fresh module: zero state). Prints whether
the char ids are equal and the largest difference of each output, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import FIXTURES

MIX = [0.5, -0.25, 1.0]
SETTINGS = [(False, False), (True, False), (False, True), (True, True)]  # (do_layer_norm, keep_sentence_boundaries)

# Run by AllenNLP's Python: argv = fixtures, sentences.json, out.npz.
REFERENCE = """
import json, sys
import numpy as np, torch
from allennlp.modules.elmo import Elmo, batch_to_ids
fixtures, batch, out = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
ids = batch_to_ids(batch)
results = {"ids": ids.numpy()}
for norm, keep in %(settings)r:
    elmo = Elmo(fixtures + "/elmo/options.json", fixtures + "/elmo/lm_weights.hdf5", 1, dropout=0.0,
                do_layer_norm=norm, keep_sentence_boundaries=keep, scalar_mix_parameters=%(mix)r)
    with torch.no_grad():
        got = elmo(ids)
    results[f"elmo_{norm}_{keep}"] = got["elmo_representations"][0].numpy()
    results[f"mask_{norm}_{keep}"] = got["mask"].numpy()
np.savez(out, **results)
""" % {"settings": SETTINGS, "mix": MIX}  # noqa: UP031 (the code has braces)


def sentences(fixtures: Path) -> list[list[str]]:
    groups = json.loads((fixtures / "elmo" / "sentences.json").read_text())
    batch = [s.split() for group in groups for s in group]
    return batch + [["Anbenna", "wrote", "x" * 70, "naïve", "日本語のテキスト" * 3], ["<S>", "a", "</S>"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference_python", default="/tmp/refvenv/bin/python")
    parser.add_argument("--fixtures", default=str(FIXTURES))
    args = parser.parse_args()
    fixtures = Path(args.fixtures).resolve()
    batch = sentences(fixtures)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "batch.json").write_text(json.dumps(batch))
        subprocess.run(
            [args.reference_python, "-c", REFERENCE, str(fixtures), f"{tmp}/batch.json", f"{tmp}/out.npz"], check=True
        )
        reference = dict(np.load(f"{tmp}/out.npz"))

    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    from elmo_jax import Elmo, batch_to_ids

    ids = batch_to_ids(batch)
    report = {"sentences": len(batch), "ids_equal": bool(np.array_equal(ids, reference["ids"]))}
    print(f"char ids {ids.shape}: {'equal' if report['ids_equal'] else 'DIFFERENT'}")
    for norm, keep in SETTINGS:
        elmo = Elmo(
            fixtures / "elmo", dropout=0.0, do_layer_norm=norm, keep_sentence_boundaries=keep, scalar_mix_parameters=MIX
        )
        out = elmo(ids)
        name = f"do_layer_norm={norm}, keep_sentence_boundaries={keep}"
        assert np.array_equal(np.asarray(out["mask"]), reference[f"mask_{norm}_{keep}"].astype(bool)), name
        diff = float(np.abs(np.asarray(out["elmo"]) - reference[f"elmo_{norm}_{keep}"]).max())
        report[f"max_abs_diff[{name}]"] = diff
        print(f"{name}: masks equal, max |difference| {diff:.2e}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
