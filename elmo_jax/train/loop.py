"""The training loop: from an experiment config and a workdir to trained checkpoints. Opens the
data and the vocabulary, starts (fresh, fine-tuned or resumed) the state, runs the steps with
the record, checkpoints, held-out evaluations and the divergence checks, and stops cleanly on
a signal."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import NamedTuple

import jax
import ml_collections
import numpy as np

from elmo_jax import experiment, stop_signals
from elmo_jax.checkpoint import Checkpoints
from elmo_jax.config import ModelConfig
from elmo_jax.curves import plot_after_training
from elmo_jax.errors import UserError
from elmo_jax.interop.efml import EfmlTokens
from elmo_jax.model_io import load_model, model_options, model_token_ids
from elmo_jax.progress import ProgressBar
from elmo_jax.settings import TrainSettings
from elmo_jax.stop_signals import Stopped
from elmo_jax.text.batcher import StreamBatcher, epochs_done
from elmo_jax.text.chars import TokenIds
from elmo_jax.text.corpus import Corpus, first_sentences
from elmo_jax.text.sources import open_corpus
from elmo_jax.text.vocab import Vocabulary
from elmo_jax.train.divergence import DivergenceCheck
from elmo_jax.train.evaluate import HIGH_OOV, evaluate
from elmo_jax.train.metrics import MetricWriter, TrainWindow, log_eval
from elmo_jax.train.parallel import DataParallel, data_parallel
from elmo_jax.train.preemption import Preemption
from elmo_jax.train.prefetch import Prefetcher
from elmo_jax.train.run_lock import RunLock
from elmo_jax.train.step import TrainState, abstract_train_state, init_train_state, make_train_step
from elmo_jax.train.warm_start import warm_start
from elmo_jax.workdir import Workdir, softmax_table_rows

log = logging.getLogger(__name__)


def train(config: ml_collections.ConfigDict, workdir: str | Path) -> dict[str, float]:
    """Runs (or resumes) training in `workdir`; returns the final held-out evaluation ({} when
    stopped by SIGTERM / SIGINT, having saved a checkpoint of every step run). A start that
    fails or is stopped before its first step leaves the workdir as it found it."""
    experiment.validate(config)
    Workdir(workdir).check_not_a_model()
    run_start = _RunStart(Workdir(workdir))
    preemption = Preemption()
    try:
        return _train(config, run_start, preemption)
    except BaseException as error:
        removed = run_start.failed()  # before the first step: the workdir put back
        undone = f"; {run_start.run} is as it was (undone: {', '.join(removed)})" if removed else ""
        if isinstance(error, Stopped) and not run_start.over:
            log.info("stopped during start-up (%s): nothing was run%s", error.name, undone)
            return {}
        if undone:
            log.info("the start failed%s", undone)
        raise
    finally:
        preemption.close()
        run_start.release()


class _RunStart:
    """A run's start: its workdir made and locked (process 0) and, until its first step's numbers
    have been read, what it writes there undone if it fails."""

    def __init__(self, run: Workdir):
        self.run = run
        self._made = run.create()
        self._before = run.written()
        self._lock = RunLock(run) if jax.process_index() == 0 else None
        self.over = False  # the first step has run (its numbers read)

    def failed(self) -> list[str]:
        """Before the first step has run, puts the workdir back as it was (the lock still held:
        no other run can start in between); then releases the lock. Returns what it undid."""
        undone = [] if self.over or jax.process_index() != 0 else self.run.undo_start(self._before, self._made)
        self.release()
        return undone

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def resolve_config(config: ml_collections.ConfigDict, parallel: DataParallel) -> ml_collections.ConfigDict:
    """A copy of the config with train.devices set to the number of devices in use and, when
    fine-tuning, the model architecture of train.init_from."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.devices = parallel.size
    if config.train.init_from:
        config.model = ml_collections.ConfigDict(model_options(config.train.init_from))
    config.lock()
    return config


