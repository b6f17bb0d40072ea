"""PyTorch state dict files without torch (elmo_jax.interop.torch_state): torch-written files in
both formats against what torch.load read from them (tests/fixtures/torch_state, written by
tests/reference/torch_state_files.py), and hand-made pickles (the stdlib's pickler) for what torch
does not write any more (storage views, `_rebuild_tensor`, a big-endian archive) and for what the
reader refuses, each a one-line UserError naming the file."""

import collections
import io
import json
import pickle
import struct
import zipfile
from pathlib import Path
from typing import NamedTuple

import ml_dtypes
import numpy as np
import pytest

from elmo_jax.errors import MissingFile, UserError
from elmo_jax.interop.torch_state import ALLOWED, MAGIC_NUMBER, PROTOCOL_VERSION, load_state_dict

# --- torch's files ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_files(fixtures_dir):
    return fixtures_dir / "torch_state"


@pytest.mark.parametrize("form", ["zip", "legacy"])
@pytest.mark.parametrize("content", ["module", "tensors"])
def test_reads_what_torch_load_reads(torch_files, content, form):
    expected = dict(np.load(torch_files / f"{content}.npz"))
    got = load_state_dict(torch_files / f"{content}_{form}.pt")
    assert list(got) == list(expected)  # the file's order
    for name, array in got.items():
        assert array.flags.c_contiguous and array.flags.writeable, name
        if name == "bf16":
            assert array.dtype == ml_dtypes.bfloat16
            array = array.astype(np.float32)
        assert (array.dtype, array.shape) == (expected[name].dtype, expected[name].shape), name
        np.testing.assert_array_equal(array, expected[name], err_msg=name)


def test_module_and_dtypes(torch_files):
    module = load_state_dict(torch_files / "module_zip.pt")
    assert {name: a.shape for name, a in module.items()} == {
        "emb.weight": (4, 2),
        "conv.weight": (3, 2, 2),
        "conv.bias": (3,),
        "lstm.weight_ih_l0": (8, 3),
        "lstm.weight_hh_l0": (8, 2),
        "lstm.bias_ih_l0": (8,),
        "lstm.bias_hh_l0": (8,),
        "proj.weight": (2, 2),
        "proj.bias": (2,),
    }
    assert not module["emb.weight"][0].any()  # padding_idx=0
    tensors = load_state_dict(torch_files / "tensors_legacy.pt")
    dtypes = {name: str(a.dtype) for name, a in tensors.items() if name in ("f16", "i64", "u8", "bool", "bf16")}
    assert dtypes == {"f16": "float16", "bf16": "bfloat16", "i64": "int64", "u8": "uint8", "bool": "bool"}
    assert tensors["num_batches_tracked"].shape == () and tensors["num_batches_tracked"].dtype == np.int64
    assert tensors["empty"].shape == (0, 3)


def test_views_become_arrays_of_their_own(torch_files):
    tensors = load_state_dict(torch_files / "tensors_zip.pt")
    base = tensors["base"]
    np.testing.assert_array_equal(tensors["transposed"], base.T)
    np.testing.assert_array_equal(tensors["steps"], base[::2, 1::3])
    np.testing.assert_array_equal(tensors["far_slice"], base.ravel()[20:23])
    assert not any(np.shares_memory(base, a) for name, a in tensors.items() if name != "base")


