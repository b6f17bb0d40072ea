"""PyTorch state dict files (`torch.save(module.state_dict(), f)`) -> {name: numpy array}, without
torch and without unpickling anything but tensors.

Two formats:

- zip (PyTorch >= 1.6): an archive whose entries share one top folder `<name>/`: `data.pkl`, the
  pickled dict, in which a tensor's storage is the persistent id `('storage', storage_type, key,
  location, numel)`; `data/<key>`, that storage's bytes; `byteorder` ("little" or "big"; absent:
  little); `version` and others, not needed.
- legacy (PyTorch 0.4 - 1.5, and `_use_new_zipfile_serialization=False`): consecutive pickles: the
  magic number, the protocol version (1001), a sys_info dict, the pickled dict (persistent ids
  `('storage', storage_type, root_key, location, numel, view_metadata)`, view_metadata None or
  `(view_key, offset, view_numel)`: a slice of the root storage), the sorted list of the root
  keys; then, for each key in that order, its element count (int64) and its bytes, little-endian.

In both, a tensor is `torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
requires_grad, backward_hooks[, metadata])` (`_rebuild_tensor(storage, storage_offset, size,
stride)` before PyTorch 0.4), a parameter `torch._utils._rebuild_parameter(tensor, requires_grad,
backward_hooks)`. The unpickler resolves those names, `collections.OrderedDict` and the storage
types only, to stand-ins of this module that call nothing: any other name is refused.
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import pickletools
import reprlib
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, TypeGuard

import ml_dtypes
import numpy as np

from elmo_jax.errors import MissingFile, UserError

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
NOT_TENSORS = "not a PyTorch state dict of tensors"
DAMAGED = "not a PyTorch file, or a truncated or damaged one"
MAX_EXPANDED = 1 << 24  # elements a tensor may have beyond its storage's (stride 0: expanded)
MAX_NESTING = 32  # a state dict's pickle nests about 5 deep; far deeper ones crash CPython's hash and repr
_REPR = reprlib.Repr()  # Python 3.11's takes no settings as arguments
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxtuple, _REPR.maxlist, _REPR.maxdict = 2, 60, 60, 6, 6, 4


def _short(value: object) -> str:
    """A repr of a value read from the file, bounded in depth and length (for the errors)."""
    return _REPR.repr(value)


_STORAGE_DTYPES: dict[str, np.dtype[Any]] = {
    "FloatStorage": np.dtype(np.float32),
    "DoubleStorage": np.dtype(np.float64),
    "HalfStorage": np.dtype(np.float16),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "LongStorage": np.dtype(np.int64),
    "IntStorage": np.dtype(np.int32),
    "ShortStorage": np.dtype(np.int16),
    "CharStorage": np.dtype(np.int8),
    "ByteStorage": np.dtype(np.uint8),
    "BoolStorage": np.dtype(np.bool_),
}


class _Bad(Exception):
    """A fault in the file; load_state_dict adds the file's name and raises a UserError."""


class _StandIn:
    """What the unpickler gets instead of a torch name: its state cannot be set (BUILD)."""

    def __setstate__(self, state: object) -> NoReturn:
        raise _Bad(f"{NOT_TENSORS}: it sets the state of {self.what}")

    @property
    def what(self) -> str:
        return f"a {type(self).__name__.strip('_').lower()}"