class _Data(NamedTuple):
    """What a run reads: its text, its vocabulary, the recipe for that vocabulary, its batches."""

    corpus: Corpus
    heldout: Corpus | None
    vocab: Vocabulary
    hp: TrainSettings
    batcher: StreamBatcher
    total_steps: int
    token_ids: TokenIds | None  # how the model's tokens become ids (None: bilm-tf's)


def _open_data(
    config: ml_collections.ConfigDict, workdir: Workdir, parallel: DataParallel, model_config: ModelConfig
) -> _Data:
    """The corpora, the vocabulary (built or read; recorded in config.json with the config) and
    the batcher, and the run's length in steps."""
    t = config.train
    train_corpus = open_corpus(config.data.train, "train")
    heldout = open_corpus(config.data.heldout, "heldout") if config.data.heldout else None
    vocab, vocab_source = workdir.training_vocab(config, train_corpus)
    token_ids = _token_ids(config, workdir, model_config)
    tokenized = train_corpus.tokenized(vocab, token_ids)  # kept for the batcher; counts the sentences too
    if len(train_corpus) == 0:
        raise UserError(f"{train_corpus.name}: no sentences (the files are empty)")
    outside = tokenized.oov_rate()
    if isinstance(token_ids, EfmlTokens):  # what the model itself reads as <oov>
        counts = np.bincount(tokenized.ids, minlength=len(tokenized.types))
        words, chars = token_ids.unknown_shares(tokenized.types.strings, counts)
        log.log(logging.WARNING if max(words, chars) > HIGH_OOV else logging.INFO,
                "%s: %.1f%% of its tokens are outside the model's word.dic and %.1f%% of their characters outside its "
                "char.dic: the model reads them as <oov>", train_corpus.name, 100 * words, 100 * chars)  # fmt: skip
    if outside > HIGH_OOV:
        log.warning("%s: %.1f%% of its words are outside the vocabulary of %d words: they are trained as <UNK> "
                    "(is the vocabulary the text's?)", train_corpus.name, 100 * outside, len(vocab))  # fmt: skip
    hp = experiment.train_settings(config, len(vocab))
    workdir.write_config(config, vocab, vocab_source)

    batch_size = t.per_device_batch_size * parallel.size
    batcher = StreamBatcher(
        train_corpus,
        vocab,
        batch_size,
        t.unroll_steps,
        seed=t.seed,
        rows=parallel.local_rows(batch_size),
        table_multiple=parallel.local_size,
        fixed_table=parallel.fixed_table,
        groups=parallel.size,
        char_window=model_config.char_cnn.widest_filter,
        backward_order=config.data.backward_order,
        token_ids=token_ids,
    )
    steps_per_epoch = batcher.steps_per_epoch()
    total_steps = math.ceil(t.n_epochs * steps_per_epoch)
    if t.max_steps > 0:
        total_steps = min(total_steps, t.max_steps)
    log.info(
        "data: %s, %d sentences, %d words in the vocabulary; %d steps per epoch of %d x %d (%d device(s), %d "
        "process(es)); running %d steps",
        train_corpus.name,
        len(train_corpus),
        len(vocab),
        steps_per_epoch,
        batch_size,
        t.unroll_steps,
        parallel.size,
        jax.process_count(),
        total_steps,
    )
    if hp.lr_batch_scaling != "none" or hp.warmup_steps:
        log.info(
            "learning rate %.6g for %d rows a step (%s scaling of %g from %d rows)%s",
            hp.batch_learning_rate(),
            hp.global_batch,
            hp.lr_batch_scaling,
            hp.learning_rate,
            hp.lr_reference_batch,
            f", reached after a warm-up of {hp.warmup_steps} steps" if hp.warmup_steps else "",
        )
    return _Data(train_corpus, heldout, vocab, hp, batcher, total_steps, token_ids)


