"""The run folder (--workdir): the one place that knows its layout and what a resume checks.

  config.json    the run's experiment config (train.devices resolved), its vocabulary's size and hash,
                 and what it ran on (package versions, device kind, git commit: elmo_jax/environment.py)
  vocab.txt      the vocabulary, one word a line in softmax row order (elmo_jax/text/vocab.py)
  checkpoints/   Orbax checkpoints (elmo_jax/checkpoint.py); damaged steps are moved to
                 damaged_checkpoints/ beside it, those saved as a run diverged to diverged_checkpoints/
  metrics.jsonl  one JSON record per train log window and per evaluation
  tensorboard/   the same numbers as TensorBoard event files
  training_curves.png  drawn from metrics.jsonl after training and by `elmo-jax plot` (elmo_jax/curves.py)
  train.lock     held by the run training in the folder (elmo_jax/train/run_lock.py)

`Workdir.restore_params` reads only the params of the newest intact checkpoint, not the
optimizer state: all that embedding, export and evaluation need.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import jax
import ml_collections

from elmo_jax import strict_json
from elmo_jax.config import ModelConfig, dict_differences, read_json
from elmo_jax.environment import environment
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.experiment import base_config, model_config
from elmo_jax.interop.efml import EfmlTokens, read_tokens, write_dictionaries
from elmo_jax.model import Params, shapes_by_path
from elmo_jax.model.bilm import init_params, params_on_first_device
from elmo_jax.outputs import make_folders, remove, remove_empty, write_text
from elmo_jax.text.batcher import round_up
from elmo_jax.text.chars import TokenIds
from elmo_jax.text.corpus import Corpus
from elmo_jax.text.vocab import Vocabulary, build_vocabulary, summary

log = logging.getLogger(__name__)

# Fields that must not change when a run resumes from a workdir's checkpoint (train.devices is
# saved resolved: the number of devices the run used).
RESUME_FIELDS = (
    "train.per_device_batch_size",
    "train.devices",
    "train.shard_softmax",
    "train.unroll_steps",
    "train.seed",
    "data.train",
    "data.backward_order",
)
# What a saved config that predates a resume field held.
PREDATED = {"data.backward_order": "shared"}


class RunParams(NamedTuple):
    """What a finished (or running) training run holds for inference."""

    config: ml_collections.ConfigDict  # the run's saved config
    model_config: ModelConfig  # its model, as it computes
    vocab: Vocabulary
    params: Params  # see elmo_jax.model.bilm; the softmax cut to len(vocab) rows
    step: int


def softmax_table_rows(config: ml_collections.ConfigDict, vocab_size: int) -> int:
    """Rows of the softmax table: V, padded to a multiple of the devices when it is sharded."""
    return round_up(vocab_size, config.train.devices) if config.train.shard_softmax else vocab_size


class Workdir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config_json = self.path / "config.json"
        self.vocab_txt = self.path / "vocab.txt"
        # ELMoForManyLangs' dictionaries, for a run fine-tuning one of their models
        self.char_dic, self.word_dic = self.path / "char.dic", self.path / "word.dic"
        self.checkpoints = self.path / "checkpoints"
        self.metrics_jsonl = self.path / "metrics.jsonl"
        self.tensorboard = self.path / "tensorboard"
        self.curves_png = self.path / "training_curves.png"
        self.lock = self.path / "train.lock"

    def __str__(self) -> str:
        return str(self.path)

    def create(self) -> list[Path]:
        """The folder (and its parents) if it is not there; a file in the way is a UserError.
        Returns the folders it made (for `discard`)."""
        try:
            return make_folders(self.path)
        except (FileExistsError, NotADirectoryError):
            raise UserError(f"the workdir {self.path} is (or is inside) a file, not a folder: choose another") from None
        except OSError as e:
            raise UserError(f"the workdir {self.path} cannot be created ({e.strerror}: {e.filename})") from None

    def _trainers(self) -> tuple[Path, ...]:
        """What training writes here (not the folders it moves checkpoints aside to: those hold
        steps written before)."""
        files = (self.config_json, self.vocab_txt, self.char_dic, self.word_dic, self.metrics_jsonl)
        return (*files, self.curves_png, self.lock, self.checkpoints, self.tensorboard)

    def written(self) -> dict[str, str | None]:
        """Training's files and folders that are here, by name: config.json's and vocab.txt's
        contents, None for the others."""
        small = (self.config_json, self.vocab_txt)
        return {p.name: p.read_text(encoding="utf-8") if p in small else None for p in self._trainers() if p.exists()}

    def undo_start(self, before: dict[str, str | None], made: list[Path]) -> list[str]:
        """Puts the folder back as it was `before` (`written`) a start that never ran a step:
        removes training's files and folders that were not here, writes config.json and
        vocab.txt back as they were, then removes the folders `create` `made`, if empty.
        Returns the names it removed or wrote back."""
        undone = []
        for path in self._trainers():
            if not path.exists():
                continue
            if path.name not in before:
                remove(path)
                undone.append(path.name)
            elif (text := before[path.name]) is not None and path.read_text(encoding="utf-8") != text:
                write_text(path, text)
                undone.append(path.name)
        remove_empty(made)
        return undone

    def trained(self) -> bool:
        """Whether a checkpoint of a step is here."""
        return self.checkpoints.is_dir() and any(p.name.isdigit() for p in self.checkpoints.iterdir())

    def token_ids(self, model: ModelConfig) -> TokenIds | None:
        """How the run's tokens become ids: None for bilm-tf's (bytes); for ELMoForManyLangs'
        (config token_ids "dictionary"), the dictionaries here (`keep_token_ids`)."""
        if model.token_ids == "bytes":
            return None
        if not self.char_dic.is_file():
            raise MissingFile(f"{self.char_dic} is missing: the run's characters are numbered by it")
        return read_tokens(self.path, model)

    def keep_token_ids(self, tokens: TokenIds | None) -> None:
        """Writes ELMoForManyLangs' dictionaries here (process 0), where a run fine-tunes one of
        their models; nothing for bilm-tf's ids."""
        if isinstance(tokens, EfmlTokens) and jax.process_index() == 0:
            write_dictionaries(self.path, tokens)

    def check_not_a_model(self) -> None:
        """Refuses, before training writes anything, a folder that holds a model and no run
        (bilm-tf's files, an imported model, ELMoForManyLangs'): its files (their config.json)
        would be overwritten."""
        if self.is_run() or not self.path.is_dir():
            return
        markers = {
            "ELMoForManyLangs' model": [self.path / "token_embedder.pkl", self.path / "encoder.pkl"],
            "bilm-tf's model files": sorted(self.path.glob("*weights.hdf5")),
            "an imported model": [self.path / "params"] if (self.path / "options.json").is_file() else [],
        }
        for kind, paths in markers.items():
            if any(p.exists() for p in paths):
                raise UserError(
                    f"the workdir {self.path} holds {kind}, not a training run: give a new --workdir, and "
                    f"--config.train.init_from={self.path} to fine-tune the model"
                )

    def is_run(self) -> bool:
        """A training run's folder: config.json and checkpoints/."""
        return self.config_json.is_file() and self.checkpoints.is_dir()

    def saved(self) -> dict:
        """config.json as written; a damaged one is a UserError naming it."""
        return read_json(self.config_json, "run config", hint="; restore it, or use another workdir")

    def saved_config(self) -> ml_collections.ConfigDict:
        """The run's saved config; fields it predates take base_config's defaults."""
        if not self.config_json.is_file():
            if (self.path / "options.json").is_file():
                raise UserError(
                    f"{self.path} is a model folder (options.json: imported or exported), not a training workdir: "
                    "it has no run config, checkpoint or softmax to score held-out text with (bilm-tf's weight files "
                    "hold no softmax); embed reads it, and train can fine-tune from it (--config.train.init_from)"
                )
            raise MissingFile(f"{self.path} is not a training workdir: {self.config_json} not found")
        if (self.path / "encoder.pkl").is_file() and not self.checkpoints.is_dir():
            raise UserError(
                f"{self.path} is ELMoForManyLangs' model folder, not a training workdir: it has no run config, "
                "checkpoint or softmax to score held-out text with; embed reads it, and train can fine-tune from it "
                "(--config.train.init_from)"
            )
        saved = self.saved()
        config = base_config(saved["model"]).to_dict()
        for section in ("train", "data"):
            config[section].update(saved.get(section, {}))
        return ml_collections.ConfigDict(config)

    def write_config(self, config: ml_collections.ConfigDict, vocab: Vocabulary, source: dict | None) -> None:
        """config.json: the resolved config, the vocabulary's record (with its `source`, see
        `vocab_source`) and the environment of the run writing it (a resumed run records its
        own; process 0 writes)."""
        if jax.process_index() == 0:
            vocabulary = {**vocab.record(), "source": source}
            record = {**config.to_dict(), "vocabulary": vocabulary, "environment": environment()}
            text = strict_json.dumps(record, indent=2) + "\n"
            write_text(self.config_json, text)

    def vocab(self) -> Vocabulary:
        """vocab.txt, checked against the size and hash the run recorded in config.json
        (workdirs older than that record are checked only against the checkpoint's softmax)."""
        vocab = Vocabulary.load(self.vocab_txt)
        recorded = self.saved().get("vocabulary") if self.config_json.is_file() else None
        if recorded is not None and vocab.record() != {k: recorded.get(k) for k in vocab.record()}:
            raise UserError(
                f"{self.vocab_txt} ({len(vocab)} words, sha256 {vocab.sha256[:12]}) is not the vocabulary "
                f"this run recorded in {self.config_json} ({recorded['words']} words, sha256 "
                f"{recorded['sha256'][:12]}): it was changed or damaged; restore it, or use another workdir"
            )
        return vocab

    def training_vocab(self, config: ml_collections.ConfigDict, corpus: Corpus) -> tuple[Vocabulary, dict | None]:
        """vocab.txt and its source (`vocab_source`; None for a workdir older than the record).
        One that is here is used where it was made from this run's data; one made from other
        data is made again if no checkpoint was trained with it, else refused, as is one no
        config.json of ours accounts for. Otherwise it is copied from config.data.vocab or built
        from `corpus` (min_count), and saved (process 0 writes)."""
        given = Vocabulary.load(config.data.vocab) if config.data.vocab else None
        source = vocab_source(config, corpus, given)
        # Another process than 0 may find the vocab.txt process 0 has just written for this run,
        # before its config.json: it makes the same vocabulary itself (process 0 checks the file).
        written_by_process_0 = jax.process_index() != 0 and not self.config_json.is_file()
        if self.vocab_txt.is_file() and not written_by_process_0:
            vocab = self.vocab()
            vocabulary = self.saved().get("vocabulary") if self.config_json.is_file() else None
            if vocabulary is None:  # no config.json of ours says this file is ours
                raise UserError(
                    f"{self.vocab_txt} is here, and no {self.config_json.name} says what it was made from (not "
                    f"written by a run of this version): give your own vocabulary as --config.data.vocab=FILE; "
                    f"remove {self.vocab_txt.name} or use another workdir"
                )
            recorded = vocabulary.get("source")
            if recorded is not None and _same_source(recorded, source):
                return vocab, source
            trained = self.trained()
            if trained and recorded is None:  # a workdir older than the record: checked as it was
                _check_given(given, vocab, self.vocab_txt)
                return vocab, None
            if trained:
                raise UserError(
                    f"{self.vocab_txt} was made from {_describe(recorded)}, but this run's vocabulary comes from "
                    f"{_describe(source)}, and the checkpoints in {self.checkpoints} were trained with it: give the "
                    "run its own data again, or use another workdir (--config.train.init_from fine-tunes from this one)"
                )
            log.info("%s was made from %s, not from this run's %s, and no checkpoint uses it: making it again",
                     self.vocab_txt, _describe(recorded), _describe(source))  # fmt: skip
        if given is not None:
            vocab = given
        else:
            log.info("building the vocabulary from %s (min_count %d)", corpus.name, config.data.min_count)
            vocab, stats = build_vocabulary(corpus.stream(), config.data.min_count)
            log.info("%s: %s", corpus.name, summary(stats))
        if jax.process_index() == 0:
            vocab.save(self.vocab_txt)
        return vocab, source

    def check_resume(self, config: ml_collections.ConfigDict, model_config: ModelConfig) -> None:
        """Fails, naming the differing fields, when the folder's checkpoint is of another run
        than `config` (whose model is `model_config`)."""
        if not self.is_run():
            return
        saved = self.saved()
        saved_model = ModelConfig.from_options(saved["model"], source=str(self.config_json))
        diffs = model_config.differences(saved_model)
        current = config.to_dict()
        diffs += [
            f"{k}: {_get(current, k)!r} != {_get(saved, k, PREDATED.get(k))!r}"
            for k in RESUME_FIELDS
            if _get(current, k) != _get(saved, k, PREDATED.get(k))
        ]
        if diffs:
            raise UserError(
                f"{self.path} holds a checkpoint of a different run (this config vs the saved one): "
                + "; ".join(diffs)
                + ". Use another workdir, or the saved config."
            )

    def check_checkpoint(self, shapes: dict[str, tuple[int, ...]], step: int, model: ModelConfig) -> None:
        """Fails, naming each field with both values, where the model of config.json (`model`)
        is not the one whose params (`shapes`, by path, as `Checkpoints.param_shapes` reads
        them) the checkpoint of `step` holds: before Orbax is asked to restore them."""
        wanted = shapes_by_path(jax.eval_shape(lambda: init_params(jax.random.key(0), model, None)))
        if all(shapes.get(path) == shape for path, shape in wanted.items()):
            return
        options = model.to_options()
        diffs = dict_differences(options, _options_of(shapes, options))
        diffs = (
            diffs
            or [  # a difference no field of the options explains: the first params that differ
                f"{path}: {shape} != {shapes.get(path, 'absent')}"
                for path, shape in wanted.items()
                if shapes.get(path) != shape
            ][:3]
        )
        raise UserError(
            f"{self.config_json} does not describe the model of its checkpoint of step {step} (config.json vs "
            f"the checkpoint): {'; '.join(diffs)}. Restore config.json, or use another workdir"
        )

    def check_vocab(self, table_rows: int, config: ml_collections.ConfigDict, vocab: Vocabulary) -> None:
        """Fails, naming both sizes, when the vocabulary does not fit a checkpoint's softmax of
        `table_rows` rows."""
        expected = softmax_table_rows(config, len(vocab))
        if table_rows != expected:
            raise UserError(
                f"{self.vocab_txt} has {len(vocab)} words (a softmax of {expected} rows) but the checkpoint in "
                f"{self.checkpoints} has a softmax of {table_rows} rows: not the vocabulary it was trained with"
            )

    def restore_params(self) -> RunParams:
        """The params of the newest intact checkpoint (on the first local device), read without
        the optimizer state."""
        from elmo_jax.checkpoint import Checkpoints  # Orbax: only when a checkpoint is read

        config, vocab = self.saved_config(), self.vocab()
        run_model = model_config(config)
        checkpoints = Checkpoints(self.checkpoints)
        try:
            step = checkpoints.good_step()
            if step is None:
                raise MissingFile(f"no intact checkpoint in {self.checkpoints}")
            self.check_checkpoint(checkpoints.param_shapes(step), step, run_model)
            rows = checkpoints.softmax_table_rows(step)
            self.check_vocab(rows, config, vocab)
            params = checkpoints.restore_params(step, params_on_first_device(run_model, rows))
        finally:
            checkpoints.close()
        # A table sharded by rows was padded to a multiple of the devices.
        params["softmax"] = jax.tree.map(lambda x: x[: len(vocab)], params["softmax"])
        return RunParams(config, run_model, vocab, params, step)


