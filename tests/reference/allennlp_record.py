"""Records what AllenNLP 2.10.1 computes, for tests/test_allennlp_fixtures.py. Runs ONLY in the
side environment of tests/reference/allennlp.py (torch, allennlp); the project never imports it.

    python allennlp_record.py MODEL_DIR OUT.npz OUT.json

MODEL_DIR holds options.json and lm_weights.hdf5 (bilm-tf's layout). OUT.npz gets the arrays
under their allennlp.hdf5 dataset names (float32; masks uint8; char ids int32), OUT.json the
inputs (token lists, mixes) and the versions; allennlp.py writes the fixture files from them
(tests/reference/allennlp_readme.md says what each dataset is). Deterministic: one thread, fixed
seeds, no dropout.
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

# This folder holds the project's allennlp.py, which must not hide the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

# allennlp's package imports reach for heavy optional packages that its ELMo never uses at run
# time. Where one is not installed, a placeholder module answers: any attribute is a fresh
# dummy class; `cached_path` resolves existing local files only.
PLACEHOLDERS = {"transformers", "spacy", "huggingface_hub", "torchvision", "fairscale", "cached_path"}


class _Placeholder(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (object,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


def _local_file(url_or_filename, *args, **kwargs):
    path = os.fspath(url_or_filename)
    if not os.path.exists(path):
        raise FileNotFoundError(f"placeholder cached_path: only existing local files, not {path!r}")
    return path


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top not in PLACEHOLDERS:
            return None
        if fullname == top and importlib.machinery.PathFinder.find_spec(fullname) is not None:
            return None  # the real package is installed
        if fullname != top and not isinstance(sys.modules.get(top), _Placeholder):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _Placeholder(spec.name)
        module.__path__ = []
        if spec.name == "cached_path":
            module.cached_path = _local_file
            module.is_url_or_existing_file = lambda path: os.path.exists(os.fspath(path))
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_PlaceholderFinder())

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)

import allennlp  # noqa: E402
from allennlp.modules.elmo import Elmo, _ElmoBiLm, batch_to_ids  # noqa: E402
from allennlp.version import VERSION as ALLENNLP_VERSION  # noqa: E402

SETTINGS = [(False, False), (True, False), (False, True), (True, True)]  # (do_layer_norm, keep_sentence_boundaries)
MIX = [0.5, -0.25, 1.0]  # scalar_mix_parameters: representation 0 (gamma 1)
MIX_1 = [-1.0, 0.3, 0.2]  # set afterwards into representation 1's mix, with gamma GAMMA_1
GAMMA_1 = 1.5
GRAD_GAMMA = 1.25  # the gradient's trainable mix starts at MIX and this gamma

# batch_to_ids on awkward tokens: an empty sentence, one word, long words (bytes cut at 48,
# once inside a multi-byte character), multi-byte UTF-8, the literal boundary and <UNK> tokens,
# whitespace-ish and control tokens, an empty-string token, a lone surrogate (dropped by
# "ignore"), and a long sentence beside short ones.
AWKWARD = [
    ["Anbenna", "wrote", "x" * 70, "a" + "é" * 30, "日本語のテキスト" * 3, "😀" * 13],
    [],
    ["word"],
    ["naïve", "café", "e\u0301", "日本語", "😀", "👩\u200d💻", "🇫🇷", "Ω≈ç√", "ß", "İ", "\u0301"],
    ["the", "<S>", "a", "</S>", "<UNK>", "<s>", "</s>", "<S>x", "S"],
    [" ", "\t", "\n", "\u00a0", "\u200b", "\u3000", "", "\x00", "\x7f", "a\ud800b"],
    ("a long sentence of forty tokens that goes on and on " * 4).split()[:40],
    ["."],
]

# Elmo and _ElmoBiLm batches, each through a fresh module (zero state): rows of different
# lengths, an empty sentence among others, a single row.
FRESH = [
    [
        ["The", "muddy", "river", "bank", "floods", "every", "spring", "."],
        ["Anbenna", "saves"],
        ["naïve", "日本語", "<S>", "x" * 60, "</S>", "<UNK>"],
        ["a"],
    ],
    [
        ["She", "sat", "on", "the", "bank", "."],
        [],
        ["He", "played", "the", "bass", "guitar", "at", "the", "river", "bank", "all", "night", "long", "."],
    ],
    [["One", "sentence", "alone", ",", "with", "some", "punctuation", ":", "yes", "!"]],
]

# One _ElmoBiLm called on these batches in turn: AllenNLP carries each row's LSTM state into
# the next call (row i continues from row i's state; an empty sentence still runs <S> </S>).
STATEFUL = [
    [["The", "first", "row", "starts", "."], ["Second", "row", "here"], ["a", "b", "c", "d", "e", "f", "g"]],
    [["then", "more", "text"], [], ["short", "and", "the", "third", "row", "goes", "on", "a", "while", "."]],
    [["and", "the", "end", "."], ["fin"], ["the", "third", "row", "ends", "with", "this", "one", "."]],
]

GRAD_BATCH = 0  # FRESH[0]


def store(arrays: dict, name: str, value) -> None:
    value = np.asarray(value)
    if value.dtype == np.float64:
        raise TypeError(name)
    if value.dtype == bool:
        value = value.astype(np.uint8)
    if value.dtype == np.int64:  # char ids: torch's int64, ours int32
        value = value.astype(np.int32)
    arrays[name] = value


def elmo(model: Path, do_layer_norm: bool, keep: bool, mix=MIX, representations: int = 2) -> Elmo:
    module = Elmo(
        str(model / "options.json"),
        str(model / "lm_weights.hdf5"),
        num_output_representations=representations,
        dropout=0.0,
        do_layer_norm=do_layer_norm,
        keep_sentence_boundaries=keep,
        scalar_mix_parameters=mix,
    )
    if representations > 1:
        second = module._scalar_mixes[1]
        with torch.no_grad():
            for parameter, value in zip(second.scalar_parameters, MIX_1):
                parameter.fill_(value)
            second.gamma.fill_(GAMMA_1)
    return module.eval()


def bilm(model: Path) -> _ElmoBiLm:
    return _ElmoBiLm(str(model / "options.json"), str(model / "lm_weights.hdf5")).eval()


def main(model: Path, out_file: Path, meta_file: Path) -> None:
    arrays: dict = {}
    store(arrays, "awkward/char_ids", batch_to_ids(AWKWARD).numpy())
    for i, batch in enumerate(FRESH):
        ids = batch_to_ids(batch)
        store(arrays, f"fresh/{i}/char_ids", ids.numpy())
        with torch.no_grad():
            got = bilm(model)(ids)
        store(arrays, f"fresh/{i}/activations", torch.stack(got["activations"]).numpy())
        store(arrays, f"fresh/{i}/mask", got["mask"].numpy())
        for norm, keep in SETTINGS:
            with torch.no_grad():
                got = elmo(model, norm, keep)(ids)
            key = f"fresh/{i}/elmo_norm{int(norm)}_keep{int(keep)}"
            for k, representation in enumerate(got["elmo_representations"]):
                store(arrays, f"{key}/representation{k}", representation.numpy())
            store(arrays, f"{key}/mask", got["mask"].numpy())
    stateful = bilm(model)
    for i, batch in enumerate(STATEFUL):
        ids = batch_to_ids(batch)
        store(arrays, f"stateful/{i}/char_ids", ids.numpy())
        with torch.no_grad():
            got = stateful(ids)
        store(arrays, f"stateful/{i}/activations", torch.stack(got["activations"]).numpy())
        store(arrays, f"stateful/{i}/mask", got["mask"].numpy())
    ids = batch_to_ids(FRESH[GRAD_BATCH])
    for norm in (False, True):
        module = elmo(model, norm, False, mix=None, representations=1)
        mix = module._scalar_mixes[0]
        with torch.no_grad():
            for parameter, value in zip(mix.scalar_parameters, MIX):
                parameter.fill_(value)
            mix.gamma.fill_(GRAD_GAMMA)
        representation = module(ids)["elmo_representations"][0]
        loss = (representation**2).mean()
        loss.backward()
        key = f"grad/norm{int(norm)}"
        store(arrays, f"{key}/loss", loss.detach().numpy())
        store(arrays, f"{key}/scalar_parameters", torch.cat([p.grad for p in mix.scalar_parameters]).numpy())
        store(arrays, f"{key}/gamma", mix.gamma.grad.numpy().reshape(()))
    meta = {
        "awkward": AWKWARD,
        "fresh": FRESH,
        "stateful": STATEFUL,
        "grad_batch": GRAD_BATCH,
        "mixes": {"scalar_mix_parameters": MIX, "mix_1": MIX_1, "gamma_1": GAMMA_1, "grad_gamma": GRAD_GAMMA},
        "versions": {
            "allennlp": ALLENNLP_VERSION,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "h5py": h5py.__version__,
            "python": "{}.{}".format(*sys.version_info[:2]),
        },
    }
    assert allennlp.__name__ == "allennlp"
    np.savez(out_file, **arrays)
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    print(f"AllenNLP {ALLENNLP_VERSION}: recorded {len(arrays)} datasets")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