def _token_ids(config: ml_collections.ConfigDict, workdir: Workdir, model_config: ModelConfig) -> TokenIds | None:
    """How the run's tokens become ids: bilm-tf's (None), or the dictionaries of the
    ELMoForManyLangs model it fine-tunes (copied into the workdir until its first checkpoint,
    read there once it has one)."""
    if model_config.token_ids == "bytes" or workdir.trained():
        return workdir.token_ids(model_config)
    if not config.train.init_from:
        raise UserError(
            f"config.model.token_ids {model_config.token_ids!r}: the characters are numbered by the model's own "
            "dictionaries; fine-tune an ELMoForManyLangs model (--config.train.init_from=FOLDER)"
        )
    token_ids = model_token_ids(config.train.init_from, model_config)  # every process: none waits for a file
    workdir.keep_token_ids(token_ids)
    return token_ids


def _start_state(
    config: ml_collections.ConfigDict,
    workdir: Workdir,
    model_config: ModelConfig,
    data: _Data,
    checkpoints: Checkpoints,
    parallel: DataParallel,
) -> tuple[TrainState, int, TrainState]:
    """The state to run from, the step it holds and its shardings: the newest good checkpoint's
    (the batcher restored to where it was), else a fresh or fine-tuned one at step 0."""
    batch_size, table_rows = data.batcher.batch_size, softmax_table_rows(config, len(data.vocab))
    abstract = abstract_train_state(model_config, data.hp, batch_size, table_rows, parallel, config.train.shard_softmax)
    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    start = checkpoints.good_step(quarantine=True)
    if start is None:
        return _fresh_state(config, model_config, data.hp, data.vocab, batch_size, table_rows, shardings), 0, shardings
    workdir.check_checkpoint(checkpoints.param_shapes(start), start, model_config)
    workdir.check_vocab(checkpoints.softmax_table_rows(start), config, data.vocab)
    state, data_state = checkpoints.restore(start, abstract, parallel.rows, data.batcher.positions_shape)
    data.batcher.restore(data_state)
    log.info("resumed from the checkpoint at step %d", start)
    return state, start, shardings


