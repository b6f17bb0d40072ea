"""ELMoForManyLangs' models (elmo_jax/interop/efml.py, elmo_jax/efml_embed.py) against what their
own code computes (tests/fixtures/efml, made by tests/reference/efml.py): ids, every output layer,
carried state, their shuffled batches; the same models through Elmo, Embedder and `embed`; and
their folders' faults, each one line naming the file."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
import shutil
import zipfile

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax import Elmo
from elmo_jax.efml_embed import EfmlEmbedder
from elmo_jax.embed import Embedder
from elmo_jax.errors import MissingFile, UserError
from elmo_jax.interop.efml import convert, load_efml, write_dictionaries
from elmo_jax.interop.torch_state import load_state_dict
from elmo_jax.model_io import EXPORTED_EFML, export_model, load_model
from tests.cli import assert_one_line_error, run_cli

MODELS = ("cnn_word_elmo", "cnn_elmo")  # with a word embedding (legacy .pkl files), without (zip)
TOLERANCE = 1e-5  # float32 against their PyTorch float32 (they agree to about 2e-6)


@pytest.fixture(scope="module")
def efml(fixtures_dir):
    root = fixtures_dir / "efml"
    return root, json.loads((root / "sentences.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", params=MODELS)
def case(request, efml):
    root, record = efml
    with h5py.File(root / f"{request.param}.hdf5", "r") as f:
        recorded = {name: f[name][()] for name in _datasets(f)}
    return root / request.param, load_model(root / request.param), record, recorded


def _datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    return names


def _worst(ours: list[np.ndarray], theirs: dict, prefix: str) -> float:
    """The largest |difference| over every sentence `theirs` recorded under prefix/i (shapes equal)."""
    worst = 0.0
    for name, value in theirs.items():
        if name.startswith(prefix + "/") and name[len(prefix) + 1 :].isdigit():
            mine = ours[int(name[len(prefix) + 1 :])]
            assert mine.shape == value.shape, (name, mine.shape, value.shape)
            worst = max(worst, float(np.abs(mine - value).max(initial=0.0)))
    return worst


def test_token_ids_are_theirs(case):
    """Each row of their single batch: <bos>, the words, <eos>, padding; word and char ids
    (their <eow> first and <bow> last, the 48-character cut, unknown characters and words,
    literal specials) exactly."""
    _, model, record, recorded = case
    ids = recorded["ids/char_ids"]
    for row, (index, length) in enumerate(zip(recorded["ids/order"], recorded["ids/lengths"])):
        ours = model.tokens.encode([model.tokens.bos, *record["sentences"][index], model.tokens.eos]) - 1
        assert len(ours) == length
        np.testing.assert_array_equal(ours[:, -ids.shape[-1] :], ids[row, :length])
        if "ids/word_ids" in recorded:
            np.testing.assert_array_equal(ours[:, 0], recorded["ids/word_ids"][row, :length])


@pytest.mark.parametrize("layer", [-2, -1, 0, 1, 2])
def test_every_output_layer_of_a_fresh_embedder(case, layer):
    _, model, record, recorded = case
    ours = EfmlEmbedder(model).sents2elmo(record["sentences"], output_layer=layer)
    assert _worst(ours, recorded, f"fresh/{layer}") < TOLERANCE
    assert ours[1].shape[-2] == 0  # the empty sentence: no vectors (their -1 raises there)


def test_state_carries_from_call_to_call(case):
    _, model, record, recorded = case
    embedder = EfmlEmbedder(model)
    first, second = embedder.sents2elmo(record["sentences"], -2), embedder.sents2elmo(record["second"], -2)
    assert _worst(first, recorded, "stateful/0") < TOLERANCE
    assert _worst(second, recorded, "stateful/1") < TOLERANCE
    fresh = EfmlEmbedder(model).sents2elmo(record["second"], -2)
    assert _worst(fresh, recorded, "stateful/1") > 1e-3  # the carried state matters
    embedder.reset()
    assert _worst(embedder.sents2elmo(record["second"], -2), {f"x/{i}": v for i, v in enumerate(fresh)}, "x") == 0.0


def test_their_shuffled_batches_with_the_same_seed(case):
    """batch_size 3: four batches in the order Python's random shuffled them, each starting from
    the state the batch before left in its rows."""
    _, model, record, recorded = case
    seeded = record["multi_batch"]
    embedder = EfmlEmbedder(model, batch_size=seeded["batch_size"], shuffle=random.Random(seeded["seed"]))
    assert embedder.batches([len(s) for s in record["sentences"]]) == recorded["multibatch/batches"].tolist()
    embedder = EfmlEmbedder(model, batch_size=seeded["batch_size"], shuffle=random.Random(seeded["seed"]))
    assert _worst(embedder.sents2elmo(record["sentences"], -2), recorded, "multibatch") < TOLERANCE


def test_stateless_embedder_and_elmo_give_their_fresh_layers(case):
    """Embedder (sentences packed back to back) and the Elmo module (its layers, under jit), each
    sentence from a zero state: their fresh single batch."""
    _, model, record, recorded = case
    sentences = record["sentences"]
    assert _worst(Embedder(model, batch_size=4)(sentences), recorded, "fresh/-2") < TOLERANCE
    elmo = Elmo(model, dropout=0.0)
    ids = elmo.batch_to_ids(sentences)
    assert ids.shape[-1] == model.config.token_width
    out = jax.jit(lambda x: elmo(x))(ids)
    for i, sentence in enumerate(sentences):
        n = len(sentence)
        token = np.tile(np.asarray(out["word_emb"][i, :n]), 2)
        layers = np.stack([token] + [np.asarray(out[f"lstm_outputs{k}"][i, :n]) for k in (1, 2)])
        np.testing.assert_allclose(layers, recorded[f"fresh/-2/{i}"], atol=TOLERANCE, rtol=0)


def test_elmo_mix_trains_on_their_model(case):
    """jax.grad through the scalar mix of an ELMoForManyLangs model: finite, and nonzero."""
    _, model, record, _ = case
    elmo = Elmo(model, dropout=0.0)
    ids = elmo.batch_to_ids(record["sentences"][:4])
    from flax import nnx

    def loss(module):
        return jnp.mean(module(ids)["elmo_representations"][0] ** 2)

    grads = nnx.grad(loss)(elmo)
    leaves = jax.tree.leaves(nnx.state(grads))
    assert leaves and all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert any(np.abs(np.asarray(g)).max() > 0 for g in leaves)


@pytest.mark.launches
def test_embed_command_writes_their_layers(case, tmp_path):
    folder, _, record, recorded = case
    text = tmp_path / "sentences.txt"
    sentences = [s for s in record["sentences"] if s and all(t.strip() == t and t for t in s)]
    text.write_text("\n".join(" ".join(s) for s in sentences) + "\n", encoding="utf-8")
    result = run_cli(["embed", f"--model={folder}", f"--input={text}", f"--output={tmp_path / 'out.hdf5'}"])
    assert result.returncode == 0, result.stderr
    fresh = {json.dumps(s): recorded[f"fresh/-2/{i}"] for i, s in enumerate(record["sentences"])}
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        for line, sentence in enumerate(sentences):
            np.testing.assert_allclose(f[str(line)][()], fresh[json.dumps(sentence)], atol=TOLERANCE, rtol=0)


def test_export_writes_their_folder_which_their_embedder_reads(case, tmp_path):
    """Our export of their model: the bytes the fixtures' generator gave their own Embedder, which
    computed their numbers from it (`exported/i` against `fresh/-2/i`); loaded back here, the
    same params exactly."""
    folder, model, record, recorded = case
    names = export_model(model, tmp_path / "out")
    sha256 = {name: hashlib.sha256((tmp_path / "out" / name).read_bytes()).hexdigest() for name in names}
    assert sha256 == record["exported_sha256"][folder.name], (
        "the export changed: make fixtures (their Embedder reads it)"
    )
    assert (
        _worst([recorded[f"fresh/-2/{i}"] for i in range(len(record["sentences"]))], recorded, "exported") < TOLERANCE
    )
    back = load_model(tmp_path / "out")
    assert jax.tree.all(
        jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), model.params, back.params)
    )
    assert back.tokens.encode(["a", "<bos>", "zzz"]).tolist() == model.tokens.encode(["a", "<bos>", "zzz"]).tolist()


@pytest.mark.launches
def test_export_command(efml, tmp_path):
    folder = efml[0] / "cnn_elmo"
    result = run_cli(["export", f"--workdir={folder}", f"--output={tmp_path / 'x'}"])
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == sorted(EXPORTED_EFML.always)
    result = run_cli(["export", f"--workdir={folder}", f"--output={tmp_path / 'x'}", "--overwrite"])
    assert result.returncode == 0, result.stderr


def test_fine_tuned_on_new_text_keeps_their_dictionaries_resumes_and_exports(efml, tmp_path, text_data, caplog):
    """train --init_from their folder: their architecture and dictionaries (copied into the
    workdir, read there on resuming), a new softmax over the text's vocabulary; the weights move;
    export writes their folder, which loads back to the run's params and vectors exactly."""
    from test_training_run import losses, tiny_config

    from elmo_jax.train.loop import train

    folder, run = efml[0] / "cnn_word_elmo", tmp_path / "run"
    original = load_model(folder)
    caplog.set_level("INFO")
    train(tiny_config(text_data, max_steps=3, sample_softmax=False, init_from=str(folder)), run)
    assert "of its tokens are outside the model's word.dic and" in caplog.text
    tuned = load_model(run)
    assert tuned.config.differences(original.config) == [] and tuned.config.word_embedding is not None
    assert (tuned.token_ids.chars, tuned.token_ids.words) == (original.token_ids.chars, original.token_ids.words)
    moved = jax.tree.map(
        lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), tuned.params["lstm"], original.params["lstm"]
    )
    assert max(jax.tree.leaves(moved)) > 1e-4
    (run / "word.dic").unlink()
    with pytest.raises(MissingFile, match="word.dic"):  # a resumed run reads its own dictionaries
        train(tiny_config(text_data, max_steps=5, sample_softmax=False, init_from=str(folder)), run)
    write_dictionaries(run, original.token_ids)
    train(tiny_config(text_data, max_steps=5, sample_softmax=False, init_from=str(folder)), run)  # resumes
    assert sorted(losses(run)) == [1, 2, 3, 4, 5]
    tuned = load_model(run)
    assert sorted(export_model(tuned, tmp_path / "out")) == sorted(EXPORTED_EFML.always + ("word.dic",))
    back = load_model(tmp_path / "out")  # their biases hold the forget gate's 1: float32 rounding there
    for a, b in zip(jax.tree.leaves(back.params), jax.tree.leaves({k: tuned.params[k] for k in back.params})):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2.5e-7, rtol=0)
    sentences = [["a", "river", "bank"], ["今天", "<bos>", "x" * 60]]
    for a, b in zip(EfmlEmbedder(run).sents2elmo(sentences, -2), EfmlEmbedder(back).sents2elmo(sentences, -2)):
        np.testing.assert_allclose(a, b, atol=TOLERANCE, rtol=0)


