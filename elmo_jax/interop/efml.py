"""ELMoForManyLangs' model folders (HIT-SCIR, CoNLL 2018's 44 languages) -> our `Model`.

Read (`load_efml`) and written (`save_efml`, what `export` writes for such a model). A folder
holds `config.json` (its `config_path` names the model config: in the folder, else one
of their package's, whose published kind we know: `PACKAGE_CONFIGS`), `char.dic` and `word.dic`
(`token<TAB>id` a line) and the weights as PyTorch state dicts, `token_embedder.pkl` and
`encoder.pkl` (read without PyTorch: elmo_jax/interop/torch_state.py).

Their model is bilm-tf's with four differences, each mapped here (docs/WEIGHTS.md):
- tokens: characters are numbered by char.dic (code points, not UTF-8 bytes), with their own
  special symbols; a word embedding (word.dic's ids, `word_dim`) sits beside the char CNN, its
  vector first in the projection's input. Ids are +1 shifted here (0 marks a padded slot), and
  each token's ids are its word id, then its char ids (`EfmlTokens`).
- highway: AllenNLP's Linear(F, 2F) = [transform | gate], gate * x + (1 - gate) * relu(t): our
  carry gate is 1 - theirs, so W_carry = -W_gate, b_carry = -b_gate.
- LSTM: AllenNLP's cell, gates i, f, g, o, the forget bias inside the weights: reordered to
  bilm-tf's i, g(j), f, o, and 1 taken off the forget gate's bias, which our cell adds back.
- conv filters (n, D, w) -> (w, D, n).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from elmo_jax.config import ModelConfig, read_json
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.interop.torch_save import save_state_dict
from elmo_jax.interop.torch_state import load_state_dict
from elmo_jax.model import Params
from elmo_jax.outputs import write_text

FILES = ("config.json", "char.dic", "word.dic", "token_embedder.pkl", "encoder.pkl")
# Their special symbols: sentence boundaries (as words and as characters), unknown, padding; word
# boundaries (characters only).
BOS, EOS, OOV, PAD, BOW, EOW = "<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"
# The model configs their package ships (two names, the same file), by the name config.json
# gives: every published model names the first.
_PUBLISHED_CONFIG: dict[str, Any] = {
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "word_dim": 100,
        "char_dim": 50,
        "max_characters_per_token": 50,
    },
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
}
PACKAGE_CONFIGS = {f"cnn_{c}_100_512_4096_sample.json": _PUBLISHED_CONFIG for c in (0, 50)}


def is_efml_folder(path: Path) -> bool:
    """Whether `path` looks like an ELMoForManyLangs folder: a .dic or .pkl file of theirs beside
    config.json (a missing one is then `load_efml`'s error, naming it)."""
    return path.is_dir() and (path / "config.json").is_file() and any((path / f).is_file() for f in FILES[1:])


@dataclasses.dataclass(frozen=True, eq=False)
class EfmlTokens:
    """ELMoForManyLangs' token ids (`text.chars.TokenIds`), +1 shifted: each token's word id
    (where the model has a word embedding), then `max_chars` char ids as their code lays them
    out: the id of <eow>, one per code point, the id of <bow> (their code swaps the two), then
    <pad>s; <bos> and <eos> are [<eow>, <bos> or <eos>, <bow>]. A token is cut to its first
    max_chars - 2 code points before both lookups; unknown ones get <oov>'s ids."""

    chars: dict[str, int]
    words: dict[str, int] | None
    max_chars: int
    bos: str = BOS
    eos: str = EOS

    @property
    def lead(self) -> int:
        return int(self.words is not None)

    @property
    def width(self) -> int:
        return self.max_chars + self.lead

    @property
    def pad(self) -> int | None:
        return self.chars[PAD] + 1

    def encode(self, tokens: list[str]) -> np.ndarray:
        chars, C = self.chars, self.max_chars
        tokens = [t[: C - 2] for t in tokens]
        out = np.full((len(tokens), C), chars[PAD], np.int64)
        for row, token in zip(out, tokens):
            ids = [chars[token]] if token in (BOS, EOS) else [chars.get(c, chars[OOV]) for c in token]
            row[0], row[1 : len(ids) + 1], row[len(ids) + 1] = chars[EOW], ids, chars[BOW]
        if self.words is not None:
            words, oov = self.words, self.words[OOV]
            word_ids = np.fromiter((words.get(t, oov) for t in tokens), np.int64, len(tokens))
            out = np.concatenate([word_ids[:, None], out], axis=1)
        return (out + 1).astype(np.int32)

    def unknown_shares(self, strings: list[str], counts: np.ndarray) -> tuple[float, float]:
        """The share of tokens (string i `counts[i]` times) outside word.dic (0 without one), and
        of their characters outside char.dic: what the model reads as <oov>."""
        cut = [s[: self.max_chars - 2] for s in strings]
        total = max(int(counts.sum()), 1)
        words = 0.0
        if self.words is not None:
            words = float(counts[np.fromiter((t not in self.words for t in cut), bool, len(cut))].sum()) / total
        lengths = np.fromiter((len(t) for t in cut), np.int64, len(cut))
        unknown = np.fromiter((sum(c not in self.chars for c in t) for t in cut), np.int64, len(cut))
        return words, float((counts * unknown).sum()) / max(int((counts * lengths).sum()), 1)


def read_dic(path: Path, specials: tuple[str, ...]) -> dict[str, int]:
    """char.dic / word.dic: `token<TAB>id` lines, read as their code reads them (each line
    stripped, then split at tabs; a line of one field is the full-width space U+3000, which the
    strip took); each of `specials` must be there."""
    lexicon: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise MissingFile(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e})") from None
    for number, line in enumerate(lines, 1):
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        try:
            token, i = fields
            lexicon[token] = int(i)
        except ValueError:
            raise UserError(f"{path}:{number}: expected 'token<TAB>id', got {line[:100]!r}") from None
    missing = [s for s in specials if s not in lexicon]
    if missing:
        raise UserError(f"{path}: missing the special symbol(s) {', '.join(missing)}")
    low, high = min(lexicon.values()), max(lexicon.values())
    if low < 0:
        raise UserError(f"{path}: negative id {low}")
    if high >= 1 << 31:
        raise UserError(f"{path}: id {high} is past any table")
    return lexicon


