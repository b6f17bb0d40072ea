"""The log window's rates count the steps' own time: compilation and evaluations are left out."""

import time

import jax
import jax.numpy as jnp
import pytest

from elmo_jax.train.metrics import TrainWindow


class Records:
    def __init__(self):
        self.written = []

    def write(self, step, kind, values):
        self.written.append((step, kind, values))


def many_ops(x):
    """A program whose compilation takes a while (a second or so on a CPU)."""
    for i in range(300):
        x = jnp.sin(x @ x.T @ x + i) if i % 2 else jnp.tanh(x * i)
    return x


def test_step_calls_that_compile_and_evaluations_are_left_out_of_the_rates():
    records = Records()
    window = TrainWindow(records, total_steps=10, softmax="sampled")
    step = jax.jit(many_ops)
    with window.leave_out(only_if_compiled=True):
        step(jnp.ones((5, 9))).block_until_ready()  # compiles: a second or so
    with window.leave_out(only_if_compiled=True):
        step(jnp.ones((5, 9))).block_until_ready()
        time.sleep(0.2)  # a step's work
    with window.leave_out():  # an evaluation
        time.sleep(0.3)
    window.add({"loss": 2.0, "loss_forward": 2.1, "loss_backward": 1.9, "grad_norm": 1.0, "tokens": 1000})
    assert 0.2 <= window.elapsed() < 0.3
    window.log(step=1, epoch=0.0)
    ((_, kind, values),) = records.written
    assert kind == "train" and 1000 / 0.4 < values["tokens_per_sec"] <= 1000 / 0.2
    assert values["step_time_s"] == pytest.approx(1000 / values["tokens_per_sec"])


def test_compiles_are_logged_at_info_from_half_a_second_and_at_debug_below(caplog):
    """So that Orbax's first save (a 0.1 s slice program per replicated array) floods no terminal."""
    from elmo_jax import compile_time

    caplog.set_level("DEBUG", logger=compile_time.log.name)
    compile_time._on_duration(compile_time._PROGRAM, 12.5, fun_name="jit(train_step)")
    compile_time._on_duration(compile_time._PROGRAM, 0.1, fun_name="jit(slice)")
    levels = {r.getMessage(): r.levelname for r in caplog.records}
    assert levels == {"compiled jit(train_step) in 12.5 s": "INFO", "compiled jit(slice) in 0.1 s": "DEBUG"}


def test_time_waiting_for_batches_is_the_input_bound_share_and_warned_about_once(caplog):
    caplog.set_level("INFO", logger="elmo_jax.train.metrics")
    records = Records()
    window = TrainWindow(records, total_steps=10, softmax="sampled")
    metrics = {"loss": 2.0, "loss_forward": 2.1, "loss_backward": 1.9, "grad_norm": 1.0, "tokens": 1000}
    for waited in (0.15, 0.0):  # a window input-bound a half of its time, then one not at all
        with window.waiting_for_input():
            time.sleep(waited)
        time.sleep(0.15)  # the step
        window.add(dict(metrics))
        window.log(step=1, epoch=0.0)
    shares = [values["input_bound"] for _, _, values in records.written]
    assert 0.35 < shares[0] < 0.65 and shares[1] < 0.05
    warnings = [r for r in caplog.records if "waited for their batches" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert "input-bound" in caplog.text