def test_reads_the_efml_fixtures(fixtures_dir):
    """ELMoForManyLangs' model files (tests/fixtures/efml; cnn_word_elmo's in the legacy format,
    cnn_elmo's zipped): the weights tests/reference/efml.py drew and torch.save wrote."""
    from tests.reference import efml

    n_chars, n_words = len(efml.CHARS) + len(efml.CHAR_SPECIALS), len(efml.WORD_SPECIALS) + len(efml.WORDS)
    for name, (_, seed, legacy, config_path) in efml.MODELS.items():
        folder = fixtures_dir / "efml" / name
        config = json.loads((folder / Path(config_path).name).read_text())
        expected = efml.random_weights(config, n_chars, n_words, seed)
        for part in ("token_embedder", "encoder"):
            path = folder / f"{part}.pkl"
            assert (path.read_bytes()[:4] == b"PK\x03\x04") is not legacy
            got = load_state_dict(path)
            weights = {key.removeprefix(f"{part}/"): value for key, value in expected.items() if key.startswith(part)}
            assert list(got) == list(weights)
            for key, value in weights.items():
                assert got[key].dtype == value.dtype == np.float32, key
                np.testing.assert_array_equal(got[key], value, err_msg=f"{path}: {key}")


# --- hand-made pickles --------------------------------------------------------------------------


class Global(NamedTuple):
    """GLOBAL module name: a name the pickle refers to (the stdlib's pickler needs no module)."""

    module: str
    name: str


class Call(NamedTuple):
    """func(*args) (REDUCE)."""

    func: object
    args: tuple


class Build(NamedTuple):
    """obj, then BUILD with state."""

    obj: object
    state: object


class Storage(NamedTuple):
    """A persistent id."""

    pid: tuple


class Pickler(pickle._Pickler):
    dispatch = pickle._Pickler.dispatch.copy()

    def persistent_id(self, obj):
        return obj.pid if type(obj) is Storage else None

    def save_global_name(self, obj):
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())

    def save_call(self, obj):
        self.save(obj.func)
        self.save(obj.args)
        self.write(pickle.REDUCE)

    def save_build(self, obj):
        self.save(obj.obj)
        self.save(obj.state)
        self.write(pickle.BUILD)

    dispatch[Global] = save_global_name
    dispatch[Call] = save_call
    dispatch[Build] = save_build


def dumps(obj) -> bytes:
    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


def storage(key, numel, kind="FloatStorage", view=None, legacy=True, module="torch"):
    pid = ("storage", Global(module, kind), key, "cpu", numel)
    return Storage(pid + (view,) if legacy else pid)


def tensor(storage, offset, size, stride, rebuild="_rebuild_tensor_v2"):
    hooks = Call(Global("collections", "OrderedDict"), ())
    extra = (False, hooks) if rebuild == "_rebuild_tensor_v2" else ()
    return Call(Global("torch._utils", rebuild), (storage, offset, size, stride) + extra)


def ordered(items):
    return Call(Global("collections", "OrderedDict"), ([list(item) for item in items.items()],))


LITTLE = {"protocol_version": PROTOCOL_VERSION, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 8}}


def legacy_file(path, state, storages, keys=None, sys_info=LITTLE, counts=None):
    """The legacy format: storages {key: array}, written in `keys`' order (default: sorted)."""
    keys = sorted(storages) if keys is None else keys
    parts = [pickle.dumps(MAGIC_NUMBER, 2), pickle.dumps(PROTOCOL_VERSION, 2), pickle.dumps(sys_info, 2)]
    parts += [dumps(state), pickle.dumps(keys, 2)]
    for key in keys:
        array = storages[key]
        count = array.size if counts is None else counts[key]
        parts += [struct.pack("<q", count), array.astype(array.dtype.newbyteorder("<")).tobytes()]
    path.write_bytes(b"".join(parts))
    return path


def zip_file(path, state, storages, byteorder="little", folder="archive", pickle_bytes=None):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{folder}/data.pkl", dumps(state) if pickle_bytes is None else pickle_bytes)
        if byteorder is not None:
            archive.writestr(f"{folder}/byteorder", byteorder)
        for key, array in storages.items():
            order = ">" if byteorder == "big" else "<"
            archive.writestr(f"{folder}/data/{key}", array.astype(array.dtype.newbyteorder(order)).tobytes())
        archive.writestr(f"{folder}/version", "3\n")
    return path


