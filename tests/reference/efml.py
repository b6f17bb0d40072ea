"""The ELMoForManyLangs half of the fixture generator: `make(out)` writes out/efml/ (read by the
tests of elmo_jax's ELMoForManyLangs support; the layout is in efml_readme.md, copied there as
README.md): two small model folders in the exact layout HIT-SCIR's `elmoformanylangs.Embedder`
loads, with seeded random weights, and what their `Embedder.sents2elmo` computes from them.

What runs where:
- here (the project's Python): the random weights (numpy, seeded), config.json, the model
  config, char.dic and word.dic, the sentences, and every recorded file (files.py);
- in the side environment (`ENV`: elmoformanylangs 0.0.4.post2 without its dependencies, torch
  2.13.0 CPU, numpy, h5py, overrides 3.1.0; exact versions in efml.lock.txt): efml_record.py,
  which loads the weights into their own modules and saves `token_embedder.pkl` and
  `encoder.pkl` with torch (the one format only torch writes: PyTorch's legacy pickle format
  for one model, the zip format for the other), then runs their Embedder and hands back .npz
  and JSON. Their code is never imported by the project.

`embed(folder, sentences)` runs efml_embed.py there on any model folder (a fresh Embedder,
output_layer=-2), for the export round trip; `env_built()` says, without building anything,
whether the environment is there (a test can skip where it is not).

The interpreter: python3.11 where the machine has one, as allennlp.py says why (torch 2.13.0's
CPU wheel on this project's machine is the cp311 build).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from tests.reference.files import load_npz, write_hdf5, write_json, write_text
from tests.reference.side_env import SideEnv

HERE = Path(__file__).resolve().parent
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EFML_VERSION = "0.0.4.post2"

ENV = SideEnv(
    name="efml",
    requirements=("torch==2.13.0+cpu", "numpy==2.4.6", "h5py==3.16.0", "overrides==3.1.0"),
    # their code needs overrides < 4 (newer ones refuse its method signatures at import)
    no_deps=(f"elmoformanylangs=={EFML_VERSION}",),
    python=shutil.which("python3.11") or sys.executable,
    index_urls=(TORCH_CPU_INDEX,),
    lock=HERE / "efml.lock.txt",
)

RECORDER = HERE / "efml_record.py"
EMBEDDER = HERE / "efml_embed.py"
README = HERE / "efml_readme.md"
FOLDER = "efml"  # under `out`

# ---- the models -------------------------------------------------------------------------------

# The published models' config (their package's configs/cnn_50_100_512_4096_sample.json), shrunk.
# `classifier` is read only by their training code; `dropout` by the encoder's constructor (used
# in training mode only).
MODEL_CONFIG = {
    "encoder": {"name": "elmo", "projection_dim": 16, "cell_clip": 3, "proj_clip": 3, "dim": 32, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 4], [2, 4], [3, 8]],
        "n_highway": 2,
        "word_dim": 8,
        "char_dim": 8,
        "max_characters_per_token": 50,
    },
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}

# name -> (word_dim, seed of the weights, legacy .pkl format, config_path written in config.json).
# cnn_word_elmo is the published kind (word embedding + char CNN; .pkl files in PyTorch's pre-1.6
# format, as the published models, saved by PyTorch 0.4, are) and names its model config by a
# path relative to the folder; cnn_elmo has no word embedding, zip-format .pkl files, and an
# absolute config_path that does not exist, as the published config.json files have (their
# Embedder then tries the folder + the path's file name, which is there).
MODELS = {
    "cnn_word_elmo": (8, 31001, True, "cnn_8_8_16_32_tiny.json"),
    "cnn_elmo": (0, 31002, False, "/absent/conll2018/models/char_elmo/cnn_0_8_16_32_tiny.json"),
}

# char.dic: in their training's order (characters in order of first appearance, then the six
# specials at the end); one line is the space character, which their reader turns into the key
# "\u3000" (the line strips to "<id>" alone); several characters of the sentences are absent.
CHARS = (
    list("abcdefghijklmnopqrstuvwxyz")
    + list("THPCM")
    + list(".,!?-")
    + list("éïà")
    + list(dict.fromkeys("ПриветМосква"))  # Cyrillic (е, о, с, а, р, т, к are not the Latin letters)
    + list("我们喜欢自然语言处理東京。")
    + list("0124")
    + [" "]
)
CHAR_SPECIALS = ["<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"]
# word.dic: their training's order (the four specials first, <oov> = 0), then the words. Case is
# kept: "the" is here, "The" is not.
WORD_SPECIALS = ["<oov>", "<bos>", "<eos>", "<pad>"]
WORDS = (
    "the cat sat on mat . , ! Hello world Привет Москва 我们 喜欢 自然 语言 处理 。 東京 naïve café "
    "a of and is to in it was language model many languages end near 2024 - 12"
).split()

# Awkward on purpose: an empty sentence, one word, words longer than the cut (48 code points:
# 69 ASCII, exactly 48, 49, a 61-code-point word of combining accents cut inside a grapheme, 60
# CJK), characters absent from char.dic (Ω, Æ, emoji, a ZWJ sequence), words absent from word.dic
# ("The": case is kept), mixed scripts, repeats, the literal specials as text, the space / ideographic
# space / empty-string tokens, a longer sentence.
SENTENCES = [
    ["The", "cat", "sat", "on", "the", "mat", "."],
    [],
    ["Привет"],
    [
        "Pneumonoultramicroscopicsilicovolcanoconiosis-is-a-word-of-sixty-plus",
        "x" * 48,
        "y" * 49,
        "a" + "e\u0301" * 30,
        "我" * 60,
    ],
    ["我们", "喜欢", "自然", "语言", "处理", "。"],
    ["naïve", "café", "Москва", "東京", "😀", "👩\u200d💻", "x😀y", "Ωmega", "ÆØÅ"],
    ["<bos>", "the", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>", "<unk>"],
    ["the", "the", "the", "cat", "cat", "the"],
    ["\u3000", "a\u3000b", " ", "", "qwertyzz", "Hello"],
    "it was the language model of many languages and it is in the cat on the mat , the end of it is near !".split(),
    ["Hello", ",", "world", "!"],
    ["2024", "-", "12", "%"],
]
# The statefulness case: one Embedder, sents2elmo(SENTENCES) then sents2elmo(SECOND).
SECOND = [["the", "cat"], ["Москва"], ["我们", "喜欢", "東京"], ["Hello", "world", "!"], []]
# The multi-batch case: a fresh Embedder(batch_size=MULTI_BATCH_SIZE), random.seed(MULTI_SEED) just
# before sents2elmo(SENTENCES), whose batch order is Python's random.shuffle.
MULTI_BATCH_SIZE = 3
MULTI_SEED = 2018
OUTPUT_LAYERS = (-2, -1, 0, 1, 2)


def model_config(word_dim: int) -> dict:
    config = json.loads(json.dumps(MODEL_CONFIG))
    config["token_embedder"]["word_dim"] = word_dim
    return config


def training_args(config_path: str) -> dict:
    """config.json: their training's `vars(opt)` (the published files' keys); the Embedder
    reads only config_path."""
    return {
        "seed": 1,
        "gpu": -1,
        "train_path": "/absent/raw_text/tiny.raw",
        "valid_path": None,
        "test_path": None,
        "config_path": config_path,
        "word_embedding": None,
        "optimizer": "adam",
        "lr": 0.001,
        "lr_decay": 0.8,
        "model": "/absent/final_models/tiny.model",
        "batch_size": 32,
        "max_epoch": 10,
        "clip_grad": 5,
        "max_sent_len": 20,
        "min_count": 3,
        "max_vocab_size": 150000,
        "save_classify_layer": False,
        "valid_size": 0,
        "eval_steps": 10000,
    }


def _quantized(rng: np.random.Generator, shape: tuple[int, ...], scale: float, mean: float = 0.0) -> np.ndarray:
    """Normal(mean, scale) values rounded to multiples of 1/128 (exact in float32, they compress)."""
    return (np.round(rng.normal(mean, scale, shape) * 128) / 128).astype(np.float32)


def _uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (np.round(rng.uniform(-1, 1, shape) * 128) / 128).astype(np.float32)


def random_weights(config: dict, n_chars: int, n_words: int, seed: int) -> dict[str, np.ndarray]:
    """The two state dicts, named `token_embedder/<key>` and `encoder/<key>` with their modules'
    keys and PyTorch's shapes (Linear: (out, in); Conv1d: (out, in, width)); scaled so that the
    token vectors are of order 1 and both LSTM clips fire (efml_record.py counts how often).
    The embeddings' <pad> rows are not zero (nor are they in the published models: their
    training draws every row, and padding_idx only stops the gradient)."""
    rng = np.random.default_rng(seed)
    te, enc = config["token_embedder"], config["encoder"]
    D, W, P, C = te["char_dim"], te["word_dim"], enc["projection_dim"], enc["dim"]
    F = sum(n for _, n in te["filters"])
    w: dict[str, np.ndarray] = {}
    t = "token_embedder/"
    if W > 0:
        w[t + "word_emb_layer.embedding.weight"] = _uniform(rng, (n_words, W))
    w[t + "char_emb_layer.embedding.weight"] = _uniform(rng, (n_chars, D))
    for i, (width, n) in enumerate(te["filters"]):
        w[t + f"convolutions.{i}.weight"] = _quantized(rng, (n, D, width), 1.2 / np.sqrt(width * D))
        w[t + f"convolutions.{i}.bias"] = _quantized(rng, (n,), 0.2)
    for k in range(te["n_highway"]):
        # rows [nonlinear part; gate]; the gate's bias leans to the nonlinear part
        w[t + f"highways._layers.{k}.weight"] = _quantized(rng, (2 * F, F), 1 / np.sqrt(F))
        w[t + f"highways._layers.{k}.bias"] = np.concatenate(
            [_quantized(rng, (F,), 0.2), _quantized(rng, (F,), 0.5, -1.0)]
        )
    w[t + "projection.weight"] = _quantized(rng, (P, W + F), 1.5 / np.sqrt(W + F))  # input [word | char]
    w[t + "projection.bias"] = _quantized(rng, (P,), 0.2)
    for layer in range(enc["n_layers"]):
        for direction in ("forward", "backward"):
            e = f"encoder/{direction}_layer_{layer}."
            # gate blocks i, f, g, o: strong inputs drive the clips; weak recurrent rows keep the
            # carried state contractive; a wide g bias gives units a steady sign, f's a long memory
            w[e + "input_linearity.weight"] = _quantized(rng, (4 * C, P), 0.3)
            w[e + "state_linearity.weight"] = _quantized(rng, (4 * C, P), 0.08)
            bias = _quantized(rng, (4, C), 0.5)
            bias[2] *= 2
            bias[1] += 0.5
            w[e + "state_linearity.bias"] = bias.reshape(-1)
            w[e + "state_projection.weight"] = _quantized(rng, (P, C), 0.6)
    return w


def dictionary_lines(entries: list[str]) -> list[str]:
    """Their `token\\tid` lines, ids in line order (as their training writes them)."""
    return [f"{token}\t{i}" for i, token in enumerate(entries)]


def write_model(folder: Path, name: str, work: Path) -> dict:
    """The model folder's text files, and the weights for the side process (work/<name>.npz);
    returns the side process's job entry."""
    word_dim, seed, legacy, config_path = MODELS[name]
    folder.mkdir(parents=True)
    config = model_config(word_dim)
    write_json(folder / "config.json", training_args(config_path))
    write_json(folder / Path(config_path).name, config)
    chars, words = CHARS + CHAR_SPECIALS, WORD_SPECIALS + WORDS
    if len(set(chars)) != len(chars) or len(set(words)) != len(words):
        raise ValueError("CHARS / WORDS: each entry once")
    write_text(folder / "char.dic", dictionary_lines(chars))
    write_text(folder / "word.dic", dictionary_lines(words))  # their training writes it for every model
    weights = random_weights(config, len(chars), len(words), seed)
    np.savez(work / f"{name}.npz", **weights)
    return {"folder": str(folder), "weights": str(work / f"{name}.npz"), "legacy": legacy}


