"""Model config with exactly the fields of bilm-tf's options.json, plus the published sizes.

`ModelConfig` is what the model functions read; it converts to and from the options.json dict
(`lstm`, `char_cnn`) that bilm-tf and AllenNLP use, so a model trained here exports as-is.
ELMoForManyLangs' models (elmo_jax/interop/efml.py) add two fields that bilm-tf's lack:
`token_ids` "dictionary" (characters numbered by the model's own char.dic, not UTF-8 bytes) and
`word_embedding` (a word vector beside the char CNN's).
Training settings live in elmo_jax/settings.py, experiments in `experiments/*.py`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from elmo_jax import strict_json
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.settings import BOOL, POSITIVE, ComputeSettings, Rule, count, names, one_of, rule

ACTIVATIONS = ("relu", "tanh")
# How a token becomes ids: "bytes", bilm-tf's (its UTF-8 bytes and 5 special characters, 262 rows),
# or "dictionary", ELMoForManyLangs' (characters and words numbered by the model's own files).
TOKEN_IDS = ("bytes", "dictionary")
# Rows of the character embedding: the +1-shifted char ids 1..261 and a zero row 0 for padded
# slots (docs/MODEL.md section 2). bilm-tf's training files say 261 (the same rows without row 0).
N_CHARACTERS = 262
BILM_TF_TRAINING_N_CHARACTERS = 261


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
    """`options.json["lstm"]`: C = dim, P = projection_dim, L = n_layers."""

    dim: int
    projection_dim: int
    n_layers: int
    cell_clip: float | None
    proj_clip: float | None
    use_skip_connections: bool


@dataclasses.dataclass(frozen=True)
class CharCNNConfig:
    """`options.json["char_cnn"]`: D = embedding_dim, filters = ((width, count), ...);
    n_characters is always N_CHARACTERS (from_options maps bilm-tf's training value 261)."""

    embedding_dim: int
    filters: tuple[tuple[int, int], ...]
    n_highway: int
    n_characters: int
    max_characters_per_token: int
    activation: str

    @property
    def widest_filter(self) -> int:
        return max(width for width, _ in self.filters)

    @property
    def n_filters(self) -> int:
        """F: the total number of CNN filters, the width of the highway layers."""
        return sum(count for _, count in self.filters)


@dataclasses.dataclass(frozen=True)
class WordEmbeddingConfig:
    """`options.json["word_embedding"]` (ELMoForManyLangs' `word_dim`): a table of n_words rows
    (row 0 for padded slots, zero) of `dim` values, each token's row put before its char CNN
    vector in the projection's input."""

    n_words: int
    dim: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(ComputeSettings):
    """The model's options (keywords `lstm`, `char_cnn`, and for ELMoForManyLangs' models
    `token_ids`, `word_embedding`), plus how it computes: the fields of `ComputeSettings`,
    declared there with what they may be (not part of options.json)."""

    lstm: LSTMConfig
    char_cnn: CharCNNConfig
    token_ids: str = "bytes"
    word_embedding: WordEmbeddingConfig | None = None

    @property
    def token_width(self) -> int:
        """Ids per token: its characters', after its word id where there is a word embedding."""
        return self.char_cnn.max_characters_per_token + (self.word_embedding is not None)

    @classmethod
    def from_options(cls, options: dict[str, Any], source: str = "options") -> ModelConfig:
        """Reads the `lstm` and `char_cnn` parts of an options.json dict strictly: booleans must be
        JSON booleans and counts integers in their ranges (UserError naming `source` and the
        field otherwise); extra keys are ignored. `n_characters` 261 (bilm-tf's training files:
        raw ids, no padding row) is read as the 262-row layout, whose row 0 is the zero padding
        row and rows 1..261 are its rows."""
        read = _Reader(options, source)
        filters = read.value("char_cnn.filters", FILTERS)
        token_ids = read.value("token_ids", one_of(TOKEN_IDS)) if "token_ids" in options else "bytes"
        words = None
        if "word_embedding" in options:
            n_words, dim = read.value("word_embedding.n_words", count(2)), read.value("word_embedding.dim", count(1))
            words = WordEmbeddingConfig(n_words, dim)
        n_characters = read.value("char_cnn.n_characters", Rule(lambda v: True, "present"))
        config = cls(
            lstm=LSTMConfig(
                dim=read.value("lstm.dim", count(1)),
                projection_dim=read.value("lstm.projection_dim", count(1)),
                n_layers=read.value("lstm.n_layers", count(1)),
                cell_clip=read.clip("lstm.cell_clip"),
                proj_clip=read.clip("lstm.proj_clip"),
                use_skip_connections=read.value("lstm.use_skip_connections", BOOL),
            ),
            char_cnn=CharCNNConfig(
                embedding_dim=read.value("char_cnn.embedding.dim", count(1)),
                filters=tuple((w, n) for w, n in filters),
                n_highway=read.value("char_cnn.n_highway", count(0)),
                n_characters=_n_characters(n_characters, source) if token_ids == "bytes" else n_characters,
                max_characters_per_token=read.value("char_cnn.max_characters_per_token", count(1)),
                activation=read.value("char_cnn.activation", one_of(ACTIVATIONS)),
            ),
            token_ids=token_ids,
            word_embedding=words,
        )
        config.validate(source)
        return config

    def validate(self, source: str = "options") -> None:
        for width, _ in self.char_cnn.filters:
            if width > self.char_cnn.max_characters_per_token:
                raise UserError(
                    f"{source}: filter width {width} exceeds "
                    f"max_characters_per_token {self.char_cnn.max_characters_per_token}"
                )
        for name in names(ComputeSettings):
            value, allowed = getattr(self, name), rule(ComputeSettings, name)
            if not allowed.ok(value):
                raise UserError(f"{source}: {name} {value!r} is not {allowed.allowed}")
        if self.lstm_cell in ("pallas", "fused") and (self.lstm_schedule != "wavefront" or self.lstm.n_layers < 2):
            raise UserError(
                f"{source}: lstm_cell {self.lstm_cell!r} runs in the wavefront schedule: it needs lstm_schedule "
                "'wavefront', named (--config.train.lstm_schedule=wavefront: 'auto' is decided by the device, "
                "after the settings are checked), and 2+ layers"
            )
        if self.token_ids == "bytes":
            if self.char_cnn.n_characters != N_CHARACTERS:
                raise UserError(
                    f"{source}: char_cnn.n_characters must be {N_CHARACTERS}, got {self.char_cnn.n_characters}"
                )
            if self.word_embedding is not None:
                raise UserError(f"{source}: a word_embedding needs token_ids 'dictionary' (its words' ids)")
        elif not count(2).ok(n := self.char_cnn.n_characters):
            raise UserError(f"{source}: char_cnn.n_characters must be an integer >= 2, not {n}")

    def to_options(self) -> dict[str, Any]:
        """The options.json dict (model part) in bilm-tf's layout, plus `token_ids` and
        `word_embedding` where they are not bilm-tf's."""
        extra: dict[str, Any] = {} if self.token_ids == "bytes" else {"token_ids": self.token_ids}
        if self.word_embedding is not None:
            extra["word_embedding"] = dataclasses.asdict(self.word_embedding)
        return extra | {
            "lstm": {
                "dim": self.lstm.dim,
                "projection_dim": self.lstm.projection_dim,
                "n_layers": self.lstm.n_layers,
                "cell_clip": self.lstm.cell_clip,
                "proj_clip": self.lstm.proj_clip,
                "use_skip_connections": self.lstm.use_skip_connections,
            },
            "char_cnn": {
                "embedding": {"dim": self.char_cnn.embedding_dim},
                "filters": [list(f) for f in self.char_cnn.filters],
                "n_highway": self.char_cnn.n_highway,
                "n_characters": self.char_cnn.n_characters,
                "max_characters_per_token": self.char_cnn.max_characters_per_token,
                "activation": self.char_cnn.activation,
            },
        }

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """An options.json file: bilm-tf's models only (ELMoForManyLangs' load from their folder)."""
        raw = read_json(path, "options file")
        if isinstance(raw, dict) and "config_path" in raw:
            raise UserError(f"{path} is ELMoForManyLangs' config.json, not bilm-tf's options: give its folder")
        config = cls.from_options(raw, source=str(path))
        if config.token_ids != "bytes":
            raise UserError(f"{path}: token_ids {config.token_ids!r}: such a model loads from ELMoForManyLangs' folder")
        return config

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """Writes options.json; `extra` adds bilm-tf training fields (TrainSettings.options_fields)."""
        Path(path).write_text(strict_json.dumps({**self.to_options(), **(extra or {})}, indent=2) + "\n")

    def differences(self, other: ModelConfig) -> list[str]:
        """Names of the options fields (`lstm.dim`, ...) whose values differ from `other`."""
        return dict_differences(self.to_options(), other.to_options())


def read_json(path: str | Path, what: str = "file", hint: str = "") -> Any:
    """A JSON file; a missing or unparsable one is a UserError naming it, `hint` appended."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingFile(f"{what} not found: {path}{hint}") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a folder, not a JSON file{hint}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}){hint}") from None


def _is_filters(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(f, (list, tuple)) and len(f) == 2 and all(count(1).ok(x) for x in f) for f in value)
    )


FILTERS = Rule(_is_filters, "a non-empty list of [width, count] pairs of integers >= 1")
CLIP = Rule(lambda v: v is None or POSITIVE.ok(v), "a positive number or null")


class _Reader:
    """Fields of an options dict by dotted name, each checked; errors name the source and field."""

    def __init__(self, options: Any, source: str):
        self.options, self.source = options, source

    def value(self, dotted: str, rule: Rule) -> Any:
        node = self.options
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                raise UserError(f"{self.source}: missing field {dotted}")
            node = node[key]
        if not rule.ok(node):
            raise UserError(f"{self.source}: {dotted} is {json.dumps(node, default=repr)}; it must be {rule.allowed}")
        return node

    def clip(self, dotted: str) -> float | None:
        """A clip value: a positive number, or null (no clip) when absent."""
        node = self.options
        for key in dotted.split(".")[:-1]:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if dotted.split(".")[-1] not in node:
            return None
        return self.value(dotted, CLIP)


def _n_characters(value: Any, source: str) -> int:
    """options.json's n_characters -> N_CHARACTERS; 261 (bilm-tf training) maps to it."""
    if value not in (BILM_TF_TRAINING_N_CHARACTERS, N_CHARACTERS) or isinstance(value, (bool, float)):
        raise UserError(
            f"{source}: char_cnn.n_characters must be {N_CHARACTERS} (or {BILM_TF_TRAINING_N_CHARACTERS}, "
            f"bilm-tf's training value for the same table without its zero padding row), got {value!r}"
        )
    return N_CHARACTERS


def dict_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """ "key.path: a's value != b's" for each leaf where the nested dicts differ."""
    out = []
    for key in sorted(set(a) | set(b)):
        name = f"{prefix}{key}"
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += dict_differences(va, vb, name + ".")
        elif va != vb:
            out.append(f"{name}: {va!r} != {vb!r}")
    return out


_PUBLISHED_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]


