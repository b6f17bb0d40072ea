"""The AllenNLP half of the fixture generator: `make(model, out)` records what AllenNLP 2.10.1
computes on the model folder `model` into out/allennlp/ (read by tests/test_allennlp_fixtures.py;
the layout is in allennlp_readme.md, copied there as README.md).

The side environment (`ENV`; exact versions in allennlp.lock.txt): torch 2.13.0 built for CPU
(PyPI's own Linux wheel would bring some GB of CUDA libraries), numpy, h5py and the few small
packages allennlp's import chain needs, then allennlp 2.10.1 without its dependencies. Its heavy
optional imports (transformers, spacy, ...) are answered by placeholders inside the recording
script, allennlp_record.py, which runs only there and hands back .npz and JSON; this module
writes the files (files.py). Nothing of AllenNLP or torch is imported by the project or its tests.

The interpreter: python3.11 where the machine has one, else the one running the generator. The
CPU build of torch comes from PyTorch's CPU index, which the machine that made the committed
fixtures cannot reach; there pip takes the wheel from its find-links folder, which holds only
the cp311 build, hence Python 3.11. The recorded bytes are the same for the same interpreter
version (major.minor, in sentences.json's `versions`) and platform; another interpreter gets
other builds of torch and numpy, whose float32 results may differ in the last bits.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from tests.reference.files import load_npz, write_hdf5, write_json
from tests.reference.side_env import SideEnv

HERE = Path(__file__).resolve().parent
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
    lock=HERE / "allennlp.lock.txt",
)

RECORDER = HERE / "allennlp_record.py"
README = HERE / "allennlp_readme.md"
FOLDER = "allennlp"  # under `out`


def make(model: Path, out: Path) -> Path:
    """Records AllenNLP's char ids and ELMo outputs for the model folder `model` (options.json,
    lm_weights.hdf5) into out/allennlp/ (not there before), and returns that folder. The same
    inputs give byte-identical files."""
    ENV.ensure()
    folder = Path(out) / FOLDER
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="allennlp-work-") as tmp:
        work = Path(tmp)
        ENV.run(RECORDER, Path(model).resolve(), work / "allennlp.npz", work / "allennlp.json")
        arrays = load_npz(work / "allennlp.npz")
        meta = json.loads((work / "allennlp.json").read_text())
    write_hdf5(folder / "allennlp.hdf5", arrays)
    meta["model_sha256"] = {
        name: hashlib.sha256((Path(model) / name).read_bytes()).hexdigest()
        for name in ("options.json", "lm_weights.hdf5")
    }
    write_json(folder / "sentences.json", meta, ascii_only=True)  # a lone surrogate: JSON escapes only
    (folder / "README.md").write_bytes(README.read_bytes())
    return folder