@dataclass(frozen=True, eq=False)
class _StorageType(_StandIn):
    name: str
    dtype: np.dtype[Any]

    @property
    def what(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class _Storage(_StandIn):
    """A persistent id: elements [start, start + numel) of the root storage `key`."""

    key: str
    dtype: np.dtype[Any]
    start: int
    numel: int


@dataclass(frozen=True, eq=False)
class _Tensor(_StandIn):
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_tuple(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or not all(_is_int(v) and v >= 0 for v in value):
        raise _Bad(f"a tensor's {what} is {_short(value)}, not a tuple of counts")
    return tuple(value)


def _tensor(storage: object, offset: object, size: object, stride: object) -> _Tensor:
    if not isinstance(storage, _Storage):
        raise _Bad(f"{NOT_TENSORS}: a tensor is built on a {type(storage).__name__}, not a storage")
    if not (_is_int(offset) and offset >= 0):
        raise _Bad(f"a tensor's storage offset is {_short(offset)}")
    shape, strides = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if len(shape) != len(strides):
        raise _Bad(f"a tensor has size {shape} but stride {strides}")
    return _Tensor(storage, offset, shape, strides)


class _Function(_StandIn):
    """A torch function the pickle may call, by the name it uses."""

    def __init__(self, name: str, arities: tuple[int, ...]):
        self.name, self.arities = name, arities

    def __repr__(self) -> str:
        return self.name

    @property
    def what(self) -> str:
        return self.name

    def __call__(self, *args: object) -> _Tensor:
        if len(args) not in self.arities:
            raise _Bad(f"{self.name} called with {len(args)} arguments")
        if self.name.endswith("_rebuild_parameter"):
            if not isinstance(args[0], _Tensor):
                raise _Bad(f"{NOT_TENSORS}: a parameter holds a {type(args[0]).__name__}")
            return args[0]
        if len(args) == 7 and args[6]:  # conj / neg bits
            raise _Bad(f"a tensor has metadata {_short(args[6])}, which is not supported")
        return _tensor(*args[:4])


def _allowed_names() -> dict[str, object]:
    names: dict[str, object] = {"collections.OrderedDict": collections.OrderedDict}
    for name, arities in (("_rebuild_tensor_v2", (6, 7)), ("_rebuild_tensor", (4,)), ("_rebuild_parameter", (3,))):
        names[f"torch._utils.{name}"] = _Function(f"torch._utils.{name}", arities)
    for module in ("torch", "torch.cuda"):
        for name, dtype in _STORAGE_DTYPES.items():
            names[f"{module}.{name}"] = _StorageType(f"{module}.{name}", dtype)
    return names


ALLOWED = _allowed_names()


class _Unpickler(pickle.Unpickler):
    """Resolves the names in `allowed` only (to stand-ins), and persistent ids through `storage`."""

    def __init__(self, file: IO[bytes], allowed: dict[str, object], storage: _StorageIds | None = None):
        super().__init__(file, encoding="utf-8")
        self.allowed, self.storage = allowed, storage

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get(f"{module}.{name}")
        if found is None:
            raise _Bad(f"{NOT_TENSORS}: it refers to {module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if self.storage is None:
            raise _Bad(f"{NOT_TENSORS}: an unexpected persistent id {_short(pid)}")
        return self.storage.load(pid)


_FILLS = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}  # opcodes that add their top items to the container under them
_FILLS_TO_MARK = ("APPENDS", "SETITEMS", "ADDITEMS")  # ... the items above a mark, to the container under it


def _check_nesting(file: IO[bytes]) -> None:
    """Reads one pickle's opcodes (not running them) and refuses one whose values would nest more
    than MAX_NESTING deep: a small file of nested tuples crashes CPython (hash, repr) outright.
    Each stack item is a cell holding its depth, shared with the memo, so that a container filled
    after it was memoized deepens wherever it is used."""
    stack: list[list[int] | None] = []  # depth cells; None: a mark
    memo: dict[Any, list[int]] = {}

    def pop(n: int) -> list[list[int]]:
        if len(stack) < n or None in stack[len(stack) - n :]:
            raise _Bad(f"{DAMAGED} (its pickle: its stack runs out)")
        items = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return items  # type: ignore[return-value]  # no mark among them

    def to_mark() -> list[list[int]]:
        if None not in stack:
            raise _Bad(f"{DAMAGED} (its pickle: a mark missing)")
        at = len(stack) - 1 - stack[::-1].index(None)
        items = stack[at + 1 :]
        del stack[at:]
        return items  # type: ignore[return-value]

    for op, arg, _ in pickletools.genops(file):
        if op.name == "MARK":
            stack.append(None)
        elif op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):  # the top item, left on the stack
            (top,) = pop(1)
            stack.append(top)
            memo[len(memo) if op.name == "MEMOIZE" else arg] = top
        elif op.name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo.get(arg, [0]))
        else:
            fills = op.name in _FILLS or op.name in _FILLS_TO_MARK
            if op.name in _FILLS:
                items = pop(_FILLS[op.name])
            elif pickletools.markobject in op.stack_before:
                items = to_mark()
            else:
                items = pop(len(op.stack_before))
            depth = 1 + max((cell[0] for cell in items), default=-1)
            if fills:
                (container,) = pop(1)
                container[0] = max(container[0], depth)
                stack.append(container)
            else:
                stack.extend([max(depth, 0)] for _ in op.stack_after)
            if depth > MAX_NESTING:
                raise _Bad(f"{NOT_TENSORS}: its values nest more than {MAX_NESTING} deep")


def _unpickle(file: IO[bytes], allowed: dict[str, object], storage: _StorageIds | None = None) -> Any:
    try:
        start = file.tell()
        _check_nesting(file)
        file.seek(start)
        return _Unpickler(file, allowed, storage).load()
    except _Bad:
        raise
    except Exception as e:  # the pickle machine's own: corrupt or truncated data
        raise _Bad(f"{DAMAGED} (its pickle: {type(e).__name__}: {e})") from None


