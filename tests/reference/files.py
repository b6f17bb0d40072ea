"""The generator's file writers, one way for every fixture file: the same content gives the same
bytes (fixed order, no timestamps, sorted JSON keys). Both halves (bilm_tf.py, allennlp.py) write
with these, in the project's Python; the side environments hand back only .npz and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np


def write_json(path: Path, value: object, ascii_only: bool = False) -> None:
    """Sorted keys, indent 1, a final newline; `ascii_only` escapes non-ASCII characters (needed
    where a string holds a lone surrogate, which UTF-8 cannot write)."""
    path.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=ascii_only) + "\n", encoding="utf-8")


def write_text(path: Path, lines: list[str], final_newline: bool = True) -> None:
    path.write_bytes(("\n".join(lines) + ("\n" if final_newline else "")).encode("utf-8"))


def write_hdf5(
    path: Path,
    datasets: dict[str, np.ndarray],
    attrs: dict[str, dict[str, object]] | None = None,
    root_attrs: dict[str, object] | None = None,
) -> None:
    """One HDF5 file, the same bytes for the same content: datasets in sorted name order ('a/b'
    names make groups), no timestamps; numeric arrays of 256+ elements gzip-compressed (shuffle
    filter, level 9, one chunk); file format of HDF5 1.10 (any h5py of the last years reads it,
    the side environments' too); strings as UTF-8. `attrs` maps a dataset's or group's name to
    its attributes."""
    attrs = attrs or {}
    with h5py.File(path, "w", libver=("v110", "v110"), track_order=False) as f:
        for key, value in sorted((root_attrs or {}).items()):
            f.attrs[key] = value
        for name in sorted(datasets):
            value = np.asarray(datasets[name])
            compress = value.dtype.kind in "fiu" and value.size >= 256
            options: dict[str, object] = (
                {"compression": "gzip", "compression_opts": 9, "shuffle": True, "chunks": value.shape}
                if compress
                else {}
            )
            if value.dtype.kind in "OUS":
                value = np.array([str(v) for v in value.ravel()], dtype=h5py.string_dtype("utf-8")).reshape(value.shape)
            f.create_dataset(name, data=value, track_times=False, **options)
        for name in sorted(attrs):  # of datasets or groups
            for key, attr in sorted(attrs[name].items()):
                f[name].attrs[key] = attr


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """What a side process handed back with np.savez: name -> array."""
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}
