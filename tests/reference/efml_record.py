"""Records what ELMoForManyLangs 0.0.4.post2 computes, for the project's ELMoForManyLangs tests.
Runs ONLY in the side environment of tests/reference/efml.py (torch, elmoformanylangs); the
project never imports it.

    python efml_record.py JOB.json WORK_DIR

JOB.json (written by efml.py): the model folders (config.json, the model config, char.dic and
word.dic already there), each with the .npz of its weights under `token_embedder/<key>` and
`encoder/<key>` and whether its .pkl files take PyTorch's legacy format; the sentences. This
script loads the weights into THEIR modules (strictly: every key, every shape), saves the two
state dicts as their training does (`torch.save(module.state_dict(), ...)`), then runs their
`Embedder` on the folder and writes WORK_DIR/<model>.out.npz (the arrays under their HDF5 names,
efml_readme.md) and WORK_DIR/meta.json. Deterministic: one thread, fixed seeds, eval mode.
"""

import codecs
import hashlib
import importlib.metadata
import io
import json
import logging
import os
import pickle
import random
import sys
from pathlib import Path

# This folder holds the project's modules, which must not hide anything.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)

import elmoformanylangs  # noqa: E402
from elmoformanylangs import Embedder  # noqa: E402
from elmoformanylangs import elmo as efml_elmo  # noqa: E402
from elmoformanylangs.frontend import Model  # noqa: E402
from elmoformanylangs.modules import lstm_cell_with_projection  # noqa: E402
from elmoformanylangs.modules.embedding_layer import EmbeddingLayer  # noqa: E402

logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)


# ---- PyTorch's legacy (pre-1.6) format, with deterministic storage keys --------------------------


def save_legacy(obj, f, key=None) -> None:
    """torch.save(obj, f, _use_new_zipfile_serialization=False) for a state dict of CPU tensors,
    byte for byte, except that a storage's key is its number in order of first appearance
    ("0", "1", ...) where torch takes its memory address (str(storage._cdata)), which differs
    from run to run. `key` (a storage -> str) replaces that rule: check_legacy_writer gives it
    torch's, to show that nothing else differs."""
    from torch.serialization import (
        DEFAULT_PROTOCOL,
        INT_SIZE,
        LONG_SIZE,
        MAGIC_NUMBER,
        PROTOCOL_VERSION,
        SHORT_SIZE,
        _should_read_directly,
        location_tag,
    )

    keys: dict = {}
    storages: dict = {}

    def persistent_id(o):
        if isinstance(o, torch.storage.TypedStorage):
            storage = o._untyped_storage
            if key is None:
                k = keys.setdefault(storage._cdata, str(len(keys)))
            else:
                k = key(storage)
            storages.setdefault(k, (storage, o.dtype))
            return ("storage", getattr(torch, o._pickle_storage_type()), k, location_tag(storage), o._size(), None)
        if isinstance(o, type) and issubclass(o, torch.nn.Module):
            raise TypeError("save_legacy: state dicts only")
        return None

    class Pickler(pickle.Pickler):
        def persistent_id(self, o):
            return persistent_id(o)

    sys_info = {
        "protocol_version": PROTOCOL_VERSION,
        "little_endian": sys.byteorder == "little",
        "type_sizes": {"short": SHORT_SIZE, "int": INT_SIZE, "long": LONG_SIZE},
    }
    pickle.dump(MAGIC_NUMBER, f, protocol=DEFAULT_PROTOCOL)
    pickle.dump(PROTOCOL_VERSION, f, protocol=DEFAULT_PROTOCOL)
    pickle.dump(sys_info, f, protocol=DEFAULT_PROTOCOL)
    Pickler(f, protocol=DEFAULT_PROTOCOL).dump(obj)
    ordered = sorted(storages)
    pickle.dump(ordered, f, protocol=DEFAULT_PROTOCOL)
    f.flush()
    for k in ordered:
        storage, dtype = storages[k]
        storage._write_file(f, _should_read_directly(f), True, torch._utils._element_size(dtype))


def check_legacy_writer(state_dict) -> None:
    """save_legacy with torch's own storage keys writes what torch.save writes."""
    theirs = io.BytesIO()
    torch.save(state_dict, theirs, _use_new_zipfile_serialization=False)
    ours = io.BytesIO()
    save_legacy(state_dict, ours, key=lambda storage: str(storage._cdata))
    if theirs.getvalue() != ours.getvalue():
        raise RuntimeError("save_legacy no longer writes what torch.save(_use_new_zipfile_serialization=False) writes")


