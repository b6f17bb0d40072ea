"""`plan`'s expected time: the rates per kernel class fitted to the H200 step times measured
(elmo_jax/plan/rates_h200.json, written by benchmarks/speed/plan_rates.py) are what fitting the
stored runs gives, each run is predicted within 15% by the rates fitted without it, and
docs/PERFORMANCE.md shows that table as the data says. No device and no compiler needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.speed.plan_rates import markdown
from elmo_jax.plan.kernels import Kernel
from elmo_jax.plan.rates import FEATURES, expected, features, fit, kernel_seconds, leave_one_out, table
from elmo_jax.plan.targets import target

DOCS = Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"


@pytest.fixture(scope="module")
def h200():
    return table("h200")


def test_the_stored_rates_are_the_fit_of_the_stored_runs(h200):
    assert len(h200["runs"]) >= 10 and len({r["run"]["date"] for r in h200["runs"]}) >= 2
    rates = fit(h200["runs"])
    assert rates == pytest.approx(h200["rates"], rel=1e-6)
    assert set(rates) == set(FEATURES) and all(v >= 0 for v in rates.values())


def test_each_measured_run_is_predicted_within_15_percent_without_it(h200):
    loo = leave_one_out(h200["runs"])
    assert [r["error"] for r in loo] == pytest.approx([r["error"] for r in h200["leave_one_out"]], abs=1e-6)
    assert max(abs(r["error"]) for r in loo) <= 0.15
    # The floor alone, for comparison, is 25-40% under every measured step.
    assert all(r["floor_s"] < 0.8 * r["measured_s"] for r in loo)


def test_the_documented_table_is_the_stored_one(h200):
    assert markdown(h200["leave_one_out"]) in DOCS.read_text()


def _kernel(kind: str, flops: float, bytes: float, runs: int = 1) -> Kernel:
    return Kernel("k", "fusion", "lstm", runs, flops, bytes, "bf16" if flops else "", "src", kind=kind)


def test_a_matmul_is_counted_by_what_bounds_its_floor():
    """A matmul whose FLOPs take longer than its bytes at the peaks is compute-bound, else
    memory-bound; a collective is left out (its floor is added as it is)."""
    h200 = target("h200")
    compute = _kernel("matmul", 989e12 * 1e-3, 4.8e12 * 1e-4)  # 1 ms of FLOPs, 0.1 ms of bytes
    memory = _kernel("matmul", 989e12 * 1e-4, 4.8e12 * 1e-3, runs=3)
    x = features([compute, memory, _kernel("collective", 0, 1e9), _kernel("reduction", 0, 4.8e9)], h200)
    assert x["matmul_compute"] == pytest.approx(1e-3) and x["matmul_memory"] == pytest.approx(3e-3)
    assert x["reduction"] == pytest.approx(1e-3) and x["launches"] == 5 and x["step"] == 1


def test_no_expected_time_where_none_was_measured_on_its_kind():
    """A TPU gets none (its compiler's kernels are not a GPU's); an H100 the H200's rates, said so."""
    kernels = [_kernel("elementwise", 0, 1e9)]
    assert expected(kernels, target("v5e"), 0.0) is None
    h100 = expected(kernels, target("h100"), 0.0)
    assert h100["borrowed"] and h100["rates_from"] == "h200"


def test_the_kernels_expected_seconds_add_up_to_the_expected_step(h200):
    """step_profile's per-kernel expectation (`kernel_seconds`) and `expected`'s step are one
    model: the kernels' seconds plus the fixed cost of a step are the step; a collective has none."""
    target_ = target("h200")
    kernels = [
        _kernel("matmul", 989e12 * 1e-3, 4.8e12 * 1e-4, runs=2),
        _kernel("elementwise", 0, 4.8e9, runs=21),
        _kernel("pallas", 0, 1e8),
        _kernel("collective", 0, 1e9),
    ]
    rates = h200["rates"]
    seconds = [kernel_seconds(k, target_, rates) for k in kernels]
    assert seconds[-1] is None and all(s > 0 for s in seconds[:-1])
    step = expected(kernels, target_, 0.0)["step_s"]
    assert sum(s for s in seconds if s is not None) + rates["step"] == pytest.approx(step, rel=1e-12)


def test_a_kernel_of_ours_that_never_ran_on_a_device_is_named_whatever_the_target():
    """The pallas class's rate was fitted on our LSTM cell's kernels alone: plan names every other
    kernel of ours in the program (with its products' FLOPs), on a GPU as borrowing that rate and
    on a TPU too (no expected time there), so that nobody reads its time or its numbers as measured."""
    from elmo_jax.plan.rates import never_run
    from elmo_jax.plan.report import _never_run_lines

    def ours(name: str, flops: float, runs: int = 1) -> Kernel:
        source = f"jit(train_step)/jvp()/lstm/while/body/{name}/pallas_call"
        return Kernel(name, "custom-call", "LSTM loops", runs, flops, 1e6, "", source, kind="pallas")

    kernels = [ours("lstm_forward_cell", 0.0, runs=21), ours("lstm_fused_cell", 5e9, runs=21)]
    found = never_run([*kernels, ours("char_cnn_max", 0.0), _kernel("matmul", 1e9, 1e6)])
    assert found == {"lstm_fused_cell": 21 * 5e9, "char_cnn_max": 0.0}
    assert never_run([ours("lstm_backward_cell", 0.0)]) == {}
    (line,) = _never_run_lines(found)
    assert line.startswith("never run on a device: lstm_fused_cell (with matmuls), char_cnn_max (no matmuls):")
    assert _never_run_lines({}) == []


def test_a_measured_kernel_of_ours_whose_code_changed_since_is_said_to_have_changed():
    """The pallas class's rate was fitted on our LSTM cell's kernels as they were then: where they
    are in a program, plan says their code has changed since, not that they are measured."""
    from elmo_jax.plan.rates import changed_since_measured
    from elmo_jax.plan.report import _changed_lines

    def ours(name: str) -> Kernel:
        source = f"jit(train_step)/jvp()/lstm/while/body/{name}/pallas_call"
        return Kernel(name, "custom-call", "LSTM loops", 21, 0.0, 1e6, "", source, kind="pallas")

    program = [ours("lstm_backward_cell"), ours("lstm_forward_cell"), ours("char_cnn_max"), _kernel("matmul", 1e9, 1e6)]
    assert changed_since_measured(program) == ["lstm_backward_cell", "lstm_forward_cell"]
    (line,) = _changed_lines(changed_since_measured(program))
    assert line.startswith("changed since their measured run: lstm_backward_cell, lstm_forward_cell (")
    assert "lstm_backward_cell: it computes the cell" in line and "lstm_forward_cell: no kernel" in line
    (line,) = _changed_lines(changed_since_measured([ours("lstm_backward_output")]))  # each kernel's own changes
    assert "lstm_backward_output: no kernel" in line and "W_proj" not in line
    assert changed_since_measured([ours("char_cnn_max")]) == [] and _changed_lines([]) == []