class _StorageIds:
    """The storages a pickle's persistent ids name: key -> (dtype, numel), the same at each use."""

    def __init__(self, legacy: bool):
        self.legacy = legacy
        self.roots: dict[str, tuple[np.dtype[Any], int]] = {}

    def load(self, pid: Any) -> _Storage:
        fields = 6 if self.legacy else 5
        if not (isinstance(pid, tuple) and len(pid) == fields and pid[0] in ("storage", b"storage")):
            raise _Bad(f"{NOT_TENSORS}: an unexpected persistent id {_short(pid)}")
        storage_type, key, numel = pid[1], pid[2], pid[4]
        if not isinstance(storage_type, _StorageType):
            raise _Bad(f"{NOT_TENSORS}: a storage of type {_short(storage_type)}")
        if not (isinstance(key, str) and _is_int(numel) and numel >= 0):
            raise _Bad(f"a storage id {_short(pid)} is not (key, ..., element count)")
        seen = self.roots.setdefault(key, (storage_type.dtype, numel))
        if seen != (storage_type.dtype, numel):
            raise _Bad(f"storage {key} is both {seen[1]} x {seen[0]} and {numel} x {storage_type.dtype}")
        view = pid[5] if self.legacy else None
        if view is None:
            return _Storage(key, storage_type.dtype, 0, numel)
        if not (isinstance(view, tuple) and len(view) == 3 and _is_int(view[1]) and _is_int(view[2])):
            raise _Bad(f"storage {key} has a view {_short(view)}, not (key, offset, size)")
        _, start, count = view
        if not (0 <= start and 0 <= count and start + count <= numel):
            raise _Bad(f"a view of storage {key} is elements [{start}, {start + count}) of {numel}")
        return _Storage(key, storage_type.dtype, start, count)


def _array(name: str, tensor: _Tensor, root: np.ndarray) -> np.ndarray:
    """The tensor as a new C-contiguous array in native byte order, its bounds checked first."""
    storage, native = tensor.storage, tensor.storage.dtype.newbyteorder("=")
    described = (
        f"tensor {_short(name)} (size {_short(tensor.size)}, stride {_short(tensor.stride)}, offset {tensor.offset})"
    )
    if 0 in tensor.size:
        return np.zeros(tensor.size, native)  # no element: any other sizes cost nothing
    # More elements than the storage holds (stride 0, overlaps: an expanded tensor) only up to a
    # bound, else a tiny file could ask for any amount of memory.
    if math.prod(tensor.size) > max(storage.numel, MAX_EXPANDED):
        raise _Bad(f"{described}: more elements than its storage of {storage.numel} holds")
    extent = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride)) + 1
    if extent > storage.numel or storage.start + extent > len(root):
        raise _Bad(f"{described} reaches element {extent} of a storage of {storage.numel}")
    base = root[storage.start + tensor.offset :]
    strides = tuple(s * base.itemsize for s in tensor.stride)
    try:
        view = np.lib.stride_tricks.as_strided(base, tensor.size, strides, writeable=False)
        return view.astype(native, order="C", copy=True)
    except (ValueError, MemoryError, OverflowError) as e:
        raise _Bad(f"{described}: {type(e).__name__}: {e}") from None


def _state_dict(result: object) -> dict[str, _Tensor]:
    if not isinstance(result, dict):
        raise _Bad(f"{NOT_TENSORS}: it holds a value of type {type(result).__name__}, not a dict")
    for name, value in result.items():
        if not isinstance(name, str):
            raise _Bad(f"{NOT_TENSORS}: a key {_short(name)} is not a string")
        if not isinstance(value, _Tensor):
            raise _Bad(f"{NOT_TENSORS}: {_short(name)} holds a value of type {type(value).__name__}, not a tensor")
    return dict(result)