def bilm_options(
    dim: int, projection_dim: int, filters: list[list[int]], embedding_dim: int = 16, n_highway: int = 1
) -> dict[str, Any]:
    """The options.json dict of a biLM shaped like the published ones: 2 layers with skip
    connections, clips 3, relu char CNN over 50 characters of 262 ids."""
    return {
        "lstm": {
            "dim": dim,
            "projection_dim": projection_dim,
            "n_layers": 2,
            "cell_clip": 3,
            "proj_clip": 3,
            "use_skip_connections": True,
        },
        "char_cnn": {
            "embedding": {"dim": embedding_dim},
            "filters": filters,
            "n_highway": n_highway,
            "n_characters": N_CHARACTERS,
            "max_characters_per_token": 50,
            "activation": "relu",
        },
    }


# The published ELMo sizes (docs/MODEL.md section 1), as options.json dicts.
PUBLISHED_OPTIONS: dict[str, dict[str, Any]] = {
    "small": bilm_options(1024, 128, _PUBLISHED_FILTERS, n_highway=1),
    "medium": bilm_options(2048, 256, _PUBLISHED_FILTERS, n_highway=1),
    "original": bilm_options(4096, 512, _PUBLISHED_FILTERS, n_highway=2),
}


def published(name: str) -> ModelConfig:
    """The published model sizes by name: small, medium, original."""
    if name not in PUBLISHED_OPTIONS:
        raise UserError(f"unknown model size {name!r}; expected one of {sorted(PUBLISHED_OPTIONS)}")
    return ModelConfig.from_options(PUBLISHED_OPTIONS[name], source=name)