# ---- the clips, counted -----------------------------------------------------------------------


class ClipCounter:
    """Stands in for `torch` inside their lstm_cell_with_projection module: every attribute is
    torch's; `clamp` is torch's too, and counts, while `on`, the values it changes. Their cell
    calls it twice a time step, the memory cell first, then the projection."""

    def __init__(self):
        self.on = False
        self.calls = 0
        self.counts = {"cell": [0, 0], "proj": [0, 0]}

    def __getattr__(self, name):
        return getattr(torch, name)

    def clamp(self, x, lo, hi):
        if self.on:
            which = "cell" if self.calls % 2 == 0 else "proj"
            self.calls += 1
            self.counts[which][0] += int((x.abs() > hi).sum())
            self.counts[which][1] += x.numel()
        return torch.clamp(x, lo, hi)

    def fractions(self):
        return {k: round(n / max(total, 1), 4) for k, (n, total) in self.counts.items()}


COUNTER = ClipCounter()
lstm_cell_with_projection.torch = COUNTER


# ---- their batching, observed ---------------------------------------------------------------------

_create_batches = efml_elmo.create_batches
SEEN = []  # each sents2elmo's create_batches result


def observed_create_batches(*args, **kwargs):
    result = _create_batches(*args, **kwargs)
    SEEN.append(result)
    return result


efml_elmo.create_batches = observed_create_batches


def read_dic(path):
    """Their Embedder's reading of char.dic / word.dic (elmo.py, get_model), line for line."""
    lexicon = {}
    with codecs.open(path, "r", encoding="utf-8") as fpi:
        for line in fpi:
            tokens = line.strip().split("\t")
            if len(tokens) == 1:
                tokens.insert(0, "\u3000")
            token, i = tokens
            lexicon[token] = int(i)
    return lexicon


def config_of(folder: Path) -> dict:
    """Their Embedder's config lookup (elmo.py, get_model), followed the same way."""
    config_path = json.loads((folder / "config.json").read_text(encoding="utf-8"))["config_path"]
    path = os.path.join(folder, config_path)
    if not os.path.exists(path):
        path = os.path.join(folder, os.path.split(path)[1])
    with open(path) as f:
        return json.load(f)


def write_pkls(folder: Path, weights: dict, legacy: bool) -> None:
    config = config_of(folder)
    chars = read_dic(folder / "char.dic")
    words = read_dic(folder / "word.dic") if config["token_embedder"]["word_dim"] > 0 else None
    char_layer = EmbeddingLayer(config["token_embedder"]["char_dim"], chars, fix_emb=False, embs=None)
    word_layer = (
        EmbeddingLayer(config["token_embedder"]["word_dim"], words, fix_emb=False, embs=None) if words else None
    )
    model = Model(config, word_layer, char_layer, False)
    for part in ("token_embedder", "encoder"):
        module = getattr(model, part)
        state = {k[len(part) + 1 :]: torch.from_numpy(v) for k, v in weights.items() if k.startswith(part + "/")}
        module.load_state_dict(state, strict=True)
        for k, v in module.state_dict().items():
            if not torch.equal(v, state[k]):
                raise RuntimeError(f"{part}.{k} did not load as given")
        path = folder / f"{part}.pkl"
        if legacy:
            check_legacy_writer(module.state_dict())
            with open(path, "wb") as f:
                save_legacy(module.state_dict(), f)
        else:
            torch.save(module.state_dict(), path)


def store(arrays: dict, name: str, value) -> None:
    value = np.asarray(value)
    if value.dtype == np.float64:
        raise TypeError(f"{name}: float64")
    if value.dtype == np.int64:
        value = value.astype(np.int32)
    arrays[name] = value


def check_loaded(embedder: Embedder, weights: dict) -> None:
    """The Embedder's modules hold exactly the weights given."""
    for part in ("token_embedder", "encoder"):
        for k, v in getattr(embedder.model, part).state_dict().items():
            if not np.array_equal(v.numpy(), weights[f"{part}/{k}"]):
                raise RuntimeError(f"the Embedder's {part}.{k} differs from the weights saved")