# ---- faults ---------------------------------------------------------------------------------------


@pytest.fixture
def copy(efml, tmp_path):
    def copied(name: str = "cnn_elmo"):
        return shutil.copytree(efml[0] / name, tmp_path / name)

    return copied


@pytest.mark.parametrize("missing", ["encoder.pkl", "char.dic", "token_embedder.pkl", "word.dic"])
def test_a_missing_file_is_named(copy, missing):
    folder = copy("cnn_word_elmo")
    (folder / missing).unlink()
    with pytest.raises(MissingFile, match=f"needs {missing}"):
        load_model(folder)


def test_word_dic_is_needed_only_with_a_word_embedding(copy):
    folder = copy("cnn_elmo")
    (folder / "word.dic").unlink()
    assert load_model(folder).config.word_embedding is None


def _rewrite_zip_pickle(path, old: bytes, new: bytes) -> None:
    """Replaces bytes in the data.pkl of a torch zip file (same length: the pickle stays valid)."""
    assert len(old) == len(new)
    with zipfile.ZipFile(path) as z:
        entries = {info.filename: z.read(info) for info in z.infolist()}
    (name,) = [n for n in entries if n.endswith("/data.pkl")]
    assert old in entries[name]
    entries[name] = entries[name].replace(old, new)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)
    path.write_bytes(buffer.getvalue())