def read_model_config(folder: Path) -> tuple[dict[str, Any], str]:
    """The model config that config.json's `config_path` names, found as their code finds it:
    FOLDER/config_path, else the folder's file of that name (the published config.json give a
    path on their authors' machine), else their package's (`PACKAGE_CONFIGS`); and where it came from."""
    top = read_json(folder / "config.json", "ELMoForManyLangs config.json")
    name = top.get("config_path") if isinstance(top, dict) else None
    if not isinstance(name, str):
        raise UserError(f"{folder / 'config.json'}: no config_path (the model config's file name)")
    for local in (folder / name, folder / Path(name).name):
        if local.is_file():
            return read_json(local, "ELMoForManyLangs model config"), str(local)
    if Path(name).name in PACKAGE_CONFIGS:
        return PACKAGE_CONFIGS[Path(name).name], f"their package's {Path(name).name}"
    raise MissingFile(
        f"{folder / 'config.json'}: config_path {name} is neither in the folder nor one of their package's "
        f"({', '.join(PACKAGE_CONFIGS)}): copy it into the folder"
    )


def _part(raw: Any, name: str, source: str) -> dict[str, Any]:
    """raw[name], a dict with a string `name`, else a one-line error."""
    part = raw.get(name) if isinstance(raw, dict) else None
    if not isinstance(part, dict) or not isinstance(part.get("name"), str):
        raise UserError(f"{source}: not an ELMoForManyLangs model config (no {name} with a name)")
    return part


def _count(part: dict[str, Any], key: str, least: int, source: str, default: int | None = None) -> int:
    """part[key] as an integer >= least (a JSON boolean is not one), else a one-line error."""
    value = part.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UserError(f"{source}: {key} is {json.dumps(value)}; it must be an integer >= {least}")
    return value


def word_dim(raw: Any, source: str) -> int:
    """The width of the word embedding (their token_embedder.word_dim; 0: none)."""
    return _count(_part(raw, "token_embedder", source), "word_dim", 0, source, default=0)


