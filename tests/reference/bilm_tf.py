"""The bilm-tf half of the fixture generator: `make(out)` writes out/elmo/, out/bilm-tf/model/
and out/bilm_tf_training/ (tests/fixtures/README.md) by running the original bilm-tf code.

bilm-tf (allenai/bilm-tf @ 7cffee2 = PyPI bilm 0.1.post5, checked by wheel sha256 and the git
blob ids of its five modules) runs in a side environment of its own (`ENV`: tensorflow-cpu
2.21 in compat.v1 graph mode, with tf-keras 2.21 for `tf.nn.rnn_cell`), after two compatibility
patches applied here to a pristine copy: `import tensorflow as tf` becomes
`import tensorflow.compat.v1 as tf` + `tf.disable_v2_behavior()` (TF_USE_LEGACY_KERAS=1 first),
and LMDataset.get_sentence returns where `_load_random_shard` raises StopIteration (PEP 479).
Neither touches arithmetic.

What runs where:
- here (the project's Python): the random weights (numpy, seeded) in bilm-tf's HDF5 layout,
  the sentences, the training text, and every HDF5 file written (deterministically: fixed
  dataset order, no timestamps, JSON with sorted keys);
- in the side environment: `bilm_tf_inference.py` (the two inference models: Batcher +
  stateful BidirectionalLanguageModel + weight_layers + dump_token_embeddings) and
  `bilm_tf_training.py` (four steps of bilm.training.train() with observers). They hand back
  .npz files and JSON; they are never imported by the project.

    python -m tests.reference.bilm_tf [OUT]      # OUT defaults to tests/fixtures
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from tests.reference.side_env import SideEnv

HERE = Path(__file__).resolve().parent

ENV = SideEnv(
    "bilm-tf",
    ("tensorflow-cpu==2.21.0", "numpy==2.4.6", "h5py==3.14.0"),
    no_deps=("tf-keras==2.21.0",),  # --no-deps: the full `tensorflow` wheel must not come in beside tensorflow-cpu
)
BILM_VERSION = "0.1.post5"
BILM_WHEEL = f"bilm-{BILM_VERSION}-py3-none-any.whl"
BILM_WHEEL_SHA256 = "98a2e3c332bcefcccda6bf6056f8a0be52c474e62bcb0817787010b22b6969a3"
TENSORFLOW_VERSION = "2.21.0"
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
# The side processes: CPU only, single-threaded (SideEnv.run sets OMP_NUM_THREADS=1; the scripts
# set TF's thread pools to 1), oneDNN off, so that a rerun gives the same bytes.
SIDE_ENV = {
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_USE_LEGACY_KERAS": "1",
    "PYTHONUTF8": "1",
    "PYTHONWARNINGS": "ignore::SyntaxWarning",  # bilm/elmo.py's docstring has a '\\l'
}


# ---- the bilm-tf package ------------------------------------------------------------------------


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


# ---- deterministic files --------------------------------------------------------------------------


def write_json(path: Path, value: object, ascii_only: bool = False) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=ascii_only) + "\n", encoding="utf-8")


def write_text(path: Path, lines: list[str], final_newline: bool = True) -> None:
    path.write_bytes(("\n".join(lines) + ("\n" if final_newline else "")).encode("utf-8"))


def write_hdf5(
    path: Path,
    datasets: dict[str, np.ndarray],
    attrs: dict[str, dict[str, object]] | None = None,
    root_attrs: dict[str, object] | None = None,
) -> None:
    """One HDF5 file, the same bytes for the same content: datasets in sorted name order, no
    timestamps; numeric arrays of 256+ elements gzip-compressed (shuffle filter, level 9); file
    format of HDF5 1.10 (compact groups and chunk indexes; any h5py of the last years reads it).
    `attrs` maps a dataset's or group's name to its attributes."""
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
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


# ---- the inference models -------------------------------------------------------------------------

OPTIONS = {
    "lstm": {"cell_clip": 3, "n_layers": 2, "proj_clip": 3, "projection_dim": 16, "dim": 64},
    "char_cnn": {
        "embedding": {"dim": 4},
        "filters": [[1, 4], [2, 8], [3, 16], [4, 32], [5, 64]],
        "n_highway": 2,
        "n_characters": 262,
        "max_characters_per_token": 50,
        "activation": "relu",
    },
}
# Where the weights come from: a numpy Generator seeded by model (and the mixes' scalars).
MODELS = {"elmo": (True, 20261, "sentences.json"), "bilm-tf/model": (False, 20262, "lm_embeddings_sentences.json")}

# 3 lists of 10 sentences; batch i = [SENTENCES[0][i], SENTENCES[1][i], SENTENCES[2][i]] (so each
# batch mixes very different lengths). Awkward on purpose: one word, an empty sentence (bilm-tf's
# Batcher gives it <S> </S> only: 0 output positions, but the LSTM still runs over the two
# boundaries and carries that state on), words longer than 48 bytes (cut; one cut in the middle of
# a 2-byte ü), accents, CJK, emoji (4 bytes, and a variation selector), a lone surrogate (dropped by
# encode('utf-8', 'ignore')), punctuation, repeats, and the literal tokens <S> and </S> (which both
# bilm-tf's Batcher, given a vocabulary that holds them, and elmo_jax.text.chars encode as the
# sentence-boundary characters).
LONG_CUT_IN_U = "Grundstücksverkehrsgenehmigungszuständigkeitsübertragungsverordnung"  # 70 bytes, byte 48 is half a ü
LONG_ASCII = "Pneumonoultramicroscopicsilicovolcanoconiosis-is-a-word-of-sixty-plus"
SENTENCES = [
    [
        "Hello",
        "",
        "The cat sat on the mat .",
        f"The {LONG_CUT_IN_U} is in force .",
        "café naïve Zürich résumé façade",
        "東京 は 大きい 都市 です 。",
        "I ❤️ 🍕 and 🎉 !",
        "the the the the the the the the .",
        "<S> and </S> are just tokens here .",
        "In 2009 , the U.S. economy -- battered -- shrank ; most had predicted worse .",
    ],
    [
        "Why would anyone write a sentence like this one , with so many words , if not to test it ?",
        "OK",
        'He said : " no ! " and left ... ?!',
        "x",
        "Ça va ? Très bien , merci .",
        f"{LONG_ASCII} {LONG_ASCII}",
        "北京 上海 广州 深圳",
        "a\ud800b is a word with a lone surrogate",
        "dogs dogs dogs",
        "",
    ],
    [
        "Good morning , Vietnam !",
        "The quick brown fox jumps over the lazy dog .",
        "🎉",
        "naïve naïve naïve café",
        "' s n't 're -- ... ( ) [ ] { } $ % & @ # *",
        "one",
        "The Ünïcödé wörds ǅ ﬁ Ⅻ are odd",
        "It was the best of times , it was the worst of times .",
        "</S> <S>",
        "end .",
    ],
]


def _quantized(rng: np.random.Generator, shape: tuple[int, ...], scale: float, mean: float = 0.0) -> np.ndarray:
    """Normal(mean, scale) values rounded to multiples of 1/128: exact in float32 with short
    mantissas, so the weight files compress (each draw is still random enough)."""
    return (np.round(rng.normal(mean, scale, shape) * 128) / 128).astype(np.float32)


def random_weights(options: dict, seed: int) -> dict[str, np.ndarray]:
    """Weights in bilm-tf's HDF5 layout (ELMO_SPEC.md section 3), scaled so that the token
    vectors are of order 1 and the LSTMs' cell clip and projection clip both fire at a visible
    fraction of positions (the generator prints the fractions; the biases are non-zero)."""
    rng = np.random.default_rng(seed)
    cnn, lstm = options["char_cnn"], options["lstm"]
    D, P, C = cnn["embedding"]["dim"], lstm["projection_dim"], lstm["dim"]
    F = sum(n for _, n in cnn["filters"])
    w: dict[str, np.ndarray] = {"char_embed": (np.round(rng.uniform(-1, 1, (261, D)) * 128) / 128).astype(np.float32)}
    for i, (width, n) in enumerate(cnn["filters"]):
        w[f"CNN/W_cnn_{i}"] = _quantized(rng, (1, width, D, n), 0.6 / np.sqrt(width * D) * 2)
        w[f"CNN/b_cnn_{i}"] = _quantized(rng, (n,), 0.2)
    for k in range(cnn["n_highway"]):
        w[f"CNN_high_{k}/W_carry"] = _quantized(rng, (F, F), 1 / np.sqrt(F))
        w[f"CNN_high_{k}/W_transform"] = _quantized(rng, (F, F), 1 / np.sqrt(F))
        w[f"CNN_high_{k}/b_carry"] = _quantized(rng, (F,), 0.5, -1.0)
        w[f"CNN_high_{k}/b_transform"] = _quantized(rng, (F,), 0.2)
    w["CNN_proj/W_proj"] = _quantized(rng, (F, P), 1.5 / np.sqrt(F))
    w["CNN_proj/b_proj"] = _quantized(rng, (P,), 0.2)
    for d in range(2):
        for layer in range(lstm["n_layers"]):
            prefix = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            # rows [input; h_prev]: strong inputs drive the clips, weak recurrent rows keep the
            # carried state contractive (float32 rounding must not grow from batch to batch)
            w[f"{prefix}/W_0"] = np.concatenate([_quantized(rng, (P, 4 * C), 0.3), _quantized(rng, (P, 4 * C), 0.08)])
            # gate blocks i, j, f, o: a wide j bias gives units a steady sign, f's a long memory
            bias = _quantized(rng, (4, C), 0.5)
            bias[1] *= 2
            bias[2] += 0.5
            w[f"{prefix}/B"] = bias.reshape(-1)
            w[f"{prefix}/W_P_0"] = _quantized(rng, (C, P), 0.45)
    return w


# The weight_layers settings recorded per model (bilm/elmo.py): name -> (use_top_only, do_layer_norm).
MIXES = {
    "mix": (False, False),
    "mix_layer_norm": (False, True),
    "top_only_layer_norm": (True, True),  # bilm-tf applies no layer norm with use_top_only: gamma x top
}


def vocabulary() -> list[str]:
    """vocab_test.txt: <S>, </S>, <UNK> (bilm-tf's vocabulary needs them; with them the Batcher
    encodes a literal <S> as the boundary), the sentences' words in order of first appearance
    (those that UTF-8 can write), an empty-string word, and a few more."""
    words = ["<S>", "</S>", "<UNK>"]
    for sentences in SENTENCES:
        for sentence in sentences:
            for word in sentence.split():
                try:
                    word.encode("utf-8")
                except UnicodeEncodeError:
                    continue
                if word not in words:
                    words.append(word)
    words.insert(len(words) // 2, "")  # the empty token: [BOW, EOW]
    return words + ["x" * 48, "y" * 49, "é" * 24 + "z"]


def make_models(out: Path, scratch: Path) -> dict:
    """out/elmo and out/bilm-tf/model: weights, sentences, and what bilm-tf computes of them."""
    words = vocabulary()
    stats = {}
    for name, (skip, seed, sentences_file) in MODELS.items():
        folder = out / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        options = json.loads(json.dumps(OPTIONS))
        options["lstm"]["use_skip_connections"] = skip
        write_json(folder / "options.json", options)
        write_hdf5(folder / "lm_weights.hdf5", random_weights(options, seed))
        write_json(folder / sentences_file, SENTENCES, ascii_only=True)  # a lone surrogate: JSON escapes only
        write_text(folder / "vocab_test.txt", words, final_newline=False)
        rng = np.random.default_rng(seed + 1000)
        mixes: dict[str, dict[str, Any]] = {}
        for mix_name, (top, norm) in MIXES.items():  # multiples of 1/64: exact in float32 and in JSON
            mixes[mix_name] = {
                "use_top_only": top,
                "do_layer_norm": norm,
                "W": (np.round(rng.normal(0, 1, 3) * 64) / 64).tolist(),
                "gamma": float(np.round(rng.uniform(0.5, 2.0) * 64) / 64),
            }
        job = {
            "options_file": str(folder / "options.json"),
            "weight_file": str(folder / "lm_weights.hdf5"),
            "vocab_file": str(folder / "vocab_test.txt"),
            "sentences_file": str(folder / sentences_file),
            "mixes": mixes,
        }
        write_json(scratch / "job.json", job)
        run_side("bilm_tf_inference.py", scratch / "job.json", scratch / "out.npz", scratch / "stats.json")
        got = load_npz(scratch / "out.npz")
        stats[name] = json.loads((scratch / "stats.json").read_text())
        for k in range(3):
            write_hdf5(folder / f"lm_embeddings_{k}.hdf5", {str(i): got[f"lm_embeddings/{k}/{i}"] for i in range(10)})
        write_hdf5(folder / "elmo_token_embeddings.hdf5", {"embedding": got["token_embeddings"]})
        layers = {key[len("layers/") :]: value for key, value in got.items() if key.startswith("layers/")}
        layer_attrs: dict[str, dict[str, object]] = {}
        for mix_name, setting in mixes.items():
            layers[f"weight_layers/{mix_name}/W"] = np.asarray(setting["W"], np.float32)
            layers[f"weight_layers/{mix_name}/gamma"] = np.asarray(setting["gamma"], np.float32)
            layer_attrs[f"weight_layers/{mix_name}/output"] = {
                "use_top_only": setting["use_top_only"],
                "do_layer_norm": setting["do_layer_norm"],
            }
        write_hdf5(
            folder / "layers.hdf5",
            layers,
            layer_attrs,
            root_attrs={
                "description": LAYERS_DESCRIPTION,
                "bilm_version": BILM_VERSION,
                "tensorflow_version": TENSORFLOW_VERSION,
                "n_batches": 10,
            },
        )
    return stats


LAYERS_DESCRIPTION = (
    "Everything bilm-tf's BidirectionalLanguageModel (max_batch_size 4, stateful) computed for the "
    "10 batches of 3 sentences of sentences.json (batch i = sentences[0][i], [1][i], [2][i]). "
    "batch_i/char_ids (3, T, 50): the Batcher's ids (+1 shifted, <S>/</S> added, 0 = padding); "
    "batch_i/token_layer (3, T, P): the char-CNN token vectors (padded positions hold the CNN of an "
    "all-zero token, not 0); batch_i/lstm/{forward,backward}/layer_l (3, T, P): each LSTM layer's "
    "output in sentence order (skip connection included), 0 at padding; "
    "batch_i/final_state/{forward,backward}/layer_l/{c,h} (3, C), (3, P): the state batch i left in the graph's "
    "state variables (their first 3 rows), which batch i + 1 starts from (batch 0 starts from zeros); "
    "weight_layers/<mix>/output/batch_i (3, T - 2, 2P): bilm.elmo.weight_layers on the biLM's "
    "lm_embeddings (boundaries removed) with scalar weights W and gamma assigned "
    "(attributes use_top_only, do_layer_norm); only positions under the mask are meaningful."
)


# ---- the training fixture -------------------------------------------------------------------------

TRAINING_OPTIONS: dict[str, Any] = {
    "all_clip_norm_val": 1.3,
    "batch_size": 4,
    "bidirectional": True,
    "char_cnn": {
        "activation": "relu",
        "embedding": {"dim": 4},
        "filters": [[1, 4], [2, 8], [3, 8]],
        "max_characters_per_token": 50,
        "n_characters": 261,
        "n_highway": 1,
    },
    "dropout": 0.0,
    "learning_rate": 0.2,
    "lstm": {
        "cell_clip": 3,
        "dim": 16,
        "n_layers": 2,
        "proj_clip": 3,
        "projection_dim": 8,
        "use_skip_connections": True,
    },
    "n_epochs": 1,
    "n_train_tokens": 80,  # = 4 batches x 4 rows x 5 steps: train() stops after 4 batches
    "sample_softmax": False,
    "unroll_steps": 5,
}
OOV_WORD = "quokka"
LONG_WORD = "Taumatawhakatangihangakoauauotamateaturipukakapikimaungahoronukupokaiwhenuakitanatahu"  # 85 bytes
TRAIN_TEXT = [
    "a little dog ran across the road .",
    f"the {OOV_WORD} smiled at a tourist in Genève .",
    f"{LONG_WORD} is a hill .",
    "it snowed .",
    "my aunt ordered crème brûlée and tea in 東京 .",
    "the road was long and the dog was tired .",
    "a bird sang .",
]
TRAINING_DESCRIPTION = (
    "4 training steps of bilm-tf's bilm.training.train() (bilm 0.1.post5, TensorFlow 2.21.0 compat.v1 graph "
    "mode, CPU, single-threaded, oneDNN off): tiny char-CNN biLM, full softmax, no dropout, one tower, "
    "Adagrad(lr, initial_accumulator_value=1.0) on the gradient of unroll_steps * loss clipped to global norm "
    "all_clip_norm_val, LSTM state carried between steps; graph seed 0. Layout and conventions: README.md "
    "beside this file."
)


def make_training(out: Path, scratch: Path) -> dict:
    folder = out / "bilm_tf_training"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    vocab = ["<S>", "</S>", "<UNK>"]
    for word in " ".join(TRAIN_TEXT).split():
        if word != OOV_WORD and word not in vocab:
            vocab.append(word)
    options: dict[str, Any] = {**TRAINING_OPTIONS, "n_tokens_vocab": len(vocab)}
    positions = sum(len(s.split()) + 1 for s in TRAIN_TEXT)
    assert positions < 4 * options["batch_size"] * options["unroll_steps"], "the text must be too short for 4 batches"
    write_json(folder / "options.json", options)
    write_text(folder / "vocab.txt", vocab)
    write_text(folder / "train.txt", TRAIN_TEXT)
    job = {
        "options": options,
        "train_file": str(folder / "train.txt"),
        "vocab_file": str(folder / "vocab.txt"),
        "save_dir": str(scratch / "train_save"),
    }
    write_json(scratch / "train_job.json", job)
    run_side("bilm_tf_training.py", scratch / "train_job.json", scratch / "train.npz", scratch / "train.json")
    got = load_npz(scratch / "train.npz")
    meta = json.loads((scratch / "train.json").read_text())
    datasets: dict[str, np.ndarray] = {
        "meta/vocab": np.array(vocab, dtype=object),
        "meta/trainable_variables": np.array(meta["trainable_variables"], dtype=object),
        "meta/gradient_variables": np.array(meta["gradient_variables"], dtype=object),
    }
    datasets.update(got)
    write_hdf5(
        folder / "fixture.hdf5",
        datasets,
        meta["attrs"],
        root_attrs={
            "options": json.dumps(options, sort_keys=True),
            "bilm_version": BILM_VERSION,
            "tensorflow_version": TENSORFLOW_VERSION,
            "description": TRAINING_DESCRIPTION,
            "n_steps": np.int64(4),
            "loss_scale": np.int64(options["unroll_steps"]),
            "char_id_convention": "raw training ids 0-260 (bytes 0-255, BOS 256, EOS 257, BOW 258, EOW 259, "
            "pad 260); no +1 shift",
        },
    )
    write_training_readme(folder, options, vocab, meta["summary"])
    return meta["summary"]


def write_training_readme(folder: Path, options: dict[str, Any], vocab: list[str], summary: list[dict]) -> None:
    """README.md of out/bilm_tf_training: provenance, layout, conventions, recorded values."""
    clip = options["all_clip_norm_val"]
    fired = [row["step"] for row in summary if row["clip_fired"]]
    rows = "\n".join(
        f"| {r['step']} | {r['loss']:.6f} | {r['loss_forward']:.6f} | {r['loss_backward']:.6f} | "
        f"{r['grad_norm']:.6f} | {'fired' if r['clip_fired'] else '-'} |"
        for r in summary
    )
    hashes = "\n".join(
        f"{hashlib.sha256((folder / name).read_bytes()).hexdigest()}  {name}"
        for name in ("fixture.hdf5", "options.json", "train.txt", "vocab.txt")
    )
    long_bytes = len(LONG_WORD.encode())
    text = TRAINING_README.format(
        n_vocab=len(vocab),
        n_sentences=len(TRAIN_TEXT),
        positions=sum(len(s.split()) + 1 for s in TRAIN_TEXT),
        oov=OOV_WORD,
        long_word=LONG_WORD,
        long_bytes=long_bytes,
        clip=clip,
        fired=" and ".join(map(str, fired)),
        not_fired=" and ".join(str(r["step"]) for r in summary if not r["clip_fired"]),
        rows=rows,
        hashes=hashes,
    )
    (folder / "README.md").write_text(text, encoding="utf-8")


# bilm_tf_training/README.md, a str.format template (its braces doubled)
TRAINING_README = (HERE / "bilm_tf_training_readme.md").read_text(encoding="utf-8")


def make(out: Path) -> None:
    """Writes out/elmo, out/bilm-tf/model and out/bilm_tf_training (each replaced whole)."""
    out = Path(out)
    start = time.time()
    ENV.ensure()
    print(f"bilm-tf environment ready: {time.time() - start:.0f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bilm-tf-fixtures-") as tmp:
        scratch = Path(tmp)
        stats = make_models(out, scratch)
        for name, s in stats.items():
            print(f"{name}: {json.dumps(s, sort_keys=True)}", flush=True)
        summary = make_training(out, scratch)
        for row in summary:
            print(f"bilm_tf_training {json.dumps(row, sort_keys=True)}", flush=True)
    print(f"bilm-tf fixtures written to {out}: {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    import sys

    make(Path(sys.argv[1] if len(sys.argv) > 1 else HERE.parent / "fixtures"))