def test_an_unexpected_key_is_named(copy):
    folder = copy("cnn_elmo")
    _rewrite_zip_pickle(
        folder / "encoder.pkl", b"forward_layer_1.state_projection", b"forward_layer_1.state_PROJECTION"
    )
    with pytest.raises(UserError, match=r"encoder.pkl: unexpected key forward_layer_1.state_PROJECTION"):
        load_model(folder)


def test_a_wrong_shape_is_named(efml):
    folder = efml[0] / "cnn_elmo"
    config, _, _ = load_efml(folder)
    token = load_state_dict(folder / "token_embedder.pkl")
    token["projection.bias"] = np.zeros(3, np.float32)
    with pytest.raises(UserError, match=r"token_embedder.pkl: projection.bias has shape \(3,\), expected \(16,\)"):
        convert(token, load_state_dict(folder / "encoder.pkl"), config, folder)


def test_a_pickle_that_is_not_a_tensor_dict_is_refused(copy):
    folder = copy("cnn_elmo")
    (folder / "encoder.pkl").write_bytes(pickle.dumps(["not", "tensors"]))
    with pytest.raises(UserError, match="encoder.pkl"):
        load_model(folder)


def test_a_dictionary_line_and_a_missing_special(copy):
    folder = copy("cnn_elmo")
    (folder / "char.dic").write_text("a\t0\tx\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"char.dic:1: expected 'token<TAB>id'"):
        load_model(folder)
    (folder / "char.dic").write_text("a\t0\n<bos>\t1\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"char.dic: missing the special symbol\(s\) <eos>, <oov>, <pad>, <bow>, <eow>"):
        load_model(folder)


@pytest.mark.launches
def test_command_line_faults_are_one_line(copy, tmp_path):
    folder = copy("cnn_word_elmo")
    result = run_cli(["import", f"--model={folder}", f"--output={tmp_path / 'y'}"])
    assert_one_line_error(result, 2, "importing one is not supported")
    (folder / "encoder.pkl").unlink()
    text = tmp_path / "in.txt"
    text.write_text("a b\n", encoding="utf-8")
    result = run_cli(["embed", f"--model={folder}", f"--input={text}", f"--output={tmp_path / 'o.hdf5'}"])
    assert_one_line_error(result, 2, "encoder.pkl")


def test_the_docs_example_runs(efml, capsys):
    """docs/WEIGHTS.md's example, on the fixture model (P = 16) instead of a downloaded one."""
    from test_readme_examples import python_blocks

    (block,) = python_blocks("docs/WEIGHTS.md", "## ELMoForManyLangs")
    exec(compile(block.replace('"models/zh.model"', repr(str(efml[0] / "cnn_word_elmo"))), "WEIGHTS.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["[(4, 32), (1, 32)]", "(1, 4, 32)"]


def test_their_folder_is_not_a_workdir_to_train_in_or_evaluate(copy, text_data):
    """Training there would write over their config.json; evaluating has no run to read."""
    from test_training_run import tiny_config

    from elmo_jax.train.loop import train
    from elmo_jax.workdir import Workdir

    folder = copy("cnn_word_elmo")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(UserError, match=f"holds ELMoForManyLangs' model.*init_from={folder}"):
        train(tiny_config(text_data, max_steps=1), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    with pytest.raises(UserError, match="ELMoForManyLangs' model folder, not a training workdir"):
        Workdir(folder).restore_params()
    with pytest.raises(UserError, match="ELMoForManyLangs' config.json, not bilm-tf's options: give its folder"):
        load_model(options=folder / "config.json", weights=folder / "encoder.pkl")


@pytest.mark.parametrize(
    "arguments, error",
    [
        ({"output_layer": True}, ValueError),
        ({"output_layer": "top"}, ValueError),
        ({"output_layer": 3}, ValueError),
        ({"output_layer": -3}, ValueError),
        ({"batch_size": 2.5}, ValueError),
        ({"batch_size": 0}, ValueError),
        ({"shuffle": 2018}, TypeError),
    ],
)
def test_efml_embedder_refuses_bad_arguments(efml, arguments, error):
    model = load_model(efml[0] / "cnn_elmo")
    layer = arguments.pop("output_layer", -1)
    with pytest.raises(error, match=next(iter(arguments), "output_layer")):
        EfmlEmbedder(model, **arguments).sents2elmo([["a"]], layer)


def test_elmo_refuses_ids_of_another_model(efml):
    """bilm-tf's ids (batch_to_ids) have the width of a model without a word embedding, and
    values past its char table, which JAX's gather would clamp silently."""
    from elmo_jax import batch_to_ids

    elmo = Elmo(efml[0] / "cnn_elmo", dropout=0.0)
    with pytest.raises(ValueError, match=r"past this model's tables: give it the ids of elmo.batch_to_ids"):
        elmo(batch_to_ids([["the", "bank"]]))


def test_a_character_that_shares_pad_s_id_keeps_its_columns(copy):
    """Their code reads a char.dic where a character has <pad>'s id; the cut of padding columns
    (encode_words) must keep every column up to the word's last non-padding one."""
    from elmo_jax.embed import encode_words

    folder = copy("cnn_elmo")
    lines = (folder / "char.dic").read_text(encoding="utf-8").splitlines()
    pad = next(line.split("\t")[1] for line in lines if line.startswith("<pad>\t"))
    text = "\n".join(f"a\t{pad}" if line.startswith("a\t") else line for line in lines) + "\n"
    (folder / "char.dic").write_text(text, encoding="utf-8")
    model = load_model(folder)
    rows = model.tokens.encode(["a" * 20 + "b", "a"])
    cut, whole = encode_words(model, rows, cut_columns=True), encode_words(model, rows, cut_columns=False)
    np.testing.assert_allclose(cut, whole, atol=1e-6, rtol=0)


def test_a_dictionary_of_another_size_and_an_options_file_of_their_kind(copy, tmp_path):
    folder = copy("cnn_word_elmo")
    config = load_model(folder).config
    with (folder / "word.dic").open("a", encoding="utf-8") as f:
        f.write("extra\t5\n")
    with pytest.raises(UserError, match=r"word.dic: 43 entries, ids up to 41, .* 42 rows: not this model's"):
        load_model(folder)
    options = tmp_path / "options.json"
    options.write_text(json.dumps(config.to_options()), encoding="utf-8")
    with pytest.raises(UserError, match="token_ids 'dictionary': such a model loads from ELMoForManyLangs' folder"):
        load_model(options=options, weights=folder / "encoder.pkl")