def record(folder: Path, weights: dict, job: dict) -> tuple[dict, dict, list, dict]:
    sentences, second = job["sentences"], job["second"]
    arrays: dict = {}
    clips = None
    crashes: dict = {}
    for layer in job["output_layers"]:
        random.seed(0)
        embedder = Embedder(str(folder), batch_size=64)
        check_loaded(embedder, weights)
        SEEN.clear()
        COUNTER.on = layer == -2
        kept = list(range(len(sentences)))
        try:
            got = embedder.sents2elmo(sentences, output_layer=layer)
        except ZeroDivisionError as error:
            # output_layer=-1 averages each sentence's layers with np.average, which raises on
            # a sentence of no tokens: recorded without the empty sentences, under their own
            # indices, by another fresh Embedder
            if layer != -1 or COUNTER.on:
                raise
            crashes[str(layer)] = f"{type(error).__name__}: {error}"
            kept = [i for i, sentence in enumerate(sentences) if sentence]
            embedder = Embedder(str(folder), batch_size=64)
            got = embedder.sents2elmo([sentences[i] for i in kept], output_layer=layer)
        COUNTER.on = False
        if layer == -2:
            clips = COUNTER.fractions()
            w, c, lens, masks, _text, recover = SEEN[0]
            if len(c) != 1:
                raise RuntimeError("expected one batch")
            if w[0] is not None:
                store(arrays, "ids/word_ids", w[0].numpy())
            store(arrays, "ids/char_ids", c[0].numpy())
            store(arrays, "ids/lengths", np.asarray(lens[0], np.int64))
            store(arrays, "ids/mask", masks[0][0].numpy())
            store(arrays, "ids/prev_index", masks[0][1].numpy())
            store(arrays, "ids/next_index", masks[0][2].numpy())
            store(arrays, "ids/order", np.asarray(recover, np.int64))
        for i, value in zip(kept, got, strict=True):
            store(arrays, f"fresh/{layer}/{i}", value)
    embedder = Embedder(str(folder), batch_size=64)
    for k, batch in enumerate((sentences, second)):
        for i, value in enumerate(embedder.sents2elmo(batch, output_layer=-2)):
            store(arrays, f"stateful/{k}/{i}", value)
    embedder = Embedder(str(folder), batch_size=job["multi_batch_size"])
    SEEN.clear()
    random.seed(job["multi_seed"])
    got = embedder.sents2elmo(sentences, output_layer=-2)
    for i, value in enumerate(got):
        store(arrays, f"multibatch/{i}", value)
    _w, _c, lens, _masks, _text, recover = SEEN[0]
    batches, start = [], 0
    for batch_lens in lens:  # recover = the sentences' indices in the order the batches ran
        batches.append(recover[start : start + len(batch_lens)])
        start += len(batch_lens)
    store(arrays, "multibatch/batches", np.asarray(batches, np.int64))
    return arrays, clips, batches, crashes


def sources_sha256() -> dict:
    package = Path(elmoformanylangs.__file__).resolve().parent
    return {
        str(path.relative_to(package)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(package.rglob("*"))
        if path.is_file() and path.suffix in (".py", ".json")
    }


def main(job_file: Path, work: Path) -> None:
    job = json.loads(job_file.read_text(encoding="utf-8"))
    meta = {"clip_fractions": {}, "multi_batches": {}, "crashes": {}}
    for name, model in job["models"].items():
        folder = Path(model["folder"])
        with np.load(model["weights"]) as data:
            weights = {k: data[k] for k in data.files}
        write_pkls(folder, weights, model["legacy"])
        arrays, clips, batches, crashes = record(folder, weights, job)
        meta["clip_fractions"][name] = clips
        meta["crashes"][name] = crashes
        meta["multi_batches"][name] = batches
        np.savez(work / f"{name}.out.npz", **arrays)
        print(f"{name}: {len(arrays)} datasets, clip fractions {clips}")
    meta["versions"] = {
        "elmoformanylangs": importlib.metadata.version("elmoformanylangs"),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "h5py": h5py.__version__,
        "overrides": importlib.metadata.version("overrides"),
        "python": "{}.{}".format(*sys.version_info[:2]),
    }
    meta["sources_sha256"] = sources_sha256()
    (work / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