def make(out: Path) -> Path:
    """Writes out/efml/ (not there before) and returns it. The same inputs give byte-identical
    files."""
    ENV.ensure()
    root = Path(out) / FOLDER
    root.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="efml-work-") as tmp:
        work = Path(tmp)
        job = {
            "models": {name: write_model(root / name, name, work) for name in MODELS},
            "sentences": SENTENCES,
            "second": SECOND,
            "multi_batch_size": MULTI_BATCH_SIZE,
            "multi_seed": MULTI_SEED,
            "output_layers": list(OUTPUT_LAYERS),
        }
        write_json(work / "job.json", job)
        ENV.run(RECORDER, work / "job.json", work)
        meta = json.loads((work / "meta.json").read_text(encoding="utf-8"))
        exported_sha256 = {}
        for name in MODELS:
            arrays = load_npz(work / f"{name}.out.npz")
            exported_sha256[name], round_trip = export_round_trip(root / name, work / f"exported_{name}")
            arrays.update({f"exported/{i}": value for i, value in enumerate(round_trip)})
            write_hdf5(root / f"{name}.hdf5", arrays)
    for name, stats in meta["clip_fractions"].items():
        print(f"efml {name}: clip fractions {json.dumps(stats, sort_keys=True)}", flush=True)
    record = {
        "sentences": SENTENCES,
        "second": SECOND,
        "multi_batch": {"batch_size": MULTI_BATCH_SIZE, "seed": MULTI_SEED, "batches": meta["multi_batches"]},
        "output_layers": list(OUTPUT_LAYERS),
        "clip_fractions": meta["clip_fractions"],
        "crashes": meta["crashes"],
        "versions": meta["versions"],
        "efml_sources_sha256": meta["sources_sha256"],
        "exported_sha256": exported_sha256,
        "model_sha256": {
            name: {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted((root / name).iterdir())}
            for name in MODELS
        },
    }
    write_json(root / "sentences.json", record)
    (root / "README.md").write_bytes(README.read_bytes())
    return root