def _read_zip(file: IO[bytes]) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(file) as archive:
        names = {info.filename: info for info in archive.infolist()}
        pickles = [n for n in names if n.count("/") == 1 and n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise _Bad(f"a zip archive with {len(pickles)} <name>/data.pkl records, not one: not a torch.save file")
        folder = pickles[0].removesuffix("data.pkl")
        byteorder = _stored(archive, names[folder + "byteorder"]) if folder + "byteorder" in names else b"little"
        if byteorder not in (b"little", b"big"):
            raise _Bad(f"unknown byte order {_short(byteorder)}")
        ids = _StorageIds(legacy=False)
        tensors = _state_dict(_unpickle(io.BytesIO(_stored(archive, names[pickles[0]])), ALLOWED, ids))
        roots: dict[str, np.ndarray] = {}
        arrays = {}
        for name, tensor in tensors.items():
            key = tensor.storage.key
            if key not in roots:
                dtype, numel = ids.roots[key]
                record = f"{folder}data/{key}"
                if record not in names:
                    raise _Bad(f"tensor {_short(name)}: its storage {record} is not in the archive")
                if names[record].file_size != numel * dtype.itemsize:
                    size = names[record].file_size
                    raise _Bad(f"{record} holds {size} bytes, not {numel} x {dtype} ({numel * dtype.itemsize})")
                stored = dtype.newbyteorder(">" if byteorder == b"big" else "<")
                roots[key] = np.frombuffer(_stored(archive, names[record]), stored)
            arrays[name] = _array(name, tensor, roots[key])
        return arrays


def _stored(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A record's bytes, as torch writes them: stored, not compressed (no zip bomb), all there."""
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise _Bad(f"{info.filename} is compressed or its sizes disagree: torch.save stores its records")
    data = archive.read(info)
    if len(data) != info.file_size:
        raise _Bad(f"{info.filename} holds {len(data)} bytes, its header says {info.file_size}")
    return data


def _read_legacy(file: IO[bytes], size: int) -> dict[str, np.ndarray]:
    if _unpickle(file, {}) != MAGIC_NUMBER:
        raise _Bad("not a PyTorch file (neither a zip archive nor the legacy format's magic number)")
    version = _unpickle(file, {})
    if version != PROTOCOL_VERSION:
        raise _Bad(f"legacy PyTorch protocol version {_short(version)}, not {PROTOCOL_VERSION}")
    sys_info = _unpickle(file, {})
    if not isinstance(sys_info, dict):
        raise _Bad(f"the legacy format's sys_info is {_short(sys_info)}, not a dict")
    if sys_info.get("little_endian") is not True:
        raise _Bad(f"written on a big-endian machine (sys_info {_short(sys_info)}), which is not supported")
    ids = _StorageIds(legacy=True)
    tensors = _state_dict(_unpickle(file, ALLOWED, ids))
    keys = _unpickle(file, {})
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys) and len(set(keys)) == len(keys)):
        raise _Bad(f"the storage keys are {_short(keys)}, not a list of distinct strings")
    listed = set(keys)
    for name, tensor in tensors.items():
        if tensor.storage.key not in listed:
            raise _Bad(f"tensor {_short(name)}: its storage {tensor.storage.key} is not in the file")
    roots = {key: _read_storage(file, key, size, *ids.roots.get(key, (None, 0))) for key in keys}
    return {name: _array(name, tensor, roots[tensor.storage.key]) for name, tensor in tensors.items()}


def _read_storage(file: IO[bytes], key: str, size: int, dtype: np.dtype[Any] | None, numel: int) -> np.ndarray:
    """One storage of the legacy format: int64 element count, then the elements."""
    if dtype is None:
        raise _Bad(f"storage {key} is in the file but no tensor refers to it")
    count = file.read(8)
    if len(count) < 8:
        raise _Bad(f"truncated: storage {key} is missing")
    (found,) = struct.unpack("<q", count)
    if found != numel:
        raise _Bad(f"storage {key} holds {found} elements, its tensors {numel}")
    nbytes = numel * dtype.itemsize
    if size - file.tell() < nbytes:
        raise _Bad(f"truncated: storage {key} needs {nbytes} bytes, {size - file.tell()} are left")
    return np.frombuffer(file.read(nbytes), dtype.newbyteorder("<"))


def load_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a file `torch.save(module.state_dict(), path)` wrote (zip or legacy format),
    by name, in the file's order: C-contiguous arrays of their dtype (bfloat16: ml_dtypes') and
    shape. A fault in the file, or anything but a dict of tensors in it, is a one-line UserError."""
    path = Path(path)
    if not path.exists():
        raise MissingFile(f"PyTorch state dict not found: {path}")
    if not path.is_file():
        raise UserError(f"{path}: not a file (a PyTorch state dict is one)")
    try:
        with path.open("rb") as file:
            if file.read(4) == b"PK\x03\x04":
                file.seek(0)
                return _read_zip(file)
            file.seek(0)
            return _read_legacy(file, os.fstat(file.fileno()).st_size)
    except _Bad as e:
        raise UserError(f"{path}: {e}") from None
    except zipfile.BadZipFile as e:
        raise UserError(f"{path}: a damaged zip archive ({e})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e})") from None
    except Exception as e:  # anything else a damaged or hostile file raises on its way: one line
        raise UserError(f"{path}: a damaged or unsupported PyTorch file ({type(e).__name__}: {str(e)[:200]})") from None
