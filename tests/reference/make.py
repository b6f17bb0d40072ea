"""Makes the project's fixtures, tests/fixtures: runs bilm-tf (TensorFlow) and AllenNLP
(PyTorch), each in a side environment of its own built from the package registry
(tests/reference/side_env.py), on small models with seeded random weights, and records what
they compute (tests/fixtures/README.md says what each file holds).

    python -m tests.reference.make [--out=tests/fixtures] [--check]

--check makes them in a scratch folder and compares them with `--out` byte for byte, exiting 1
where any file differs (a rerun writes the same bytes). The first run builds the environments
(minutes, cached under ELMO_JAX_REFERENCE_ENVS, default ~/.cache/elmo_jax/reference-envs).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

from tests.reference import allennlp, bilm_tf

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
MADE = ("elmo", "bilm-tf", "bilm_tf_training", "allennlp")  # the folders of `out` this writes


def make(out: Path) -> None:
    """Writes MADE's folders under `out` (each replaced whole)."""
    bilm_tf.make(out)
    allennlp.make(out / "elmo", out)


def files(folder: Path) -> dict[str, str]:
    """The files of MADE's folders under `folder` -> their sha256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for name in MADE
        for path in sorted((folder / name).rglob("*"))
        if path.is_file()
    }


def check(out: Path) -> int:
    """Makes the fixtures again in a scratch folder; 0 if every file equals out's, else 1."""
    with tempfile.TemporaryDirectory(prefix="elmo-jax-fixtures-") as scratch:
        again = Path(scratch)
        make(again)
        want, got = files(out), files(again)
        differ = sorted(name for name in want.keys() | got.keys() if want.get(name) != got.get(name))
        for name in differ:
            print(f"differs: {name}", file=sys.stderr)
    print(
        f"{len(want)} files, {sum((out / n).stat().st_size for n in want):,} bytes: "
        + ("same" if not differ else f"{len(differ)} differ")
    )
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=FIXTURES, help="where the fixtures are (default tests/fixtures)")
    parser.add_argument("--check", action="store_true", help="make them again elsewhere and compare, byte for byte")
    args = parser.parse_args()
    start = time.time()
    status = check(args.out) if args.check else (make(args.out) or 0)
    print(f"{time.time() - start:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
