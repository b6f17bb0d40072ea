"""Loading and saving whole models: a training workdir, an imported params-only checkpoint,
bilm-tf's options.json + weights.hdf5, or an ELMoForManyLangs folder (elmo_jax/interop/efml.py);
and exporting to bilm-tf's files.

An imported or exported folder holds `options.json` (the model config), plus `params/` (an
Orbax checkpoint of the params pytree) for imports, or `weights.hdf5` (bilm-tf layout) and
`vocab.txt` (when the model has a softmax vocabulary) for exports. A folder of bilm-tf files
may keep their published names (`elmo_2x4096_512_2048cnn_2xhighway_options.json`,
`..._weights.hdf5`, `lm_weights.hdf5`): one `*options.json` and one `*weights.hdf5`. A published
model's name (`"original"`) or the URL of its options.json loads from the download cache
(elmo_jax/published.py).

Params always come back as JAX arrays (on the default device), whatever file they came from, so
functions that close over them can be jitted.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import TypeVar

import jax

from elmo_jax.config import ModelConfig, read_json
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.experiment import train_settings
from elmo_jax.hub import fetch_hub, is_hub
from elmo_jax.interop.bilm_hdf5 import load_weights, save_weights
from elmo_jax.interop.efml import (
    EXPORTED_FILES,
    MODEL_CONFIG,
    EfmlTokens,
    folder_config,
    is_efml_folder,
    load_efml,
    read_tokens,
    save_efml,
)
from elmo_jax.model import Params
from elmo_jax.model.bilm import params_on_first_device
from elmo_jax.outputs import Folder, replacing
from elmo_jax.published import PUBLISHED, fetch, is_published
from elmo_jax.text.chars import ByteChars, TokenIds
from elmo_jax.text.vocab import Vocabulary
from elmo_jax.workdir import Workdir


@dataclasses.dataclass
class Model:
    config: ModelConfig
    params: Params  # see elmo_jax.model.bilm; no "softmax" for imported weights
    vocab: Vocabulary | None = None
    options: dict | None = None  # bilm-tf training fields to carry into options.json
    token_ids: TokenIds | None = None  # how tokens become ids; None: bilm-tf's (`ByteChars`)

    @property
    def tokens(self) -> TokenIds:
        """How this model's tokens become ids (`TokenIds`)."""
        return self.token_ids or ByteChars(self.config.char_cnn.max_characters_per_token)


def load_model(
    path: str | Path | None = None, options: str | Path | None = None, weights: str | Path | None = None
) -> Model:
    """From a training workdir, an imported folder or an exported one (`path`), a published
    model by name or options URL (a str: small, medium, original, original_5.5b; downloaded
    into the cache), or from options.json + HDF5."""
    path = _fetched(path)
    if path is None:
        if options is None or weights is None:
            raise UserError("give a workdir / imported folder, or both an options.json and a weights.hdf5")
        config = ModelConfig.load(options)
        return Model(
            config, jax.device_put(load_weights(weights, config))
        )  # jnp.asarray would compile a copy per shape
    path = Path(path)
    if Workdir(path).is_run():
        return _load_workdir(Workdir(path))
    if path.exists() and not path.is_dir():
        unzip = " (unzip it: ELMoForManyLangs' models come zipped)" if path.suffix == ".zip" else ""
        raise UserError(
            f"{path} is a file{unzip}: give a workdir or model folder, or an options.json and a weights.hdf5"
        )
    if not path.is_dir():
        near = difflib.get_close_matches(str(path), PUBLISHED, n=1)
        raise MissingFile(
            f"model folder not found: {path}, nor is it a published model ({', '.join(PUBLISHED)})"
            + (f": did you mean {near[0]}?" if near else "")
        )
    if is_efml_folder(path):
        config, params, tokens = load_efml(path)
        return Model(config, jax.device_put(params), token_ids=tokens)
    vocab = Vocabulary.load(path / "vocab.txt") if (path / "vocab.txt").is_file() else None
    if (path / "options.json").is_file() and (path / "params").is_dir():
        config = ModelConfig.load(path / "options.json")
        rows = _softmax_rows(path)
        if vocab is not None and rows is not None and rows != len(vocab):
            raise UserError(f"{path}: vocab.txt has {len(vocab)} words but the params' softmax has {rows} rows")
        import orbax.checkpoint as ocp  # here: half a second of imports that HDF5 models never need

        params = ocp.StandardCheckpointer().restore((path / "params").absolute(), params_on_first_device(config, rows))
        return Model(config, params, vocab)
    options, weights = _one_file(path, "options.json"), _one_file(path, "weights.hdf5")
    if options is not None and weights is not None:
        return dataclasses.replace(load_model(options=options, weights=weights), vocab=vocab)
    raise MissingFile(
        f"{path} is neither a training workdir (config.json + checkpoints/), an imported model "
        f"(options.json + params/), bilm-tf files (*options.json + *weights.hdf5) nor an ELMoForManyLangs "
        f"model (config.json, char.dic, word.dic, token_embedder.pkl, encoder.pkl)"
    )