def test_legacy_storage_views_and_old_rebuild(tmp_path):
    """PyTorch 0.4 could pickle a storage as a view (view_key, offset, size) of a root storage."""
    root = np.arange(12, dtype=np.float32)
    whole = storage("1", 12)
    view = storage("1", 12, view=("7", 4, 6))
    state = ordered(
        {
            "whole": tensor(whole, 0, (3, 4), (4, 1)),
            "view": tensor(view, 1, (2, 2), (1, 3)),  # elements 5, 8 / 6, 9 of the root
            "old": tensor(view, 0, (6,), (1,), rebuild="_rebuild_tensor"),
            "cuda": tensor(storage("2", 2, "DoubleStorage", module="torch.cuda"), 0, (2,), (1,)),
        }
    )
    path = legacy_file(tmp_path / "views.pkl", state, {"1": root, "2": np.array([0.5, 1.5])})
    got = load_state_dict(path)
    np.testing.assert_array_equal(got["whole"], root.reshape(3, 4))
    np.testing.assert_array_equal(got["view"], [[5, 8], [6, 9]])
    np.testing.assert_array_equal(got["old"], root[4:10])
    assert got["cuda"].dtype == np.float64 and got["cuda"].tolist() == [0.5, 1.5]


@pytest.mark.parametrize("byteorder", ["little", "big", None])
def test_zip_byte_order(tmp_path, byteorder):
    values = np.array([1.5, -2.25, 3e38], dtype=np.float32)
    state = {"w": tensor(storage("0", 3, legacy=False), 0, (3,), (1,))}
    got = load_state_dict(zip_file(tmp_path / "w.pt", state, {"0": values}, byteorder=byteorder))
    assert got["w"].dtype == np.float32 and got["w"].dtype.isnative
    np.testing.assert_array_equal(got["w"], values)


@pytest.mark.parametrize(
    ("kind", "dtype"),
    [
        ("FloatStorage", np.float32),
        ("DoubleStorage", np.float64),
        ("HalfStorage", np.float16),
        ("BFloat16Storage", ml_dtypes.bfloat16),
        ("LongStorage", np.int64),
        ("IntStorage", np.int32),
        ("ShortStorage", np.int16),
        ("CharStorage", np.int8),
        ("ByteStorage", np.uint8),
        ("BoolStorage", np.bool_),
    ],
)
def test_storage_types(tmp_path, kind, dtype):
    values = np.array([1, 0, 1, 1], dtype=dtype)
    state = {"t": tensor(storage("5", 4, kind), 0, (2, 2), (1, 2))}
    got = load_state_dict(legacy_file(tmp_path / "t.pkl", state, {"5": values}))
    assert got["t"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got["t"], values.reshape(2, 2).T)


def test_only_the_allowed_names():
    storages = {"FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage", "LongStorage", "IntStorage"}
    storages |= {"ShortStorage", "CharStorage", "ByteStorage", "BoolStorage"}
    functions = {"torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor", "torch._utils._rebuild_parameter"}
    names = {"collections.OrderedDict"} | functions | {f"{m}.{s}" for m in ("torch", "torch.cuda") for s in storages}
    assert set(ALLOWED) == names


# --- refusals -----------------------------------------------------------------------------------


