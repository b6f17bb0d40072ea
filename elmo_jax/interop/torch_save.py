"""{name: numpy array} -> a PyTorch state dict file, as `torch.save(state_dict, f)` writes it (the
zip format of PyTorch >= 1.6), without torch: what `torch.load` reads back as an OrderedDict of
float32 CPU tensors (elmo_jax/interop/torch_state.py reads it too).

The archive (stored, not compressed) holds `archive/data.pkl`, the pickled dict, where each tensor
is `torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())` and each
storage the persistent id `('storage', torch.FloatStorage, key, 'cpu', numel)`;
`archive/data/<key>`, its float32 values, little-endian; `archive/byteorder` and
`archive/version`. The same arrays give the same bytes.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

FORMAT_VERSION = b"3\n"  # what torch 2.x writes and every torch >= 1.6 reads


class _Global(NamedTuple):
    """A name torch resolves when it loads the file (written as pickle's GLOBAL, never imported here)."""

    module: str
    name: str


class _Tensor(NamedTuple):
    key: str
    shape: tuple[int, ...]


REBUILD = _Global("torch._utils", "_rebuild_tensor_v2")
FLOAT_STORAGE = _Global("torch", "FloatStorage")


# The pickler written in Python, whose dispatch table can take our two kinds (typeshed does not
# describe its methods: Any).
_PythonPickler: Any = pickle._Pickler


class _Pickler(_PythonPickler):
    dispatch: ClassVar[dict] = dict(_PythonPickler.dispatch)

    def __init__(self, file: io.BytesIO, sizes: dict[str, int]):
        super().__init__(file, protocol=2)
        self.sizes = sizes

    def _save_global(self, obj: _Global) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("ascii"))

    def _save_tensor(self, obj: _Tensor) -> None:
        strides = tuple(int(np.prod(obj.shape[k + 1 :])) for k in range(len(obj.shape)))
        self.save(REBUILD)
        self.save((_Storage(obj.key), 0, obj.shape, strides, False, collections.OrderedDict()))
        self.write(pickle.REDUCE)

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _Storage):
            return ("storage", FLOAT_STORAGE, obj.key, "cpu", self.sizes[obj.key])
        return None

    dispatch[_Global] = _save_global
    dispatch[_Tensor] = _save_tensor


class _Storage(NamedTuple):
    key: str


def save_state_dict(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes `arrays` (any float dtype, stored as float32) as torch.save writes a state dict."""
    values = {str(i): np.ascontiguousarray(a, dtype="<f4") for i, a in enumerate(arrays.values())}
    buffer = io.BytesIO()
    tensors = [(name, _Tensor(str(i), tuple(int(n) for n in a.shape))) for i, (name, a) in enumerate(arrays.items())]
    _Pickler(buffer, {key: value.size for key, value in values.items()}).dump(collections.OrderedDict(tensors))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in (
            [("data.pkl", buffer.getvalue()), ("byteorder", b"little")]
            + [(f"data/{key}", value.tobytes()) for key, value in values.items()]
            + [("version", FORMAT_VERSION)]
        ):
            info = zipfile.ZipInfo(f"archive/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(info, data)
