"""The training run end to end at tiny size: resume, preemption, kill, bad input, eval."""

import dataclasses
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from tiny_models import tiny_options

from elmo_jax.train.divergence import TrainingDiverged
from elmo_jax.train.loop import train

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = tiny_options(32, 8, 4, [[1, 8], [2, 8]])
TINY_FLAGS = [
    "--config.train.per_device_batch_size=4",
    "--config.train.devices=1",
    "--config.train.unroll_steps=5",
    "--config.train.n_negative_samples_batch=32",
    "--config.train.log_every=1",
    "--config.train.eval_every=0",
    "--config.train.eval_batch_size=8",
    "--config.model.lstm.dim=32",
    "--config.model.lstm.projection_dim=8",
    "--config.model.char_cnn.embedding.dim=4",
]


def tiny_config(text_data, **train):
    sys.path.insert(0, str(ROOT / "experiments"))
    import demo

    config = demo.get_config()
    with config.unlocked():
        config.model = TINY_MODEL
        config.data.train = f"text:{text_data / 'train.txt'}"
        config.data.heldout = f"text:{text_data / 'heldout.txt'}"
        for key, value in {
            **dict(
                per_device_batch_size=4,
                devices=1,
                unroll_steps=5,
                n_negative_samples_batch=32,
                log_every=1,
                eval_every=0,
                eval_batch_size=8,
                checkpoint_every=4,
            ),
            **train,
        }.items():
            setattr(config.train, key, value)
    return config


def losses(workdir):
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