def refusal(path, *words):
    with pytest.raises(UserError) as caught:
        load_state_dict(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("form", ["legacy", "zip"])
@pytest.mark.parametrize("call", ["os.system", "builtins.exec", "posix.system", "__builtin__.eval"])
def test_code_is_refused_and_not_run(tmp_path, form, call):
    made = tmp_path / "made"
    module, name = call.split(".")
    argument = f"touch {made}" if name == "system" else f"open({str(made)!r}, 'w').close()"
    payload = Call(Global(module, name), (argument,))
    if call == "builtins.exec":  # the payload works: an unrestricted unpickler runs it
        pickle.loads(dumps(payload))
        assert made.exists()
        made.unlink()
    state = {"weight": payload}
    if form == "legacy":
        path = legacy_file(tmp_path / "encoder.pkl", state, {})
    else:
        path = zip_file(tmp_path / "encoder.pkl", state, {})
    refusal(path, f"not a PyTorch state dict of tensors: it refers to {call}")
    assert not made.exists()


def test_refuses_a_global_inside_a_storage_id_and_setting_state(tmp_path):
    sneaky = {"w": tensor(Storage(("storage", Global("subprocess", "Popen"), "0", "cpu", 1, None)), 0, (1,), (1,))}
    refusal(legacy_file(tmp_path / "a.pkl", sneaky, {}), "subprocess.Popen")
    unknown = {"w": tensor(storage("0", 1, "QInt8Storage"), 0, (1,), (1,))}
    refusal(legacy_file(tmp_path / "b.pkl", unknown, {"0": np.zeros(1, np.int8)}), "torch.QInt8Storage")
    new = {"w": Call(Global("torch._utils", "_rebuild_tensor_v3"), ())}
    refusal(legacy_file(tmp_path / "c.pkl", new, {}), "torch._utils._rebuild_tensor_v3")
    built = {"w": Build(tensor(storage("0", 1), 0, (1,), (1,)), {"storage": 5})}
    refusal(legacy_file(tmp_path / "d.pkl", built, {"0": np.zeros(1, np.float32)}), "sets the state of a tensor")
    odd_id = {"w": tensor(Storage(("module", 1, 2)), 0, (1,), (1,))}
    refusal(legacy_file(tmp_path / "e.pkl", odd_id, {}), "persistent id")


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ([1, 2], ["holds a value of type list, not a dict"]),
        ({"layer.weight": 3}, ["'layer.weight' holds a value of type int, not a tensor"]),
        ({"encoder": {"weight": 1.0}}, ["'encoder' holds a value of type dict, not a tensor"]),
        ({1: 2}, ["a key 1 is not a string"]),
    ],
)
def test_refuses_what_is_not_a_dict_of_tensors(tmp_path, state, words):
    refusal(legacy_file(tmp_path / "encoder.pkl", state, {}), "not a PyTorch state dict of tensors", *words)


def test_refuses_missing_and_mismatched_storages(tmp_path):
    four = np.zeros(4, np.float32)
    state = {"w": tensor(storage("9", 4), 0, (4,), (1,))}
    refusal(legacy_file(tmp_path / "a.pkl", state, {"8": four}), "'w'", "storage 9 is not in the file")
    zipped = {"w": tensor(storage("9", 4, legacy=False), 0, (4,), (1,))}
    refusal(zip_file(tmp_path / "b.pt", zipped, {"8": four}), "'w'", "archive/data/9 is not in the archive")
    refusal(zip_file(tmp_path / "c.pt", zipped, {"9": np.zeros(3, np.float32)}), "holds 12 bytes")
    refusal(legacy_file(tmp_path / "d.pkl", state, {"9": four}, counts={"9": 5}), "storage 9 holds 5 elements")
    unused = {"9": four, "10": four}
    refusal(legacy_file(tmp_path / "e.pkl", state, unused), "storage 10 is in the file but no tensor refers to it")
    two_types = {
        "w": tensor(storage("9", 4), 0, (4,), (1,)),
        "v": tensor(storage("9", 2, "DoubleStorage"), 0, (2,), (1,)),
    }
    refusal(legacy_file(tmp_path / "f.pkl", two_types, {"9": four}), "storage 9 is both")


@pytest.mark.parametrize(
    ("offset", "size", "stride", "view"),
    [
        (0, (5,), (1,), None),  # one past the end
        (3, (2,), (1,), None),
        (0, (2, 3), (3, 1), None),
        (0, (2, 2), (1, 3), None),  # transposed, reaches element 5
        (0, (3,), (1,), ("v", 2, 2)),  # past the end of the view
        (0, (1,), (1,), ("v", 3, 2)),  # the view past the end of the storage
    ],
)
def test_refuses_reading_past_a_storage(tmp_path, offset, size, stride, view):
    state = {"w": tensor(storage("0", 4, view=view), offset, size, stride)}
    refusal(legacy_file(tmp_path / "w.pkl", state, {"0": np.arange(4, dtype=np.float32)}), "of 4" if not view else "")