def vocab_source(config: ml_collections.ConfigDict, corpus: Corpus, given: Vocabulary | None) -> dict:
    """Where a run's vocabulary comes from: the file config.data.vocab (`given`, by its
    SHA-256), or the training text (config.data.train, min_count and the text's fingerprint)."""
    if given is not None:
        return {"file": str(config.data.vocab), "sha256": given.sha256}
    return {"built_from": config.data.train, "min_count": config.data.min_count, "text_sha256": corpus.fingerprint()}


def _same_source(recorded: dict, source: dict) -> bool:
    """The same vocabulary: the same file's contents, or the same text and min_count (wherever
    the files are now)."""
    keys = ("sha256",) if "file" in source else ("min_count", "text_sha256")
    return all(recorded.get(k) == source[k] for k in keys)


def _describe(source: dict | None) -> str:
    if source is None:
        return "a source no config.json records"
    if "file" in source:
        return f"the file {source['file']} (sha256 {source['sha256'][:12]})"
    return f"{source['built_from']} (min_count {source['min_count']}, text sha256 {source['text_sha256'][:12]})"


def _check_given(given: Vocabulary | None, vocab: Vocabulary, vocab_txt: Path) -> None:
    """config.data.vocab, where `given`, holds the words of the vocabulary the workdir was trained with."""
    if given is not None and given.words != vocab.words:
        raise UserError(
            f"config.data.vocab ({len(given)} words) differs from the vocabulary this workdir was trained "
            f"with, {vocab_txt} ({len(vocab)} words)"
        )


