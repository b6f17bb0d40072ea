"""The training run: data, vocabulary, state (fresh or resumed), the step loop with logging,
held-out evaluation, checkpoints and preemption."""

from __future__ import annotations

import functools
import logging
import math
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
from jax.experimental import multihost_utils

from elmo_jax.errors import RunFailed, UserError
from elmo_jax.experiment import model_config, train_hparams, validate
from elmo_jax.model_io import load_model, model_options
from elmo_jax.progress import ProgressBar, format_duration
from elmo_jax.text.batcher import StreamBatcher, epochs_done
from elmo_jax.text.sources import open_corpus
from elmo_jax.train.checkpoint import Checkpoints
from elmo_jax.train.evaluate import evaluate, safe_exp
from elmo_jax.train.metrics import MetricWriter
from elmo_jax.train.parallel import DataParallel, data_parallel
from elmo_jax.train.prefetch import Prefetcher
from elmo_jax.train.run_lock import RunLock
from elmo_jax.train.step import TrainState, init_train_state, make_train_step
from elmo_jax.train.warm_start import warm_start
from elmo_jax.workdir import Workdir, softmax_table_rows

log = logging.getLogger(__name__)


class TrainingDiverged(RunFailed):
    pass


def abstract_train_state(
    config: ml_collections.ConfigDict, vocab_size: int, parallel: DataParallel | None = None
) -> TrainState:
    """Shapes, dtypes and shardings of the TrainState of a run whose config has its devices
    resolved, for restoring a checkpoint; laid out by `parallel` (default: replicated over all
    devices)."""
    model, hp = model_config(config), train_hparams(config, vocab_size)
    batch = config.train.per_device_batch_size * config.train.devices
    abstract = jax.eval_shape(
        lambda: init_train_state(jax.random.key(0), model, hp, batch, softmax_table_rows(config, vocab_size))
    )
    if parallel is None:
        shardings = jax.tree.map(lambda _: data_parallel().replicated, abstract)
    else:
        shardings = parallel.state_shardings(abstract, config.train.shard_softmax)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def resolve_config(config: ml_collections.ConfigDict, parallel: DataParallel) -> ml_collections.ConfigDict:
    """A copy of the config with train.devices set to the number of devices in use and, when
    fine-tuning, the model architecture of train.init_from."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.devices = parallel.size
    if config.train.init_from:
        config.model = ml_collections.ConfigDict(model_options(config.train.init_from))
    config.lock()
    return config


class Stopped(Exception):
    """Raised by a stop signal once the handler is set to interrupt (the final evaluation)."""


class Preemption:
    """SIGTERM and SIGINT, seen by every process at the same step. One process: a Python
    signal handler sets a flag the loop checks between steps (a second SIGINT quits at once).
    Several: JAX's preemption sync point (installed by jax.distributed.initialize) makes all of
    them stop at the same step on SIGTERM, so their collectives and the checkpoint save line up.
    Installed before any work, so a signal during start-up also ends the run cleanly."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = None  # the signal's name once one arrived
        self.interrupt = False  # raise Stopped from the handler instead of setting the flag
        self._previous = {}
        if jax.process_count() == 1:
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.requested == "SIGINT":
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        if self.interrupt:
            raise Stopped(self.requested)
        if signum == signal.SIGINT:
            log.info("SIGINT: stopping after this step with a checkpoint (press Ctrl-C again to quit without one)")

    def reached(self, step: int) -> bool:
        if jax.process_count() > 1 and not self.requested and multihost_utils.reached_preemption_sync_point(step):
            self.requested = "SIGTERM"
        return self.requested is not None

    def close(self):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def _advice(config: ml_collections.ConfigDict) -> str:
    t = config.train
    return (
        f"lower config.train.learning_rate (now {t.learning_rate}), or check config.train.all_clip_norm_val "
        f"(now {t.all_clip_norm_val}) and config.train.initial_accumulator_value (now {t.initial_accumulator_value}); "
        "a rerun with changed values resumes from that checkpoint"
    )


def _diverged(step: int, what: str, checkpoints: Checkpoints, config: ml_collections.ConfigDict) -> TrainingDiverged:
    """The error for a non-finite `what` at `step`, once the save in flight has landed."""
    checkpoints.wait()
    return TrainingDiverged(
        f"step {step}: {what}: training diverged; the latest checkpoint (step {checkpoints.latest_step()}) is the "
        f"last good state. {_advice(config)}"
    )