def model_config(raw: dict[str, Any], n_chars: int, n_words: int, source: str) -> ModelConfig:
    """Their model config -> ours (n_chars / n_words: the dictionaries' table sizes, our padding
    row included)."""
    embedder, encoder = _part(raw, "token_embedder", source), _part(raw, "encoder", source)
    if embedder["name"].lower() != "cnn":
        raise UserError(f"{source}: token_embedder {embedder['name']!r}: only 'cnn' (every published model's)")
    if encoder["name"].lower() != "elmo":
        raise UserError(
            f"{source}: encoder {encoder['name']!r}: only 'elmo' (every published model's; their 'lstm' is "
            "a plain torch LSTM, never published)"
        )
    if embedder.get("char_dim") == 0 and not isinstance(embedder.get("char_dim"), bool):
        raise UserError(f"{source}: char_dim 0: a model without its char CNN is not supported")
    options: dict[str, Any] = {
        "lstm": {
            "dim": encoder.get("dim"),
            "projection_dim": encoder.get("projection_dim"),
            "n_layers": encoder.get("n_layers"),
            "cell_clip": encoder.get("cell_clip") or None,  # their 0 or null: no clip
            "proj_clip": encoder.get("proj_clip") or None,
            "use_skip_connections": True,
        },
        "char_cnn": {
            "embedding": {"dim": _count(embedder, "char_dim", 1, source)},
            "filters": embedder.get("filters"),
            "n_highway": embedder.get("n_highway"),
            "n_characters": n_chars,
            # <bow>, a character, <eow>: their code needs 3 (and cuts tokens at this - 2)
            "max_characters_per_token": _count(embedder, "max_characters_per_token", 3, source),
            "activation": embedder.get("activation"),
        },
        "token_ids": "dictionary",
    }
    if word_dim(raw, source) > 0:
        options["word_embedding"] = {"n_words": n_words, "dim": word_dim(raw, source)}
    return ModelConfig.from_options(options, source)


def load_efml(folder: str | Path) -> tuple[ModelConfig, Params, EfmlTokens]:
    """An ELMoForManyLangs folder -> our config, params (numpy float32, no softmax) and token ids."""
    folder = Path(folder)
    missing = [f for f in FILES if not (folder / f).is_file()]
    raw, source = read_model_config(folder) if "config.json" not in missing else ({}, "")
    words_used = "config.json" not in missing and word_dim(raw, source) > 0
    missing = [f for f in missing if f != "word.dic" or words_used]
    if missing:
        raise MissingFile(f"{folder}: an ELMoForManyLangs folder needs {' and '.join(missing)}, not there")
    chars = read_dic(folder / "char.dic", (BOS, EOS, OOV, PAD, BOW, EOW))
    words = read_dic(folder / "word.dic", (OOV, PAD)) if words_used else None
    token, encoder = load_state_dict(folder / "token_embedder.pkl"), load_state_dict(folder / "encoder.pkl")
    n_chars = _rows(token, "char_emb_layer.embedding.weight", chars, folder / "char.dic")
    n_words = _rows(token, "word_emb_layer.embedding.weight", words, folder / "word.dic") if words else 0
    config = model_config(raw, n_chars + 1, n_words + 1, source)
    params = convert(token, encoder, config, folder, source)
    return config, params, EfmlTokens(chars, words, config.char_cnn.max_characters_per_token)


def _rows(token: dict[str, np.ndarray], key: str, lexicon: dict[str, int], dic: Path) -> int:
    """The rows of an embedding in token_embedder.pkl, which every id of its dictionary must have."""
    if key not in token or token[key].ndim != 2:
        raise UserError(f"{dic.parent / 'token_embedder.pkl'}: missing key {key} (a 2-D embedding table)")
    rows = token[key].shape[0]
    _check_ids(lexicon, rows, dic, f"{key} in token_embedder.pkl")
    return rows