def _options_of(shapes: dict[str, tuple[int, ...]], options: dict) -> dict:
    """`options` (options.json's model part) with the sizes that params of these `shapes` (by
    path) have: the char embedding, the filters, the highway and LSTM layers, the cell and the
    projection."""

    def layers(prefix: str) -> set[str]:  # the names right below prefix: layer_0, layer_1, ...
        return {path[len(prefix) :].split("/")[0] for path in shapes if path.startswith(prefix)}

    cnn, lstm = dict(options["char_cnn"]), dict(options["lstm"])
    if "token_encoder/char_embed" in shapes:
        cnn["embedding"] = {"dim": shapes["token_encoder/char_embed"][1]}
    filters = sorted((int(p.split("/")[2].split("_")[1]), shape) for p, shape in shapes.items() if p.endswith("/W")
                     and p.startswith("token_encoder/cnn/"))  # fmt: skip
    cnn["filters"] = [[shape[0], shape[2]] for _, shape in filters]
    cnn["n_highway"] = len(layers("token_encoder/highway/"))
    lstm["n_layers"] = len(layers("lstm/"))
    if "token_encoder/proj/W" in shapes:
        lstm["projection_dim"] = shapes["token_encoder/proj/W"][1]
    if "lstm/layer_0/W_P_0" in shapes:
        lstm["dim"] = shapes["lstm/layer_0/W_P_0"][1]
    return {**options, "lstm": lstm, "char_cnn": cnn}


def _get(config_dict: dict, dotted: str, missing=None):
    for key in dotted.split("."):
        if not isinstance(config_dict, dict) or key not in config_dict:
            return missing
        config_dict = config_dict[key]
    return config_dict