def test_refuses_bad_sizes_and_big_endian_legacy(tmp_path):
    four = {"0": np.zeros(4, np.float32)}
    refusal(legacy_file(tmp_path / "a.pkl", {"w": tensor(storage("0", 4), 0, (-1,), (1,))}, four), "size is (-1,)")
    refusal(legacy_file(tmp_path / "b.pkl", {"w": tensor(storage("0", 4), 0, (2,), (1, 1))}, four), "stride (1, 1)")
    refusal(legacy_file(tmp_path / "c.pkl", {"w": tensor(storage("0", 4), -1, (2,), (1,))}, four), "offset is -1")
    huge = {"w": tensor(storage("0", 4), 0, (2**62, 2**62), (0, 0))}  # stride 0: within the storage
    refusal(legacy_file(tmp_path / "huge.pkl", huge, four), "more elements than its storage")
    big = dict(LITTLE, little_endian=False)
    refusal(legacy_file(tmp_path / "d.pkl", {}, {}, sys_info=big), "big-endian")
    refusal(zip_file(tmp_path / "e.pt", {}, {}, byteorder="middle"), "unknown byte order")


def test_refuses_damaged_and_foreign_files(tmp_path, torch_files):
    for name in ("tensors_legacy.pt", "tensors_zip.pt"):
        whole = (torch_files / name).read_bytes()
        for cut in (3, 40, 300, len(whole) // 2, len(whole) - 3):
            path = tmp_path / f"cut_{cut}_{name}"
            path.write_bytes(whole[:cut])
            refusal(path)
    text = tmp_path / "notes.txt"
    text.write_text("hello, these are not weights\n")
    refusal(text, "not a PyTorch file")
    refusal(zip_file(tmp_path / "no_pickle.zip", {}, {}, folder="a/b"), "data.pkl")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("readme.txt", "hi")
    refusal(tmp_path / "other.zip", "data.pkl")
    refusal(zip_file(tmp_path / "garbage.pt", {}, {}, pickle_bytes=b"\x80\x02garbage"), "damaged")
    (tmp_path / "magic.pkl").write_bytes(pickle.dumps(12345, 2))
    refusal(tmp_path / "magic.pkl", "magic number")
    with pytest.raises(MissingFile, match="not found: .*absent.pkl"):
        load_state_dict(tmp_path / "absent.pkl")


def test_an_ordered_dict_with_metadata_and_parameters(tmp_path):
    """state_dict() is an OrderedDict carrying `_metadata` (BUILD); keep_vars=True gives Parameters."""
    hooks = Call(Global("collections", "OrderedDict"), ())
    param = Call(Global("torch._utils", "_rebuild_parameter"), (tensor(storage("0", 2), 0, (2,), (1,)), True, hooks))
    state = Build(ordered({"p": param}), {"_metadata": collections.OrderedDict({"": {"version": 1}})})
    got = load_state_dict(legacy_file(tmp_path / "p.pkl", state, {"0": np.array([1, 2], np.float32)}))
    assert list(got) == ["p"] and got["p"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("form", ["legacy", "zip"])
@pytest.mark.parametrize("nesting", ["marks", "tuple1"])
def test_refuses_values_nested_deep_enough_to_crash_python(tmp_path, form, nesting):
    """A small file whose dict key nests 200,000 tuples deep: CPython's hash of it overflows the C
    stack (a segfault, no exception); refused from its opcodes before anything is built."""
    key = b"(" * 200_000 + b"t" * 200_000 if nesting == "marks" else b"K\x01" + b"\x85" * 200_000
    pickle_bytes = b"\x80\x02}" + key + b"K\x01s."
    if form == "zip":
        path = zip_file(tmp_path / "deep.pt", {}, {}, pickle_bytes=pickle_bytes)
    else:
        path = legacy_file(tmp_path / "deep.pt", {}, {})
        head = b"".join(pickle.dumps(x, 2) for x in (MAGIC_NUMBER, PROTOCOL_VERSION, LITTLE))
        path.write_bytes(head + pickle_bytes + pickle.dumps([], 2))
    refusal(path, "nest more than")


def test_refuses_compressed_and_short_zip_records(tmp_path):
    """torch.save stores its records: a compressed one could be a zip bomb, and a stored one
    whose data is shorter than its header says must not be read past."""
    state = {"w": tensor(storage("0", 1000, legacy=False), 0, (1000,), (1,))}
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", dumps(state))
        archive.writestr("archive/data/0", np.zeros(1000, "<f4").tobytes())
    refusal(path, "compressed")
    # A stored record of 4 bytes whose headers claim 4,000 (what its one tensor needs): zipfile
    # reads the 4 without complaint.
    short = zip_file(tmp_path / "short.pt", state, {"0": np.zeros(1, np.float32)})
    data, name = bytearray(short.read_bytes()), b"archive/data/0"
    for signature, name_length, name_at, size_at in ((b"PK\x01\x02", 28, 46, 24), (b"PK\x03\x04", 26, 30, 22)):
        at = data.find(signature)
        while at != -1:
            n = struct.unpack("<H", data[at + name_length : at + name_length + 2])[0]
            if data[at + name_at : at + name_at + n] == name:
                data[at + size_at : at + size_at + 4] = struct.pack("<I", 4000)  # the uncompressed size
            at = data.find(signature, at + 4)
    short.write_bytes(bytes(data))
    assert len(zipfile.ZipFile(short).read("archive/data/0")) == 4
    refusal(short, "archive/data/0")


def test_refuses_a_tiny_file_that_asks_for_a_huge_array(tmp_path):
    """Overlapping strides: 20,000 x 20,000 elements (1.6 GB) from a storage of 40,000."""
    state = {"w": tensor(storage("0", 40_000, legacy=False), 0, (20_000, 20_000), (1, 1))}
    refusal(zip_file(tmp_path / "amp.pt", state, {"0": np.zeros(40_000, np.float32)}), "more elements than its storage")


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_every_pickle_protocol_torch_can_write(tmp_path, protocol):
    """torch.save(..., pickle_protocol=4 or 5) memoizes with MEMOIZE and frames its opcodes."""
    state = {
        "w": tensor(storage("0", 2, legacy=False), 0, (2,), (1,)),
        "b": tensor(storage("1", 1, legacy=False), 0, (), ()),
    }
    buffer = io.BytesIO()
    Pickler(buffer, protocol=protocol).dump(state)
    storages = {"0": np.array([0.0, 1.0], np.float32), "1": np.array([2.0], np.float32)}
    path = zip_file(tmp_path / "p.pt", {}, storages, pickle_bytes=buffer.getvalue())
    loaded = load_state_dict(path)
    assert loaded["w"].tolist() == [0.0, 1.0] and loaded["b"].tolist() == 2.0


def test_a_list_filled_after_it_was_memoized_counts_its_depth(tmp_path):
    """A chain of lists, each memoized empty and then appended to the one before: as deep as the
    chain, though every list was shallow when memoized."""
    chain = bytearray(b"\x80\x02]q\x00")
    for i in range(1, 100):
        chain += b"]r" + struct.pack("<I", i) + b"j" + struct.pack("<I", i - 1) + b"a"
    pickle_bytes = b"\x80\x02}X\x01\x00\x00\x00w" + bytes(chain[2:]) + b"s."
    refusal(zip_file(tmp_path / "chain.pt", {}, {}, pickle_bytes=pickle_bytes), "nest more than")
