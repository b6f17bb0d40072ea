"""Writes tests/fixtures/torch_state/: small files torch.save writes, in both formats, and what
torch.load reads from them, for tests/test_torch_state.py (elmo_jax.interop.torch_state).

    python -m tests.reference.make    (with the other fixtures: in ELMoForManyLangs' environment)
    PYTHON_WITH_TORCH tests/reference/torch_state_files.py [FOLDER]

made with PyTorch 2.13.0, CPU (tests/reference/efml.lock.txt); FOLDER defaults to
tests/fixtures/torch_state. A rerun writes the same bytes: the zip format is
deterministic as torch writes it; the legacy format names each storage by its memory address
(and orders the storages by it), which this script renames to 1000..., 1001..., (as long) in the
order the dict names them, storages reordered to match; torch.load must then read the same
tensors.

- `module_{zip,legacy}.pt`: the state dict of a small module (Embedding, Conv1d, an LSTM,
  Linear), seeded weights.
- `tensors_{zip,legacy}.pt`: a dict of every storage dtype the reader knows, 0-d and empty
  tensors, a parameter, and views of one storage (transposed, rows, a column, steps, one element,
  stride 0, permuted, a short slice far into the storage).
- `module.npz`, `tensors.npz`: torch.load's tensors (the same from both formats), by name, in the
  file's order; bfloat16 ones as float32 (exactly).
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

FOLDER = Path(__file__).resolve().parent.parent / "fixtures" / "torch_state"
MAGIC_NUMBER, PROTOCOL_VERSION = 0x1950A86A20F9469CFC6C, 1001


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(4, 2, padding_idx=0)
        self.conv = nn.Conv1d(2, 3, kernel_size=2)
        self.lstm = nn.LSTM(3, 2, batch_first=True)
        self.proj = nn.Linear(2, 2)


def module_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return Net().state_dict()


def tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "f32": torch.randn(3, 4),
        "f64": torch.randn(2, 3, dtype=torch.float64),
        "f16": torch.randn(5).half(),
        "bf16": torch.randn(2, 2).bfloat16(),
        "i64": torch.tensor([1, -2, 3**30]),
        "i32": torch.tensor([[1, 2], [3, -4]], dtype=torch.int32),
        "i8": torch.tensor([-1, 2], dtype=torch.int8),
        "u8": torch.tensor([255, 0, 3], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "num_batches_tracked": torch.tensor(3),  # BatchNorm's: an int64 scalar
        "empty": torch.zeros(0, 3),
        "parameter": nn.Parameter(torch.tensor([0.5, -0.5])),
        "base": base,
        "transposed": base.t(),
        "column": base[:, 2],
        "steps": base[::2, 1::3],
        "element": base[2, 3],
        "expanded": base[1, 4:].expand(3, 2),
        "permuted": base.reshape(2, 3, 4).permute(2, 0, 1),
        "far_slice": base.flatten()[20:23],
    }


def legacy_layout(path: Path) -> tuple[dict[str, int], list[str], int, int]:
    """A legacy file's storages: {key: element size} in the order the dict's pickle names them,
    the keys in the file's order, and where the list of keys and the storages start."""
    storages: dict[str, int] = {}

    class Skip(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            if name == "OrderedDict":
                return collections.OrderedDict
            return getattr(torch, name) if name.endswith("Storage") else lambda *args: None

        def persistent_load(self, pid: tuple) -> object:
            with warnings.catch_warnings():  # TypedStorage is deprecated
                warnings.simplefilter("ignore")
                storages.setdefault(pid[2], torch.tensor([], dtype=pid[1].dtype).element_size())
            return None

    with path.open("rb") as file:
        for _ in range(3):
            pickle.load(file)
        Skip(file).load()
        keys_at = file.tell()
        keys = pickle.load(file)
        return storages, keys, keys_at, file.tell()


def rename_legacy_keys(path: Path) -> None:
    """Memory addresses -> 1000.., 1001.. (as long) in the order the dict names the storages, in
    the dict's pickle and in the list of keys; the storages reordered to the new sorted order."""
    storages, keys, keys_at, data_at = legacy_layout(path)
    assert keys == sorted(keys) and set(keys) == set(storages) and len({len(k) for k in keys}) == 1, keys
    data = path.read_bytes()
    head, blocks, at = data[:keys_at], {}, data_at
    for key in keys:
        (count,) = struct.unpack("<q", data[at : at + 8])
        blocks[key], at = data[at : at + 8 + count * storages[key]], at + 8 + count * storages[key]
    assert at == len(data)
    renamed = {key: str(10 ** (len(key) - 1) + i) for i, key in enumerate(storages)}
    for key, new in renamed.items():
        old_op, new_op = (b"X" + struct.pack("<I", len(k)) + k.encode() for k in (key, new))
        assert head.count(old_op) >= 1, key
        head = head.replace(old_op, new_op)
    order = sorted(storages, key=renamed.__getitem__)
    tail = pickle.dumps([renamed[k] for k in order], protocol=2) + b"".join(blocks[k] for k in order)
    path.write_bytes(head + tail)


def as_numpy(value: torch.Tensor) -> np.ndarray:
    value = value.detach()
    return (value.float() if value.dtype == torch.bfloat16 else value).numpy()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed without timestamps: the same arrays give the same bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.array(array, order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, buffer.getvalue())


def write(folder: Path, name: str, state: dict[str, torch.Tensor]) -> None:
    expected = None
    for form in ("zip", "legacy"):
        path = folder / f"{name}_{form}.pt"
        torch.save(state, path, _use_new_zipfile_serialization=form == "zip")
        if form == "legacy":
            rename_legacy_keys(path)
        loaded = {key: as_numpy(value) for key, value in torch.load(path, weights_only=True).items()}
        assert list(loaded) == list(state)
        if expected is None:
            expected = loaded
        assert all(np.array_equal(loaded[k], expected[k]) and loaded[k].dtype == expected[k].dtype for k in loaded)
    assert expected is not None
    write_npz(folder / f"{name}.npz", expected)


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    write(folder, "module", module_state())
    write(folder, "tensors", tensors())
    total = sum(p.stat().st_size for p in folder.iterdir())
    print(f"{folder}: torch {torch.__version__}, {total} bytes")


if __name__ == "__main__":
    main()
