"""Makes the project's fixtures, tests/fixtures: runs bilm-tf (TensorFlow), AllenNLP (PyTorch)
and ELMoForManyLangs (PyTorch), each in a side environment of its own built from the package
registry (tests/reference/side_env.py), on small models with seeded random weights, and records
what they compute (tests/fixtures/README.md says what each file holds).

    python -m tests.reference.make [--out=tests/fixtures] [--check]

Everything is made in a scratch folder beside `--out` first; only when all of it is made are
`--out`'s folders (MADE) replaced by the new ones, so a failure leaves them as they were.
--check makes them the same way and compares them with `--out` byte for byte instead, exiting 1
where any file differs (a rerun writes the same bytes). The first run builds the environments
(minutes, cached under ELMO_JAX_REFERENCE_ENVS, default ~/.cache/elmo_jax/reference-envs).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.reference import allennlp, bilm_tf, efml

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
MADE = ("elmo", "bilm-tf", "bilm_tf_training", "allennlp", "efml", "torch_state")  # the folders of `out` this writes


@contextlib.contextmanager
def built(out: Path) -> Iterator[Path]:
    """Makes MADE's folders in a scratch folder beside `out` (same file system: they move in by
    renaming) and yields it; the scratch folder is removed afterwards, whatever happened."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-making-", dir=out.parent) as scratch:
        made = Path(scratch) / "made"
        made.mkdir()
        bilm_tf.make(made)
        allennlp.make(made / "elmo", made)
        efml.make(made)
        efml.ENV.run(HERE / "torch_state_files.py", made / "torch_state")  # torch's own files, in its environment
        yield made


def make(out: Path) -> None:
    """Replaces MADE's folders under `out` with ones made afresh, once all are made."""
    with built(out) as made:
        out.mkdir(exist_ok=True)
        old = made.parent / "old"
        old.mkdir()
        for name in MADE:
            if (out / name).exists():
                (out / name).rename(old / name)
            (made / name).rename(out / name)
    print(f"written to {out}", flush=True)


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
    with built(out) as made:
        want, got = files(out), files(made)
    differ = sorted(name for name in want.keys() | got.keys() if want.get(name) != got.get(name))
    for name in differ:
        print(f"differs: {name}", file=sys.stderr)
    size = sum((out / n).stat().st_size for n in want)
    print(f"fixtures-check: {len(want)} files, {size:,} bytes: " + ("same" if not differ else f"{len(differ)} differ"))
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=FIXTURES, help="where the fixtures are (default tests/fixtures)")
    parser.add_argument("--check", action="store_true", help="make them again elsewhere and compare, byte for byte")
    args = parser.parse_args()
    start = time.time()
    out = args.out.resolve()
    status = check(out) if args.check else (make(out) or 0)
    print(f"took {time.time() - start:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