def expected_shapes(config: ModelConfig, n_chars: int, n_words: int) -> tuple[dict, dict]:
    """Every key of token_embedder.pkl and encoder.pkl and its shape (their tables' rows: the
    dictionaries', without our padding row)."""
    cnn, lstm = config.char_cnn, config.lstm
    F, P, C, D = cnn.n_filters, lstm.projection_dim, lstm.dim, cnn.embedding_dim
    Dw = config.word_embedding.dim if config.word_embedding is not None else 0
    token: dict[str, tuple[int, ...]] = {}
    if Dw:
        token["word_emb_layer.embedding.weight"] = (n_words, Dw)
    token["char_emb_layer.embedding.weight"] = (n_chars, D)
    for i, (width, count) in enumerate(cnn.filters):
        token[f"convolutions.{i}.weight"] = (count, D, width)
        token[f"convolutions.{i}.bias"] = (count,)
    for k in range(cnn.n_highway):
        token[f"highways._layers.{k}.weight"] = (2 * F, F)
        token[f"highways._layers.{k}.bias"] = (2 * F,)
    token["projection.weight"] = (P, Dw + F)
    token["projection.bias"] = (P,)
    encoder: dict[str, tuple[int, ...]] = {}
    for direction in ("forward", "backward"):
        for layer in range(lstm.n_layers):
            prefix = f"{direction}_layer_{layer}"
            encoder[f"{prefix}.input_linearity.weight"] = (4 * C, P)
            encoder[f"{prefix}.state_linearity.weight"] = (4 * C, P)
            encoder[f"{prefix}.state_linearity.bias"] = (4 * C,)
            encoder[f"{prefix}.state_projection.weight"] = (P, C)
    return token, encoder


def _checked(
    state: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], path: Path, source: str
) -> dict[str, np.ndarray]:
    """The state dict's arrays as float32, each key and shape checked (one-line errors naming the file)."""
    unexpected = sorted(set(state) - set(shapes))
    if unexpected:
        raise UserError(
            f"{path}: unexpected key {unexpected[0]}" + (f" (and {len(unexpected) - 1} more)" * (len(unexpected) > 1))
        )
    out = {}
    for key, shape in shapes.items():
        if key not in state:
            raise UserError(f"{path}: missing key {key} (expected shape {shape})")
        if state[key].shape != shape:
            raise UserError(f"{path}: {key} has shape {state[key].shape}, expected {shape} (by {source})")
        out[key] = np.asarray(state[key], np.float32)
    return out


def _gates_to_bilm_tf(x: np.ndarray, C: int) -> np.ndarray:
    """Gate blocks on the last axis: AllenNLP's i, f, g, o -> bilm-tf's i, g (j), f, o."""
    i, f, g, o = (x[..., k * C : (k + 1) * C] for k in range(4))
    return np.concatenate([i, g, f, o], axis=-1)


def convert(token: dict, encoder: dict, config: ModelConfig, folder: Path, source: str = "the model config") -> Params:
    """Their two state dicts -> our params (see the module's doc for each mapping); `source`:
    where the config's sizes came from, for the errors."""
    n_chars = config.char_cnn.n_characters - 1
    n_words = config.word_embedding.n_words - 1 if config.word_embedding is not None else 0
    token_shapes, encoder_shapes = expected_shapes(config, n_chars, n_words)
    t = _checked(token, token_shapes, folder / "token_embedder.pkl", source)
    e = _checked(encoder, encoder_shapes, folder / "encoder.pkl", source)
    cnn, F, C = config.char_cnn, config.char_cnn.n_filters, config.lstm.dim
    zero_row = lambda table: np.concatenate([np.zeros((1, table.shape[1]), np.float32), table])  # noqa: E731
    token_encoder: Params = {
        "char_embed": zero_row(t["char_emb_layer.embedding.weight"]),
        "cnn": {
            f"filter_{i}": {
                "W": t[f"convolutions.{i}.weight"].transpose(2, 1, 0).copy(),
                "b": t[f"convolutions.{i}.bias"],
            }
            for i in range(len(cnn.filters))
        },
        "highway": {},
        "proj": {"W": t["projection.weight"].T.copy(), "b": t["projection.bias"]},
    }
    for k in range(cnn.n_highway):
        W, b = t[f"highways._layers.{k}.weight"], t[f"highways._layers.{k}.bias"]
        token_encoder["highway"][f"layer_{k}"] = {
            "W_carry": -W[F:].T,
            "b_carry": -b[F:],
            "W_transform": W[:F].T.copy(),
            "b_transform": b[:F],
        }
    if config.word_embedding is not None:
        token_encoder["word_embed"] = zero_row(t["word_emb_layer.embedding.weight"])
    forget = np.zeros(4 * C, np.float32)
    forget[2 * C : 3 * C] = 1.0  # bilm-tf's f block: our cell adds 1 there
    lstm: Params = {}
    for layer in range(config.lstm.n_layers):
        parts: dict[str, list[np.ndarray]] = {"W_0": [], "B": [], "W_P_0": []}
        for direction in ("forward", "backward"):
            prefix = f"{direction}_layer_{layer}"
            W = np.concatenate([e[f"{prefix}.input_linearity.weight"].T, e[f"{prefix}.state_linearity.weight"].T])
            parts["W_0"].append(_gates_to_bilm_tf(W, C))
            parts["B"].append(_gates_to_bilm_tf(e[f"{prefix}.state_linearity.bias"], C) - forget)
            parts["W_P_0"].append(e[f"{prefix}.state_projection.weight"].T)
        lstm[f"layer_{layer}"] = {name: np.stack(values) for name, values in parts.items()}
    return {"token_encoder": token_encoder, "lstm": lstm}


