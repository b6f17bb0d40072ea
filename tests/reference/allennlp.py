"""AllenNLP's ELMo as a reference: the side environment it runs in, and `make`, which records
what AllenNLP 2.10.1 computes on a model folder into tests/fixtures/allennlp/ (read by
tests/test_allennlp_fixtures.py; the layout is in the README.md written there).

    from tests.reference import allennlp
    allennlp.make(Path("tests/fixtures/elmo"), Path("tests/fixtures"))   # -> tests/fixtures/allennlp/

The environment: torch 2.13.0 built for CPU (PyPI's own Linux wheel would bring some GB of CUDA
libraries, so the wheel comes from PyTorch's CPU index, or from pip's find-links where the machine
keeps a copy: Python 3.11 then, the version of that copy), numpy, h5py and the few small packages
allennlp's import chain needs, then allennlp 2.10.1 without its dependencies. Its heavy optional
imports (transformers, spacy, ...) are answered by placeholders inside the recording script,
tests/reference/allennlp_record.py, which runs only there; nothing of AllenNLP or torch is
imported by the project or its tests.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from tests.reference.side_env import SideEnv

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

ENV = SideEnv(
    name="allennlp",
    requirements=(
        "torch==2.13.0+cpu",
        "numpy==2.4.6",
        "h5py==3.16.0",
        "tqdm==4.70.1",
        "dill==0.4.1",
        "lmdb==3.0.0",
        "base58==2.1.1",
        "more-itertools==11.2.1",
    ),
    no_deps=("allennlp==2.10.1",),
    python=shutil.which("python3.11") or sys.executable,
    index_urls=(TORCH_CPU_INDEX,),
)

RECORDER = Path(__file__).with_name("allennlp_record.py")
FOLDER = "allennlp"  # under `out`


def make(model: Path, out: Path) -> Path:
    """Records AllenNLP's char ids and ELMo outputs for the model folder `model` (options.json,
    lm_weights.hdf5) into out/allennlp/ (replaced whole), and returns that folder. The same
    inputs give byte-identical files."""
    ENV.ensure()
    target = Path(out) / FOLDER
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / FOLDER
        staged.mkdir()
        ENV.run(RECORDER, Path(model).resolve(), staged.resolve(), env={"MKL_NUM_THREADS": "1"})
        shutil.rmtree(target, ignore_errors=True)
        staged.rename(target)
    return target


if __name__ == "__main__":
    print(make(Path(sys.argv[1]), Path(sys.argv[2])))