def export_round_trip(folder: Path, exported: Path) -> tuple[dict[str, str], list[np.ndarray]]:
    """elmo_jax's `export` of the model in `folder`, into `exported`, and what their Embedder
    computes from that (a fresh one, output_layer -2, SENTENCES): the sha256 of each file it
    wrote, and the arrays. tests/test_efml.py checks that today's export writes those bytes."""
    from elmo_jax.model_io import export_model, load_model

    names = export_model(load_model(folder), exported)
    sha256 = {name: hashlib.sha256((exported / name).read_bytes()).hexdigest() for name in names}
    return sha256, embed(exported, SENTENCES)


# ---- their Embedder on any folder ---------------------------------------------------------------


def env_built() -> bool:
    """Whether the side environment is built (its stamp is there); builds nothing."""
    try:
        return (ENV.path() / ".complete").is_file()
    except (OSError, subprocess.CalledProcessError):  # no such interpreter: not built here
        return False


def embed(folder: Path, sentences: Sequence[Sequence[str]], batch_size: int = 64) -> list[np.ndarray]:
    """Their `Embedder(folder, batch_size).sents2elmo(sentences, output_layer=-2)` with a fresh
    Embedder (zero initial state): one float32 array (3, n_tokens, 2 * projection_dim) per
    sentence, in order. Builds the side environment first if it is not there (minutes, once)."""
    ENV.ensure()
    with tempfile.TemporaryDirectory(prefix="efml-embed-") as tmp:
        work = Path(tmp)
        write_json(work / "sentences.json", [list(s) for s in sentences], ascii_only=True)
        ENV.run(EMBEDDER, Path(folder).resolve(), work / "sentences.json", work / "out.hdf5", str(batch_size))
        with h5py.File(work / "out.hdf5", "r") as f:
            return [f[str(i)][()] for i in range(len(sentences))]