# ---- our model -> their folder ---------------------------------------------------------------------

MODEL_CONFIG = "elmo_config.json"  # the model config an exported folder's config.json names
EXPORTED_FILES = ("config.json", MODEL_CONFIG, "char.dic", "word.dic", "token_embedder.pkl", "encoder.pkl")


def _gates_to_allennlp(x: np.ndarray, C: int) -> np.ndarray:
    """`_gates_to_bilm_tf`'s inverse: bilm-tf's i, j, f, o -> AllenNLP's i, f, g, o."""
    i, g, f, o = (x[..., k * C : (k + 1) * C] for k in range(4))
    return np.concatenate([i, f, g, o], axis=-1)


def state_dicts(params: Params, config: ModelConfig) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Our params -> their token_embedder and encoder state dicts (`convert`'s inverse)."""
    te, C, P = params["token_encoder"], config.lstm.dim, config.lstm.projection_dim
    token: dict[str, np.ndarray] = {}
    if config.word_embedding is not None:
        token["word_emb_layer.embedding.weight"] = np.asarray(te["word_embed"])[1:]
    token["char_emb_layer.embedding.weight"] = np.asarray(te["char_embed"])[1:]
    for i in range(len(config.char_cnn.filters)):
        token[f"convolutions.{i}.weight"] = np.asarray(te["cnn"][f"filter_{i}"]["W"]).transpose(2, 1, 0)
        token[f"convolutions.{i}.bias"] = np.asarray(te["cnn"][f"filter_{i}"]["b"])
    for k in range(config.char_cnn.n_highway):
        hw = {name: np.asarray(value) for name, value in te["highway"][f"layer_{k}"].items()}
        token[f"highways._layers.{k}.weight"] = np.concatenate([hw["W_transform"].T, -hw["W_carry"].T])
        token[f"highways._layers.{k}.bias"] = np.concatenate([hw["b_transform"], -hw["b_carry"]])
    token["projection.weight"] = np.asarray(te["proj"]["W"]).T
    token["projection.bias"] = np.asarray(te["proj"]["b"])
    forget = np.zeros(4 * C, np.float32)
    forget[2 * C : 3 * C] = 1.0
    encoder: dict[str, np.ndarray] = {}
    for layer in range(config.lstm.n_layers):
        weights = {name: np.asarray(value) for name, value in params["lstm"][f"layer_{layer}"].items()}
        for d, direction in enumerate(("forward", "backward")):
            prefix = f"{direction}_layer_{layer}"
            W = _gates_to_allennlp(weights["W_0"][d], C)
            encoder[f"{prefix}.input_linearity.weight"] = W[:P].T
            encoder[f"{prefix}.state_linearity.weight"] = W[P:].T
            encoder[f"{prefix}.state_linearity.bias"] = _gates_to_allennlp(weights["B"][d] + forget, C)
            encoder[f"{prefix}.state_projection.weight"] = weights["W_P_0"][d].T
    return token, encoder


def their_config(config: ModelConfig) -> dict[str, Any]:
    """Our config -> their model config (the published one's fields)."""
    cnn, lstm = config.char_cnn, config.lstm
    if config.token_ids != "dictionary" or not lstm.use_skip_connections:
        raise UserError("only a model of ELMoForManyLangs' kind (dictionary ids, skip connections) exports to it")
    return {
        "token_embedder": {
            "name": "cnn",
            "activation": cnn.activation,
            "filters": [list(f) for f in cnn.filters],
            "n_highway": cnn.n_highway,
            "word_dim": config.word_embedding.dim if config.word_embedding is not None else 0,
            "char_dim": cnn.embedding_dim,
            "max_characters_per_token": cnn.max_characters_per_token,
        },
        "encoder": {
            "name": "elmo",
            "projection_dim": lstm.projection_dim,
            "cell_clip": lstm.cell_clip,
            "proj_clip": lstm.proj_clip,
            "dim": lstm.dim,
            "n_layers": lstm.n_layers,
        },
        "dropout": 0.1,  # their encoder's recurrent dropout, read by its constructor, used in training only
        "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    }


def _write_dic(path: Path, lexicon: dict[str, int]) -> None:
    write_text(path, "".join(f"{token}\t{i}\n" for token, i in sorted(lexicon.items(), key=lambda item: item[1])))


def write_dictionaries(folder: Path, tokens: EfmlTokens) -> None:
    """FOLDER/word.dic (with a word embedding), then FOLDER/char.dic, in their format, each
    written whole or not at all."""
    if tokens.words is not None:
        _write_dic(folder / "word.dic", tokens.words)
    _write_dic(folder / "char.dic", tokens.chars)


def read_tokens(folder: Path, config: ModelConfig) -> EfmlTokens:
    """The token ids of FOLDER's char.dic (and word.dic, where `config` has a word embedding),
    each id checked against the config's tables."""
    chars = read_dic(folder / "char.dic", (BOS, EOS, OOV, PAD, BOW, EOW))
    _check_ids(chars, config.char_cnn.n_characters - 1, folder / "char.dic", "the model's char table")
    words = None
    if config.word_embedding is not None:
        words = read_dic(folder / "word.dic", (OOV, PAD))
        _check_ids(words, config.word_embedding.n_words - 1, folder / "word.dic", "the model's word table")
    return EfmlTokens(chars, words, config.char_cnn.max_characters_per_token)


def _check_ids(lexicon: dict[str, int], rows: int, path: Path, table: str) -> None:
    """An entry per row of `table` (ids below its `rows`), as their embeddings have: a cut or
    foreign dictionary is refused (their code fails on it too)."""
    top = max(lexicon.values())
    if top >= rows or len(lexicon) != rows:
        raise UserError(
            f"{path}: {len(lexicon)} entries, ids up to {top}, where {table} has {rows} rows: "
            "not this model's dictionary"
        )


def folder_config(folder: Path) -> ModelConfig:
    """An ELMoForManyLangs folder's config, from its model config and the sizes of its
    dictionaries (their tables have a row per entry: `load_efml` checks), without its weights."""
    raw, source = read_model_config(folder)
    chars = read_dic(folder / "char.dic", (BOS, EOS, OOV, PAD, BOW, EOW))
    words = read_dic(folder / "word.dic", (OOV, PAD)) if word_dim(raw, source) > 0 else {}
    return model_config(raw, len(chars) + 1, len(words) + 1, source)


def save_efml(folder: Path, config: ModelConfig, params: Params, tokens: EfmlTokens) -> None:
    """Writes their folder layout into `folder` (there, empty): what their Embedder loads."""
    (folder / "config.json").write_text(json.dumps({"config_path": MODEL_CONFIG}, indent=1) + "\n", "utf-8")
    (folder / MODEL_CONFIG).write_text(json.dumps(their_config(config), indent=1) + "\n", "utf-8")
    write_dictionaries(folder, tokens)
    token, encoder = state_dicts(params, config)
    save_state_dict(folder / "token_embedder.pkl", token)
    save_state_dict(folder / "encoder.pkl", encoder)
