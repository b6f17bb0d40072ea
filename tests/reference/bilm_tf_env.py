"""bilm-tf's side environment: `ENV` (tensorflow-cpu 2.21 in compat.v1 graph mode, with tf-keras
2.21 for `tf.nn.rnn_cell`; exact versions in bilm_tf.lock.txt) and the bilm package it runs:
allenai/bilm-tf @ 7cffee2 = PyPI bilm 0.1.post5, the wheel checked by sha256 and its five
modules by their git blob ids, then two compatibility patches applied to a pristine copy:
`import tensorflow as tf` becomes `import tensorflow.compat.v1 as tf` + `tf.disable_v2_behavior()`
(TF_USE_LEGACY_KERAS=1 first), and LMDataset.get_sentence returns where `_load_random_shard`
raises StopIteration (PEP 479). Neither touches arithmetic.

`run_side(script, ...)` runs one of the in-environment scripts (bilm_tf_inference.py,
bilm_tf_training.py, which share bilm_tf_side.py) there with the patched bilm importable.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

from tests.reference.side_env import SideEnv

HERE = Path(__file__).resolve().parent

ENV = SideEnv(
    "bilm-tf",
    ("tensorflow-cpu==2.21.0", "numpy==2.4.6", "h5py==3.14.0"),
    no_deps=("tf-keras==2.21.0",),  # --no-deps: the full `tensorflow` wheel must not come in beside tensorflow-cpu
    lock=HERE / "bilm_tf.lock.txt",
)
BILM_VERSION = "0.1.post5"
TENSORFLOW_VERSION = "2.21.0"
BILM_WHEEL = f"bilm-{BILM_VERSION}-py3-none-any.whl"
BILM_WHEEL_SHA256 = "98a2e3c332bcefcccda6bf6056f8a0be52c474e62bcb0817787010b22b6969a3"
# git blob ids of bilm/*.py at allenai/bilm-tf 7cffee2b0986be51f5e2a747244836e1047657f4
BILM_BLOBS = {
    "__init__.py": "72ff1e49157e6c6170d7894494b6cd443f1b78c9",
    "data.py": "e4995d61527eafe2c84133f2721031d86a485237",
    "elmo.py": "70c26da309bf4bbaa5efe2a75fd3437ccc3289be",
    "model.py": "ad2752476b59e1a27452802e3dbf2cee4b802e24",
    "training.py": "b9c022c06c6a33adeee37aefff0f15412f299636",
}
TF_IMPORT = "import tensorflow as tf\n"
TF_IMPORT_COMPAT = (
    "import os as _os  # [elmo_jax patch] TF 2.x compat.v1 graph mode\n"
    "_os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')\n"
    "import tensorflow.compat.v1 as tf\n"
    "tf.disable_v2_behavior()\n"
)
SHARD_RELOAD = "            if self._i == self._nids:\n                self._ids = self._load_random_shard()\n"
SHARD_RELOAD_PEP479 = (
    "            if self._i == self._nids:\n"
    "                try:  # [elmo_jax patch] PEP 479: no StopIteration out of a generator\n"
    "                    self._ids = self._load_random_shard()\n"
    "                except StopIteration:\n"
    "                    return\n"
)
# The side processes: besides SideEnv.run's settings (CPU only, one thread), oneDNN off and TF's
# thread pools at 1 (bilm_tf_side.py), so that a rerun gives the same bytes.
SIDE_ENV = {
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_USE_LEGACY_KERAS": "1",
    "PYTHONUTF8": "1",
    "PYTHONWARNINGS": "ignore::SyntaxWarning",  # bilm/elmo.py's docstring has a '\\l'
}


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        raise RuntimeError(f"{path}: expected one {old!r}, found {text.count(old)}")
    path.write_text(text.replace(old, new))


def bilm_package() -> Path:
    """A folder inside the side environment holding the patched `bilm` package (put it on
    PYTHONPATH). The wheel is downloaded once (pip download --no-deps) and checked by sha256;
    the package is extracted and patched afresh on every call (it takes milliseconds)."""
    env = ENV.ensure()
    wheel = env / "downloads" / BILM_WHEEL
    if not wheel.is_file():
        subprocess.run(
            [str(ENV.python_exe()), "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
            + [f"bilm=={BILM_VERSION}", "-d", str(wheel.parent)],
            check=True,
        )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != BILM_WHEEL_SHA256:
        wheel.unlink()
        raise RuntimeError(f"{BILM_WHEEL}: sha256 {digest}, expected {BILM_WHEEL_SHA256}")
    folder = env / "bilm-peer"
    shutil.rmtree(folder, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in BILM_BLOBS:
            data = archive.read(f"bilm/{name}")
            if _git_blob(data) != BILM_BLOBS[name]:
                raise RuntimeError(f"bilm/{name} of {BILM_WHEEL} is not bilm-tf @ 7cffee2's")
            (folder / "bilm").mkdir(parents=True, exist_ok=True)
            (folder / "bilm" / name).write_bytes(data)
    for name in ("training.py", "model.py", "elmo.py"):
        _patch(folder / "bilm" / name, TF_IMPORT, TF_IMPORT_COMPAT)
    _patch(folder / "bilm" / "data.py", SHARD_RELOAD, SHARD_RELOAD_PEP479)
    return folder


def run_side(script: str, *args: str | Path) -> None:
    """Runs tests/reference/`script` in the side environment with the patched bilm importable."""
    ENV.run(HERE / script, *args, env={**SIDE_ENV, "PYTHONPATH": str(bilm_package())})