def _train(config: ml_collections.ConfigDict, run_start: _RunStart, preemption: Preemption) -> dict[str, float]:
    workdir = run_start.run
    parallel = data_parallel(config.train.devices)
    config = resolve_config(config, parallel)
    t = config.train
    parallel.check_rows(t.eval_batch_size, "config.train.eval_batch_size")
    model_config = experiment.model_config(config)
    workdir.check_resume(config, model_config)
    stop_signals.check()
    data = _open_data(config, workdir, parallel, model_config)
    stop_signals.check()
    log.info("config (as run, also in %s):\n%s", workdir.config_json, config)
    heldout, vocab, hp, total_steps = data.heldout, data.vocab, data.hp, data.total_steps
    checkpoints = Checkpoints(workdir.checkpoints, t.checkpoint_every, t.keep_checkpoints, clean_up=True)
    state, start, shardings = _start_state(config, workdir, model_config, data, checkpoints, parallel)
    stop_signals.check()

    # The periodic evaluations' sentences, chosen once (their word table is made once).
    periodic = first_sentences(heldout, t.eval_sentences) if heldout is not None and t.eval_sentences else heldout

    def evaluate_heldout(params, corpus: Corpus | None) -> dict[str, float]:
        assert corpus is not None, "called only where there is held-out text"
        return evaluate(
            params, corpus, vocab, model_config, t.eval_batch_size, t.unroll_steps, parallel=parallel,
            token_ids=data.token_ids,
        )  # fmt: skip

    step_fn = make_train_step(model_config, hp, parallel, shardings)
    writer = MetricWriter(workdir, start)
    window = TrainWindow(writer, total_steps, "sampled" if hp.sample_softmax else "full")
    divergence = DivergenceCheck(checkpoints, hp, t.divergence_factor)
    bar = ProgressBar(total_steps, done=start)
    prefetch = Prefetcher(data.batcher, parallel.put_batch)

    def record(step: int, metrics: dict[str, jax.Array]) -> None:
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        run_start.over = True
        divergence.metrics(step, values)
        window.add(values)

    pending = None  # (step, device metrics) not yet read
    step, stopped = start, False
    try:  # the event file is closed even when training raises (an atexit close fails on Python 3.12)
        try:
            with preemption.steps():
                for step in range(start + 1, total_steps + 1):
                    with window.waiting_for_input():
                        batch, data_state = next(prefetch)
                    with window.leave_out(only_if_compiled=True):  # a new shape of word table compiles
                        state, metrics = step_fn(state, batch)
                    window.dispatched(metrics["loss"])
                    # Read the previous step's numbers while this one runs.
                    if pending is not None:
                        record(*pending)
                    pending = (step, metrics)
                    stopped = preemption.reached(step)
                    must_save = checkpoints.is_due(step) or step == total_steps or stopped
                    if must_save or step % t.log_every == 0:
                        record(*pending)  # this step must be good first
                        pending = None
                    if step % t.log_every == 0:
                        loss, steps_in_window = window.mean_loss()
                        window.log(step, epochs_done(data_state, len(data.corpus)))
                        divergence.window(step, loss, steps_in_window)
                    if must_save:
                        divergence.state(step, state, *window.mean_loss())
                    if stopped:
                        checkpoints.save_and_wait(step, state, data_state, parallel.rows)
                    elif must_save:
                        checkpoints.save(step, state, data_state, parallel.rows)
                    if heldout is not None and t.eval_every > 0 and step % t.eval_every == 0 and step < total_steps:
                        with window.leave_out():
                            result = evaluate_heldout(state.params, periodic)
                        log_eval(step, result, writer)
                        divergence.heldout(step, result)
                    bar.update(step, f"loss {window.last_loss:.3f}")
                    if stopped:
                        log.info("stopped (%s): saved the checkpoint at step %d, exiting", preemption.requested, step)
                        break
        finally:
            bar.close()
            prefetch.close()
            window.close()
            checkpoints.wait()
            checkpoints.close()
        result = {}
        if preemption.requested and not stopped:  # it came after the last step's check: all saved
            log.info("stopped (%s) after the last step: every step is saved; `elmo-jax eval` evaluates it",
                     preemption.requested)  # fmt: skip
        elif heldout is not None and not stopped:
            try:
                result = evaluate_heldout(state.params, heldout)
                log_eval(step, result, writer)
                divergence.heldout(step, result)
            except Stopped as stop:
                log.info(
                    "stopped during the final evaluation (%s): every step is saved; `elmo-jax eval` evaluates it",
                    stop.name,
                )
    finally:
        writer.close()
    if jax.process_index() == 0 and (result or not preemption.requested):  # a stopped run exits at once
        with stop_signals.deferred():  # a signal now comes once the work is done: the curves still drawn
            plot_after_training(workdir)
    return result


def _fresh_state(
    config: ml_collections.ConfigDict,
    model_config: ModelConfig,
    hp: TrainSettings,
    vocab: Vocabulary,
    batch_size: int,
    table_rows: int,
    shardings: TrainState,
) -> TrainState:
    """A new run's state laid out by `shardings`: initialised from train.seed, or fine-tuned
    from train.init_from."""
    t = config.train

    def init():
        return init_train_state(jax.random.key(t.seed), model_config, hp, batch_size, table_rows)

    state = jax.jit(init, out_shardings=shardings)()
    if t.init_from:
        params, kept = warm_start(jax.device_get(state.params), vocab, load_model(t.init_from), model_config)
        state = state.replace(params=jax.device_put(params, shardings.params))
        log.info(
            "fine-tuning from %s: its token encoder and LSTMs; softmax rows of %d known words kept, %d new",
            t.init_from,
            kept["kept"],
            kept["new"],
        )
    return state