@pytest.mark.slow
def test_resume_continues_the_same_computation(tmp_path, text_data):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    final = train(tiny_config(text_data, max_steps=12), straight)
    train(tiny_config(text_data, max_steps=8), resumed)
    assert sorted(losses(resumed)) == list(range(1, 9))
    # What a kill in the middle of a write leaves: the last record of each log torn.
    torn_line = b'{"step": 9, "kind": "train", "lo'
    with open(resumed / "metrics.jsonl", "ab") as f:
        f.write(torn_line)
    (events,) = (resumed / "tensorboard").glob("events.out.tfevents.*")
    whole_events = events.read_bytes()
    events.write_bytes(whole_events + struct.pack("<Q", 100) + b"\0" * 30)  # a record of 100 bytes, 26 written
    final_resumed = train(tiny_config(text_data, max_steps=12), resumed)
    assert (resumed / "metrics.jsonl.torn").read_bytes() == torn_line
    assert events.read_bytes() == whole_events and len(events.with_name(events.name + ".torn").read_bytes()) == 38
    want, got = losses(straight), losses(resumed)
    assert [got[s] for s in range(9, 13)] == [want[s] for s in range(9, 13)]
    assert final_resumed == final
    assert {"forward_perplexity", "backward_perplexity", "perplexity", "tokens"} <= set(final)
    assert list((straight / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((straight / "config.json").read_text())["train"]["max_steps"] == 12


@pytest.mark.slow
def test_a_shared_order_run_resumes_in_its_order_as_do_workdirs_older_than_the_setting(tmp_path, text_data):
    def shared(max_steps):
        config = tiny_config(text_data, max_steps=max_steps)
        with config.unlocked():
            config.data.backward_order = "shared"
        return config

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    final = train(shared(6), straight)
    train(shared(3), resumed)
    # As an elmo_jax that had only the shared order wrote it.
    saved = json.loads((resumed / "config.json").read_text())
    del saved["data"]["backward_order"]
    (resumed / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"data\.backward_order: 'independent' != 'shared'"):
        train(tiny_config(text_data, max_steps=6), resumed)
    assert train(shared(6), resumed) == final
    want, got = losses(straight), losses(resumed)
    assert [got[s] for s in range(4, 7)] == [want[s] for s in range(4, 7)]


@pytest.mark.slow
def test_another_process_makes_the_vocabulary_process_0_has_just_written(tmp_path, text_data, monkeypatch):
    """At a multi-process start, process 0 writes vocab.txt, then config.json: a process that
    comes between the two makes the same vocabulary itself (it used to refuse the file as one no
    config.json accounts for, failing the run)."""
    from elmo_jax.text.sources import open_corpus
    from elmo_jax.workdir import Workdir

    config = tiny_config(text_data)
    corpus = open_corpus(config.data.train, "train")
    first, _ = Workdir(tmp_path).training_vocab(config, corpus)
    assert (tmp_path / "vocab.txt").is_file() and not (tmp_path / "config.json").exists()
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    again, _ = Workdir(tmp_path).training_vocab(config, corpus)
    assert again.words == first.words


def test_a_trained_model_exported_and_reimported_embeds_identically(tmp_path, text_data, caplog):
    """Trained with the full softmax (config.train.sample_softmax false), exported, reimported."""
    from elmo_jax import Elmo, batch_to_ids
    from elmo_jax.embed import Embedder
    from elmo_jax.model_io import export_model, load_model

    caplog.set_level("INFO")
    train(tiny_config(text_data, max_steps=3, sample_softmax=False), tmp_path / "run")
    assert "train ppl fwd" in caplog.text and "(full)" in caplog.text and "(sampled)" not in caplog.text
    trained = load_model(tmp_path / "run")
    export_model(trained, tmp_path / "out")
    options = json.loads((tmp_path / "out" / "options.json").read_text())
    assert options["n_tokens_vocab"] == len(trained.vocab) and options["lstm"]["dim"] == 32
    assert options["sample_softmax"] is False and options["unroll_steps"] == 5
    assert (tmp_path / "out" / "vocab.txt").read_text().split("\n")[:3] == ["<S>", "</S>", "<UNK>"]
    reimported = load_model(options=tmp_path / "out" / "options.json", weights=tmp_path / "out" / "weights.hdf5")
    sentences = [["the", "river", "bank"], ["Anna", "saw", "a", "bank"]]
    for a, b in zip(Embedder(trained, batch_size=2)(sentences), Embedder(reimported, batch_size=2)(sentences)):
        np.testing.assert_array_equal(a, b)
    # The downstream module from the workdir and from the exported folder: the same vectors.
    mix = [1.0, 0.0, 0.0]
    ids = batch_to_ids(sentences)
    from_workdir = Elmo(tmp_path / "run", dropout=0.0, scalar_mix_parameters=mix)(ids)["elmo"]
    from_export = Elmo(tmp_path / "out", dropout=0.0, scalar_mix_parameters=mix)(ids)["elmo"]
    np.testing.assert_array_equal(from_workdir, from_export)
    want = Embedder(trained, batch_size=2)(sentences)
    weights = np.exp(mix) / np.exp(mix).sum()
    for i, tokens in enumerate(sentences):
        np.testing.assert_allclose(from_workdir[i, : len(tokens)], np.einsum("l,ltd->td", weights, want[i]), atol=1e-6)
    # A workdir written before a config field existed loads with that field's default.
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    del saved["train"]["sample_softmax"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    assert load_model(tmp_path / "run").options["sample_softmax"] is True


@pytest.mark.slow
def test_epochs_derive_the_run_length(tmp_path, text_data):
    result = train(tiny_config(text_data, n_epochs=1.0, checkpoint_every=1000), tmp_path)
    positions = sum(len(line.split()) + 1 for line in (text_data / "train.txt").read_text().splitlines())
    assert max(losses(tmp_path)) == -(-positions // (4 * 5))
    assert result["tokens"] == sum(
        len(line.split()) + 1 for line in (text_data / "heldout.txt").read_text().splitlines()
    )


@pytest.mark.slow
def test_a_workdir_of_another_model_fails_naming_the_fields(tmp_path, text_data):
    train(tiny_config(text_data, max_steps=2), tmp_path)
    other = tiny_config(text_data, max_steps=4)
    with other.unlocked():
        other.model.lstm.dim = 48
        other.train.per_device_batch_size = 8
    with pytest.raises(ValueError, match=r"lstm\.dim: 48 != 32.*train\.per_device_batch_size: 8 != 4"):
        train(other, tmp_path)


def test_a_workdir_whose_config_json_was_edited_is_named_before_its_checkpoint_is_read(tmp_path, text_data):
    """config.json's model against the checkpoint's params (their shapes, from Orbax's metadata):
    the field and both values, for reading the params (eval, embed, export) and for resuming."""
    from elmo_jax.errors import UserError
    from elmo_jax.workdir import Workdir

    train(tiny_config(text_data, max_steps=2), tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["model"]["lstm"]["projection_dim"] = 12
    (tmp_path / "config.json").write_text(json.dumps(saved))
    named = r"config.json does not describe the model of its checkpoint of step 2 .*: lstm\.projection_dim: 12 != 8\."
    with pytest.raises(UserError, match=named):
        Workdir(tmp_path).restore_params()
    edited = tiny_config(text_data, max_steps=4)
    with edited.unlocked():
        edited.model.lstm.projection_dim = 12
    with pytest.raises(UserError, match=named):
        train(edited, tmp_path)


@pytest.mark.slow
def test_divergence_stops_and_keeps_the_last_good_checkpoint(tmp_path, text_data):
    config = tiny_config(text_data, max_steps=10, checkpoint_every=1, learning_rate=1e38)
    with pytest.raises(TrainingDiverged, match=r"step (\d+): loss .* latest checkpoint \(step \d+\)"):
        train(config, tmp_path)
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    bad = max(losses(tmp_path), default=0) + 1
    assert steps and max(steps) < bad


def test_missing_and_empty_data_fail_naming_the_file(tmp_path, text_data):
    config = tiny_config(text_data)
    with config.unlocked():
        config.data.train = f"text:{tmp_path / 'nothing-*.txt'}"
    with pytest.raises(FileNotFoundError, match="nothing-"):
        train(config, tmp_path / "a")
    (tmp_path / "empty.txt").write_text("\n\n")
    with config.unlocked():
        config.data.train = f"text:{tmp_path / 'empty.txt'}"
    with pytest.raises(ValueError, match="empty.txt"):
        train(config, tmp_path / "b")


def test_a_failed_start_leaves_the_workdir_as_it_found_it(tmp_path, text_data, caplog):
    """No vocabulary, config or lock of a run that never ran a step (a failed start left them,
    and the next run trained on the wrong vocabulary); the user's own files stay."""
    caplog.set_level("INFO")
    config = tiny_config(text_data)
    (tmp_path / "empty.txt").write_text("\n\n")
    with config.unlocked():
        config.data.train = f"text:{tmp_path / 'empty.txt'}"
    with pytest.raises(ValueError, match="no sentences"):
        train(config, tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()  # nor the folders made for it
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    with pytest.raises(ValueError, match="no sentences"):
        train(config, mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert f"the start failed; {mine} is as it was (undone: vocab.txt, train.lock)" in caplog.text


@pytest.mark.slow
def test_a_vocabulary_made_from_other_data_is_made_again_or_refused(tmp_path, text_data, caplog, monkeypatch):
    """config.json records what vocab.txt was made from (the source, min_count, the text's
    SHA-256). One made from other data is made again where no checkpoint used it, refused where
    one did; one no config.json accounts for (an earlier version's failed start, or the user's
    own) is refused and left as it is. A resume that fails before its first step puts
    config.json back as it was."""
    from elmo_jax.checkpoint import Checkpoints

    caplog.set_level("INFO")
    own = tmp_path / "train.txt"
    own.write_text((text_data / "train.txt").read_text())
    config = tiny_config(text_data, max_steps=2)
    with config.unlocked():
        config.data.train = f"text:{own}"
    leftover = tmp_path / "leftover"
    leftover.mkdir()
    (leftover / "vocab.txt").write_text("<S>\n</S>\n<UNK>\n")
    with pytest.raises(ValueError, match=r"vocab.txt is here, and no config.json says what it was made from"):
        train(config, leftover)
    assert sorted(p.name for p in leftover.iterdir()) == ["vocab.txt"]
    assert (leftover / "vocab.txt").read_text() == "<S>\n</S>\n<UNK>\n"
    (leftover / "vocab.txt").unlink()
    train(config, leftover)
    source = json.loads((leftover / "config.json").read_text())["vocabulary"]["source"]
    assert source["built_from"] == f"text:{own}" and source["min_count"] == 1 and len(source["text_sha256"]) == 64

    saved = (leftover / "config.json").read_text()
    with config.unlocked():
        config.train.eval_every = 7  # a resume may change it: config.json is written anew
    with monkeypatch.context() as m, pytest.raises(RuntimeError, match="a failed restore"):
        m.setattr(Checkpoints, "restore", lambda *a: (_ for _ in ()).throw(RuntimeError("a failed restore")))
        train(config, leftover)
    assert (leftover / "config.json").read_text() == saved  # the failed resume's record undone

    own.write_text((text_data / "heldout.txt").read_text())  # the same file, other text
    with pytest.raises(ValueError, match=r"vocab.txt was made from text:.*train.txt \(min_count 1, text sha256 .*\), "
                       r"but this run's vocabulary comes from .*checkpoints .* were trained with it"):  # fmt: skip
        train(config, leftover)
    shutil.rmtree(leftover / "checkpoints")  # a run killed before its first checkpoint
    caplog.clear()
    train(config, leftover)
    assert "and no checkpoint uses it: making it again" in caplog.text
    assert (
        json.loads((leftover / "config.json").read_text())["vocabulary"]["source"]["text_sha256"]
        != source["text_sha256"]
    )


def test_a_stop_signal_after_the_last_step_is_said(tmp_path, text_data, caplog, monkeypatch):
    """One that came after the last step's check ended the run with exit 0 and not a word: no
    final evaluation, no result, no curves."""
    import os
    import signal

    from elmo_jax.train.preemption import Preemption

    caplog.set_level("INFO")
    real = Preemption.reached

    def signalled_after(self, step):
        reached = real(self, step)
        if step == 3:  # the last step, checked: the signal comes just after
            os.kill(os.getpid(), signal.SIGINT)
        return reached

    monkeypatch.setattr(Preemption, "reached", signalled_after)
    assert train(tiny_config(text_data, max_steps=3), tmp_path) == {}
    assert "stopped (SIGINT) after the last step: every step is saved; `elmo-jax eval` evaluates it" in caplog.text
    assert 3 in [int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]


@pytest.mark.slow
def test_periodic_evaluations_make_their_word_table_once(tmp_path, text_data, monkeypatch):
    """Every periodic evaluation made its held-out sentences anew, and with them the word table
    of the whole vocabulary (793k words for LM1B: 2.6-3.1 s an evaluation, inside the run)."""
    from elmo_jax.text import word_types

    made, real = [], word_types.WordTypes.__init__
    monkeypatch.setattr(word_types.WordTypes, "__init__", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    train(tiny_config(text_data, max_steps=6, eval_every=2, eval_sentences=20), tmp_path)
    assert len(losses(tmp_path)) == 6
    assert len(made) == 3  # the training text's, the periodic evaluations' (steps 2 and 4), the final one's


def test_invalid_utf8_is_replaced_and_counted(tmp_path, caplog):
    from elmo_jax.text.sources import open_corpus

    path = tmp_path / "bad.txt"
    path.write_bytes(b"good line\nbad \xff\xfe byte\nfine\nmore \xc3 bad\n")
    corpus = open_corpus(f"text:{path}", "train")
    assert len(corpus) == 4 and list(corpus.stream())[1] == ["bad", "\ufffd\ufffd", "byte"]
    assert "2 line(s) not valid UTF-8" in caplog.text and "lines 2, 4" in caplog.text


def run_cli(args, **kwargs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args], capture_output=True, text=True, env=env, cwd=ROOT, **kwargs
    )


def cli_train_args(text_data, workdir, max_steps):
    return [
        "train",
        "--config=experiments/demo.py",
        f"--workdir={workdir}",
        f"--config.data.train=text:{text_data / 'train.txt'}",
        f"--config.data.heldout=text:{text_data / 'heldout.txt'}",
        f"--config.train.max_steps={max_steps}",
        "--config.train.n_epochs=100",
        "--config.train.checkpoint_every=50",
        *TINY_FLAGS,
    ]


def wait_for_checkpoint(workdir: Path, proc: subprocess.Popen, timeout: float = 120, after: int = 0) -> None:
    """Until a checkpoint of a step past `after` has landed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.name.isdigit() and int(p.name) > after for p in (workdir / "checkpoints").glob("*")):
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    raise TimeoutError("no checkpoint appeared")


@pytest.mark.launches
@pytest.mark.slow
def test_sigkill_then_restart_finishes_like_an_uninterrupted_run(tmp_path, text_data):
    # Killed 0.3 s after its first checkpoint (step 50): far from the end at 400.
    straight = run_cli(cli_train_args(text_data, tmp_path / "straight", 400))
    assert straight.returncode == 0, straight.stderr
    want = json.loads(straight.stdout.strip().splitlines()[-1])

    killed = tmp_path / "killed"
    args = [sys.executable, str(ROOT / "launch.py"), *cli_train_args(text_data, killed, 400)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_checkpoint(killed, proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before_kill = max(losses(killed))
    assert done_before_kill < 400  # killed on the way, not after the end
    again = run_cli(cli_train_args(text_data, killed, 400))
    assert again.returncode == 0, again.stderr
    assert "resumed from the checkpoint" in again.stdout
    assert json.loads(again.stdout.strip().splitlines()[-1]) == want
    records = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == sorted(set(steps)) == list(range(1, 401))  # the steps run again recorded once (were twice)

    evaluated = run_cli(["eval", f"--workdir={killed}"])
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert result["step"] == 400 and result["perplexity"] == pytest.approx(want["perplexity"], rel=1e-6)
    assert evaluated.stdout.splitlines()[-2].strip().startswith("perplexity")  # the summary


@pytest.mark.launches
@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_0(tmp_path, text_data):
    workdir = tmp_path / "run"
    args = [sys.executable, str(ROOT / "launch.py"), *cli_train_args(text_data, workdir, 100_000)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_checkpoint(workdir, proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert "SIGTERM" in out and saved == max(losses(workdir))  # the step it stopped at, saved


@pytest.mark.slow
def test_fine_tuning_starts_from_the_model_and_keeps_known_words(tmp_path, text_data):
    from elmo_jax.model.bilm import init_params
    from elmo_jax.model_io import load_model
    from elmo_jax.text.vocab import SPECIAL_TOKENS, Vocabulary
    from elmo_jax.train.warm_start import warm_start

    train(tiny_config(text_data, max_steps=3), tmp_path / "base")
    base = load_model(tmp_path / "base")
    vocab = Vocabulary([*SPECIAL_TOKENS, "zyzzyva", "bank", "river", "qwerty"])
    fresh = jax.tree.map(np.asarray, init_params(jax.random.key(7), base.config, len(vocab)))
    params, rows = warm_start(fresh, vocab, base, base.config)
    assert rows == {"kept": 5, "new": 2}  # <S>, </S>, <UNK>, bank, river
    for i, word in enumerate(vocab.words):
        want = base.params["softmax"]["W"][base.vocab.id(word)] if word in base.vocab else fresh["softmax"]["W"][i]
        np.testing.assert_array_equal(params["softmax"]["W"][i], want)
    for a, b in zip(jax.tree.leaves(params["lstm"]), jax.tree.leaves(base.params["lstm"])):
        np.testing.assert_array_equal(a, b)

    # A run from it, on other text (the held-out file) with another config's model section:
    # the architecture is the base model's.
    config = tiny_config(text_data, max_steps=2, init_from=str(tmp_path / "base"))
    with config.unlocked():
        config.model.lstm.dim = 48
        config.data.train, config.data.heldout = config.data.heldout, ""
    train(config, tmp_path / "tuned")
    saved = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert saved["model"]["lstm"]["dim"] == 32 and saved["train"]["init_from"] == str(tmp_path / "base")
    with pytest.raises(ValueError, match="another architecture.*lstm.dim: 48 != 32"):
        warm_start(
            fresh, vocab, base, dataclasses.replace(base.config, lstm=dataclasses.replace(base.config.lstm, dim=48))
        )


@pytest.mark.slow
def test_a_vocabulary_that_does_not_fit_the_checkpoint_fails_naming_both_sizes(tmp_path, text_data):
    from elmo_jax.model_io import load_model

    train(tiny_config(text_data, max_steps=2), tmp_path)
    vocab_path = tmp_path / "vocab.txt"
    words = vocab_path.read_text().splitlines()
    vocab_path.write_text("\n".join(words[:-5]) + "\n")
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["vocabulary"]  # a workdir from before the vocabulary was recorded
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=rf"has {len(words) - 5} words .* softmax of {len(words)} rows"):
        load_model(tmp_path)


@pytest.mark.slow
def test_fine_tuning_from_bilm_tf_files_under_their_own_names(tmp_path, text_data, fixtures_dir):
    """The AllenNLP fixture folder holds options.json + lm_weights.hdf5 (and other HDF5 files)."""
    config = tiny_config(text_data, max_steps=1, init_from=str(fixtures_dir / "elmo"))
    train(config, tmp_path / "tuned")
    saved = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert saved["model"]["lstm"]["dim"] == 64 and saved["model"]["char_cnn"]["n_highway"] == 2  # the fixture's sizes