def _check_finite(
    step: int, metrics: dict[str, float], checkpoints: Checkpoints, config: ml_collections.ConfigDict
) -> None:
    if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
        raise _diverged(step, f"loss {metrics['loss']} and gradient norm {metrics['grad_norm']}", checkpoints, config)


def _check_state_finite(
    step: int, state: TrainState, checkpoints: Checkpoints, config: ml_collections.ConfigDict
) -> None:
    """Nothing non-finite is saved: the params and optimizer state after the step's update."""
    if not bool(_all_finite((state.params, state.opt_state))):
        raise _diverged(step, "the update left non-finite params or optimizer state (not saved)", checkpoints, config)


def train(config: ml_collections.ConfigDict, workdir: str | Path) -> dict[str, float]:
    """Runs (or resumes) training in `workdir`; returns the final held-out evaluation ({} when
    stopped by SIGTERM / SIGINT, having saved a checkpoint of every step run)."""
    validate(config)
    workdir = Workdir(workdir)
    workdir.path.mkdir(parents=True, exist_ok=True)
    lock = RunLock(workdir) if jax.process_index() == 0 else None
    preemption = Preemption()
    try:
        return _train(config, workdir, preemption)
    finally:
        preemption.close()
        if lock is not None:
            lock.release()


def _train(config: ml_collections.ConfigDict, workdir: Workdir, preemption: Preemption) -> dict[str, float]:
    parallel = data_parallel(config.train.devices)
    config = resolve_config(config, parallel)
    t = config.train
    parallel.check_rows(t.eval_batch_size, "config.train.eval_batch_size")
    workdir.check_resume(config)
    model = model_config(config)
    train_corpus = open_corpus(config.data.train, "train")
    if len(train_corpus) == 0:
        raise UserError(f"{train_corpus.name}: no sentences (the files are empty)")
    heldout = open_corpus(config.data.heldout, "heldout") if config.data.heldout else None
    vocab = workdir.training_vocab(config, train_corpus)
    hp = train_hparams(config, len(vocab))
    workdir.write_config(config, vocab)

    batch_size = t.per_device_batch_size * parallel.size
    batcher = StreamBatcher(
        train_corpus,
        vocab,
        batch_size,
        t.unroll_steps,
        seed=t.seed,
        rows=parallel.local_rows(batch_size),
        table_size=parallel.table_size,
        groups=parallel.size,
        char_window=model.char_cnn.widest_filter,
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

    checkpoints = Checkpoints(workdir.checkpoints, t.checkpoint_every, t.keep_checkpoints)
    abstract = abstract_train_state(config, len(vocab), parallel)
    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    start = checkpoints.good_step(quarantine=True)
    if start is None:
        init = functools.partial(
            init_train_state, jax.random.key(t.seed), model, hp, batch_size, softmax_table_rows(config, len(vocab))
        )
        state = jax.jit(init, out_shardings=shardings)()
        start = 0
        if t.init_from:
            params, rows = warm_start(jax.device_get(state.params), vocab, load_model(t.init_from), model)
            state = state.replace(params=jax.device_put(params, shardings.params))
            log.info(
                "fine-tuning from %s: its token encoder and LSTMs; softmax rows of %d known words kept, %d new",
                t.init_from,
                rows["kept"],
                rows["new"],
            )
    else:
        workdir.check_vocab(checkpoints.softmax_table_rows(start), config, vocab)
        state, data_state = checkpoints.restore(start, abstract, parallel, batch_size)
        batcher.restore(data_state)
        log.info("resumed from the checkpoint at step %d", start)
    if preemption.requested:
        log.info("stopped during start-up (%s): nothing run since step %d, exiting", preemption.requested, start)
        checkpoints.close()
        return {}

    compile_start = time.monotonic()
    step_fn = make_train_step(model, hp, t.scan_unroll, parallel, shardings)
    writer = MetricWriter(workdir)
    bar = ProgressBar(total_steps)
    prefetch = Prefetcher(batcher, parallel.put_batch)
    pending = None  # (step, device metrics) not yet read
    window = {"start": time.monotonic(), "steps": 0, "tokens": 0, "sums": {}}
    accumulate = functools.partial(_accumulate, window, checkpoints, config)
    softmax = "sampled" if hp.sample_softmax else "full"
    step = start
    stopped = False
    try:
        for step in range(start + 1, total_steps + 1):
            batch, data_state = next(prefetch)
            state, metrics = step_fn(state, batch)
            if step == start + 1:
                log.info("train step compiled in %.1fs", time.monotonic() - compile_start)
                window["start"] = bar.start = time.monotonic()  # rates exclude the compile
            # Read the previous step's numbers while this one runs.
            if pending is not None:
                accumulate(*pending)
            pending = (step, metrics)
            stopped = preemption.reached(step)
            must_save = checkpoints.is_due(step) or step == total_steps or stopped
            if must_save or step % t.log_every == 0:
                accumulate(*pending)  # this step must be good first
                pending = None
            if step % t.log_every == 0:
                _log_train(window, step, total_steps, epochs_done(data_state, len(train_corpus)), writer, softmax)
            if must_save:
                _check_state_finite(step, state, checkpoints, config)
            if stopped:
                checkpoints.save_and_wait(step, state, data_state, parallel)
            elif must_save:
                checkpoints.save(step, state, data_state, parallel)
            if heldout is not None and t.eval_every > 0 and step % t.eval_every == 0 and step < total_steps:
                result = evaluate(
                    state.params,
                    heldout,
                    vocab,
                    model,
                    t.eval_batch_size,
                    t.unroll_steps,
                    t.eval_sentences or None,
                    parallel,
                )
                _log_eval(step, result, writer)
            bar.update(step, start + 1, f"loss {window.get('last_loss', float('nan')):.3f}")
            if stopped:
                log.info("stopped (%s): saved the checkpoint at step %d, exiting", preemption.requested, step)
                break
    finally:
        bar.clear()
        prefetch.close()
        checkpoints.wait()
        checkpoints.close()
    result = {}
    if heldout is not None and not stopped:
        preemption.interrupt = True
        try:
            result = evaluate(state.params, heldout, vocab, model, t.eval_batch_size, t.unroll_steps, parallel=parallel)
            _log_eval(step, result, writer)
        except Stopped as signal_name:
            log.info(
                "stopped during the final evaluation (%s): every step is saved; `launch.py eval` evaluates it",
                signal_name,
            )
    writer.close()
    return result


def _accumulate(window: dict, checkpoints: Checkpoints, config: ml_collections.ConfigDict, step: int, metrics) -> None:
    values = {k: float(v) for k, v in jax.device_get(metrics).items()}
    _check_finite(step, values, checkpoints, config)
    window["steps"] += 1
    window["tokens"] += values.pop("tokens")
    for k, v in values.items():
        window["sums"][k] = window["sums"].get(k, 0.0) + v
    window["last_loss"] = values["loss"]


def _log_train(window: dict, step: int, total: int, epoch: float, writer: MetricWriter, softmax: str) -> None:
    """Logs the window's means; `softmax` ("sampled" or "full") says what the train perplexities are of."""
    now = time.monotonic()
    elapsed = now - window["start"]
    n = max(window["steps"], 1)
    mean = {k: v / n for k, v in window["sums"].items()}
    step_time = elapsed / n
    values = {
        **mean,
        "perplexity_forward": safe_exp(mean["loss_forward"]),
        "perplexity_backward": safe_exp(mean["loss_backward"]),
        "tokens_per_sec": window["tokens"] / max(elapsed, 1e-9),
        "step_time_s": step_time,
        "epoch": epoch,
    }
    eta = (total - step) * step_time
    log.info(
        "step %d/%d | epoch %.2f | loss %.3f | train ppl fwd %.1f bwd %.1f (%s) | grad norm %.2f | "
        "%s tok/s | %.0f ms/step | ETA %s",
        step,
        total,
        epoch,
        mean["loss"],
        values["perplexity_forward"],
        values["perplexity_backward"],
        softmax,
        mean["grad_norm"],
        f"{values['tokens_per_sec']:,.0f}",
        1000 * step_time,
        format_duration(eta),
    )
    writer.write(step, "train", values)
    window.update(start=now, steps=0, tokens=0, sums={})


def _log_eval(step: int, result: dict[str, float], writer: MetricWriter) -> None:
    floor = f" (floor {result['floor_perplexity']:.2f})" if "floor_perplexity" in result else ""
    log.info(
        "step %d | held-out perplexity %.2f (forward %.2f, backward %.2f) over %d tokens%s",
        step,
        result["perplexity"],
        result["forward_perplexity"],
        result["backward_perplexity"],
        result["tokens"],
        floor,
    )
    writer.write(step, "eval", {k: float(v) for k, v in result.items()})
