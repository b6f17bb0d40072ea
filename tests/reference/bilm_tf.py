"""The bilm-tf half of the fixture generator: `make(out)` writes out/elmo/, out/bilm-tf/model/
and out/bilm_tf_training/ (tests/fixtures/README.md) by running the original bilm-tf code in its
side environment (bilm_tf_env.py).

What runs where:
- here (the project's Python): the random weights (numpy, seeded) in bilm-tf's HDF5 layout,
  the sentences, the training text, and every file written (files.py);
- in the side environment: `bilm_tf_inference.py` (the two inference models: Batcher +
  stateful BidirectionalLanguageModel + weight_layers + dump_token_embeddings) and
  `bilm_tf_training.py` (four steps of bilm.training.train() with observers). They hand back
  .npz files and JSON; they are never imported by the project.

make.py calls `make` on an empty scratch folder, and replaces the committed folders only when
everything is made.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.reference.bilm_tf_env import BILM_VERSION, ENV, TENSORFLOW_VERSION, run_side
from tests.reference.files import load_npz, write_hdf5, write_json, write_text

HERE = Path(__file__).resolve().parent


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

# 3 lists of as many sentences (10: add one to each list at once, or replace one); batch i =
# [SENTENCES[0][i], SENTENCES[1][i], SENTENCES[2][i]] (so each
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
BATCHES = len(SENTENCES[0])
if len(SENTENCES) != 3 or any(len(sentences) != BATCHES for sentences in SENTENCES):
    raise ValueError("SENTENCES: 3 lists of as many sentences (batch i takes the i-th of each)")


def _quantized(rng: np.random.Generator, shape: tuple[int, ...], scale: float, mean: float = 0.0) -> np.ndarray:
    """Normal(mean, scale) values rounded to multiples of 1/128: exact in float32 with short
    mantissas, so the weight files compress (each draw is still random enough)."""
    return (np.round(rng.normal(mean, scale, shape) * 128) / 128).astype(np.float32)


def random_weights(options: dict, seed: int) -> dict[str, np.ndarray]:
    """Weights in bilm-tf's HDF5 layout (docs/WEIGHTS.md), scaled so that the token
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


def make_models(out: Path, work: Path) -> dict:
    """out/elmo and out/bilm-tf/model: weights, sentences, and what bilm-tf computes of them
    (`work`: the side process's job and results). Returns the replay's clip statistics."""
    words = vocabulary()
    stats = {}
    for name, (skip, seed, sentences_file) in MODELS.items():
        folder = out / name
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
        write_json(work / "job.json", job)
        run_side("bilm_tf_inference.py", work / "job.json", work / "out.npz", work / "stats.json")
        got = load_npz(work / "out.npz")
        stats[name] = json.loads((work / "stats.json").read_text())
        for k in range(3):
            write_hdf5(
                folder / f"lm_embeddings_{k}.hdf5", {str(i): got[f"lm_embeddings/{k}/{i}"] for i in range(BATCHES)}
            )
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
                "n_batches": BATCHES,
            },
        )
    return stats


LAYERS_DESCRIPTION = (
    "Everything bilm-tf's BidirectionalLanguageModel (max_batch_size 4, stateful) computed for the "
    "batches of 3 sentences of sentences.json (batch i = sentences[0][i], [1][i], [2][i]). "
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


def make_training(out: Path, work: Path) -> list[dict]:
    """out/bilm_tf_training: options, vocabulary, text, and four steps of bilm-tf's train()
    recorded (`work`: the side process's job, checkpoints and results). Returns the steps' summary."""
    folder = out / "bilm_tf_training"
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
        "save_dir": str(work / "train_save"),
    }
    write_json(work / "train_job.json", job)
    run_side("bilm_tf_training.py", work / "train_job.json", work / "train.npz", work / "train.json")
    got = load_npz(work / "train.npz")
    meta = json.loads((work / "train.json").read_text())
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
    """Writes out/elmo, out/bilm-tf/model and out/bilm_tf_training (none there before)."""
    start = time.time()
    ENV.ensure()
    print(f"bilm-tf environment ready: {time.time() - start:.0f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bilm-tf-work-") as tmp:
        work = Path(tmp)
        stats = make_models(out, work)
        for name, s in stats.items():
            print(f"{name}: {json.dumps(s, sort_keys=True)}", flush=True)
        summary = make_training(out, work)
        for row in summary:
            print(f"bilm_tf_training {json.dumps(row, sort_keys=True)}", flush=True)
    print(f"bilm-tf fixtures made: {time.time() - start:.0f} s", flush=True)