def _one_file(folder: Path, suffix: str) -> Path | None:
    """FOLDER/suffix, else the one file named *suffix (bilm-tf's published names); None when
    there is none, an error naming them when there are several."""
    if (folder / suffix).is_file():
        return folder / suffix
    found = sorted(p for p in folder.glob(f"*{suffix}") if p.is_file())
    if len(found) > 1:
        raise UserError(
            f"{folder}: several *{suffix} files ({', '.join(p.name for p in found)}); name them: options=FILE "
            "and weights=FILE",
            ("options", "weights"),
        )
    return found[0] if found else None


_Source = TypeVar("_Source", bound=str | Path | None)


def _fetched(source: _Source) -> _Source | Path:
    """A published model (a name or an options URL) or a hub model (hf://OWNER/REPO) as its
    folder in the cache, fetched where missing; any other source as it is."""
    if is_hub(source):
        return fetch_hub(source)
    return fetch(source) if is_published(source) else source


def model_options(path: str | Path) -> dict:
    """The options.json model dict of a workdir, an imported or an exported folder (read
    without loading weights), or of a published model (by name or URL: downloaded first)."""
    path = Path(_fetched(path))
    if is_efml_folder(path) and not Workdir(path).is_run():
        return folder_config(path).to_options()
    if Workdir(path).config_json.is_file():
        return Workdir(path).saved()["model"]
    options = _one_file(path, "options.json") if path.is_dir() else None
    if options is not None:
        return ModelConfig.load(options).to_options()
    raise MissingFile(f"{path}: neither a training workdir (config.json) nor a model folder (*options.json)")


def model_token_ids(path: str | Path, config: ModelConfig) -> TokenIds | None:
    """How the tokens of the model at `path` (of `config`, `model_options`') become ids, read
    without its weights: its dictionaries for ELMoForManyLangs' models and runs fine-tuning them,
    None for bilm-tf's."""
    path = Path(_fetched(path))
    if config.token_ids == "bytes":
        return None
    if Workdir(path).is_run():
        return Workdir(path).token_ids(config)
    return read_tokens(path, config)


def _softmax_rows(path: Path) -> int | None:
    meta = path / "params_meta.json"
    return read_json(meta).get("softmax_rows") if meta.is_file() else None


def _load_workdir(workdir: Workdir) -> Model:
    run = workdir.restore_params()
    options = train_settings(run.config, len(run.vocab)).options_fields()
    return Model(run.model_config, run.params, run.vocab, options, workdir.token_ids(run.model_config))


# What `import` and `export` write in their output folder, and what each output of them holds
# (`--overwrite` replaces only such a folder).
IMPORTED = Folder(
    ("options.json", "params_meta.json", "params", "vocab.txt"), ("options.json", "params_meta.json", "params")
)
EXPORTED = Folder(("options.json", "weights.hdf5", "vocab.txt"), ("options.json", "weights.hdf5"))
EXPORTED_EFML = Folder(EXPORTED_FILES, ("config.json", MODEL_CONFIG, "char.dic", "token_embedder.pkl", "encoder.pkl"))


def export_layout(path: str | Path | None) -> Folder:
    """What `export` writes for the model at `path`: ELMoForManyLangs' folder for one of theirs
    (or a run fine-tuning one), else bilm-tf's files."""
    if path is None:
        return EXPORTED
    if Workdir(path).is_run():
        return EXPORTED_EFML if Workdir(path).saved()["model"].get("token_ids") == "dictionary" else EXPORTED
    return EXPORTED_EFML if is_efml_folder(Path(path)) else EXPORTED


def save_imported(model: Model, out: str | Path, overwrite: bool = False, inputs: tuple = ()) -> list[str]:
    """A params-only Orbax checkpoint with its options.json (and vocab.txt if any), built
    beside `out` and renamed into place (see elmo_jax.outputs); returns the names written."""
    if model.token_ids is not None:
        raise UserError("an ELMoForManyLangs model is used from its own folder: importing one is not supported")
    with replacing(out, overwrite, inputs, folder=IMPORTED) as folder:
        folder.mkdir()
        model.config.save(folder / "options.json")
        softmax_rows = model.params["softmax"]["W"].shape[0] if "softmax" in model.params else None
        (folder / "params_meta.json").write_text(json.dumps({"softmax_rows": softmax_rows}) + "\n")
        import orbax.checkpoint as ocp

        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(folder.absolute() / "params", model.params)
        checkpointer.wait_until_finished()
        if model.vocab is not None:
            model.vocab.save(folder / "vocab.txt")
        return sorted(p.name for p in folder.iterdir())


def export_model(model: Model, out: str | Path, overwrite: bool = False, inputs: tuple = ()) -> list[str]:
    """OUT/options.json and OUT/weights.hdf5 in bilm-tf's layout, OUT/vocab.txt if any (an
    ELMoForManyLangs model: their folder, `save_efml`); the folder is built beside `out` and
    renamed into place (see elmo_jax.outputs); returns the names written."""
    if isinstance(model.token_ids, EfmlTokens):
        with replacing(out, overwrite, inputs, folder=EXPORTED_EFML) as folder:
            folder.mkdir()
            save_efml(folder, model.config, model.params, model.token_ids)
            return sorted(p.name for p in folder.iterdir())
    with replacing(out, overwrite, inputs, folder=EXPORTED) as folder:
        folder.mkdir()
        model.config.save(folder / "options.json", model.options)
        save_weights(folder / "weights.hdf5", model.params, model.config)
        if model.vocab is not None:
            model.vocab.save(folder / "vocab.txt")
        return sorted(p.name for p in folder.iterdir())
