"""The log window's rates count the steps' own time: compilation and evaluations are left out."""

import time

import jax
import jax.numpy as jnp
import pytest

from benchmarks.common import StandInDevice
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


STEP_S = 0.05


def run_against(batch_s: float, steps: int = 25) -> tuple[float, float]:
    """The loop's pattern (one step in flight; the previous step's numbers read after the next
    dispatch) with batches that take `batch_s` to come: (input_bound, the wait's share)."""
    records = Records()
    window = TrainWindow(records, total_steps=steps, softmax="sampled")
    device = StandInDevice(STEP_S)
    pending, waited = None, 0.0
    try:
        for _ in range(steps):
            asked = time.monotonic()
            with window.waiting_for_input():
                time.sleep(batch_s)  # the host making the batch
            waited += time.monotonic() - asked
            out = device.step()
            window.dispatched(out)
            if pending is not None:
                pending.block_until_ready()  # the previous step's numbers read
            pending = out
            window.add({"loss": 2.0, "loss_forward": 2.1, "loss_backward": 1.9, "grad_norm": 1.0, "tokens": 1})
        pending.block_until_ready()
        elapsed = window.elapsed()
        window.log(step=steps, epoch=0.0)
    finally:
        window.close()
    return records.written[0][2]["input_bound"], waited / elapsed


def test_input_bound_is_the_share_of_time_the_device_had_nothing_to_do(caplog):
    """Against a stand-in step of T: a host making a batch in 0.6 T keeps the device busy (0%),
    one taking 1.5 T leaves it idle 0.5 T a step (33%), and says so, once. The loop's wait alone,
    which the figure was until now, reads about 60% and 100%: the step still running is in it."""
    caplog.set_level("INFO", logger="elmo_jax.train.metrics")
    faster, faster_wait = run_against(0.6 * STEP_S)
    slower, slower_wait = run_against(1.5 * STEP_S)
    assert faster < 0.08 and faster_wait > 0.4, (faster, faster_wait)
    assert 0.2 < slower < 0.45 and slower_wait > 0.85, (slower, slower_wait)
    warnings = [r for r in caplog.records if "had nothing to do" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert "input-bound" in caplog.text
