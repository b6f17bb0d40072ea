"""The expected step time: each kernel class's floor scaled by how far above its floor that class
ran on a real device, fitted to measured step times (docs/PERFORMANCE.md, "`plan`'s expected
time").

A program's features are, per class (FEATURES), the summed floors of its kernels (`Kernel.floor`:
the slower of its FLOPs at the peak and its bytes at the bandwidth, without the launch), its
kernel launches and 1 (a per-step cost: the batch's transfer, the host's round trip). Its
expected time is the features times the fitted rates (multipliers of the floors; seconds a launch
and a step), plus its collectives' floors (no multi-device run has been measured). The rates are
fitted to measured runs by non-negative least squares on the relative error, each rate held
towards its prior (PRIORS: the floor itself, the launch and step costs read from a trace) with
weight PRIOR_WEIGHT, so that a class the runs cannot tell apart stays near what is known of it.
The measured runs, their features and the fitted rates are kept per target as data
(elmo_jax/plan/rates_<target>.json), written by `python -m benchmarks.speed.plan_rates`.
"""

from __future__ import annotations

import json
import math
from importlib import resources

import numpy as np

from elmo_jax.plan.kernels import Kernel

# A matmul bound by its FLOPs and one bound by its bytes run at different shares of their floors.
FEATURES = (
    "matmul_compute",
    "matmul_memory",
    "elementwise",
    "reduction",
    "gather_scatter",
    "sort",
    "pallas",
    "launches",
    "step",
)
# Floors x 1; 0.65 us a launch (kernels in CUDA graphs, the H200 trace of 2026-12-04); 1.1 ms a
# step waited for (the same trace: the batch's transfer and the host's round trip).
PRIORS = {**{f: 1.0 for f in FEATURES}, "launches": 0.65e-6, "step": 1.1e-3}
PRIOR_WEIGHT = 0.05
# Targets whose rates were measured on a device of their own; GPUs without borrow the H200's.
MEASURED_TARGETS = ("h200",)
# Our Pallas kernels that ran in the measured runs (gpu.sh of 2026-12-04 at 8ea964e, the
# "pallas cell" runs): the pallas class's rate is fitted on them alone. Any other kernel of ours
# (the char CNN's, a fused matmul's, lstm_projection_and_output: lstm_forward_output with the
# projection in it) has never run on a device: its expected time borrows that rate.
MEASURED_PALLAS = ("lstm_forward_cell", "lstm_forward_output", "lstm_backward_cell", "lstm_backward_output")
# How each one's code changed since that run (plan says so where they are in a program): their
# numbers since are checked only interpreted on a CPU, and the rate fitted on them is their old code's.
CHANGED_SINCE_MEASURED = {
    "lstm_forward_cell": "no kernel of XLA's between it and the next (ef2aa99, 2026-12-04); it writes the "
    "projection's operand to its save slot only, where lstm_projection_and_output reads it (8eaa40d, 2026-12-06)",
    "lstm_backward_cell": "it computes the cell of step s again instead of reading it (ce4dea1, 2026-12-06) and "
    "multiplies the projection's gradient by W_proj's transpose itself, a product in a kernel measured without one "
    "(12ef166, 2026-12-06)",
    "lstm_backward_output": "no kernel of XLA's between it and the cell's (ef2aa99, 2026-12-04)",
}


def feature_of(kernel: Kernel, target) -> str | None:
    """The kernel's class in FEATURES (None for a collective: counted at its floor)."""
    if kernel.kind == "collective":
        return None
    if kernel.kind == "matmul":
        compute = kernel.flops / target.peak(kernel.dtype)
        return "matmul_compute" if compute >= kernel.bytes / target.hbm_bytes_per_s else "matmul_memory"
    return kernel.kind


def features(kernels: list[Kernel], target) -> dict[str, float]:
    """Per class its kernels' floors (seconds, runs included), and launches and 1 step."""
    x = dict.fromkeys(FEATURES, 0.0)
    for k in kernels:
        feature = feature_of(k, target)
        if feature is not None:
            x[feature] += k.runs * k.floor(target)
            x["launches"] += k.runs
    x["step"] = 1.0
    return x


def predict(x: dict[str, float], rates: dict[str, float]) -> float:
    return sum(x[f] * rates[f] for f in FEATURES)


def kernel_seconds(kernel: Kernel, target, rates: dict[str, float]) -> float | None:
    """One kernel's expected seconds a step at `rates`: its floor at its class's rate and its
    launches (`predict`'s terms for this kernel alone); None for a collective."""
    feature = feature_of(kernel, target)
    return None if feature is None else kernel.runs * (kernel.floor(target) * rates[feature] + rates["launches"])


def fit(runs: list[dict]) -> dict[str, float]:
    """Rates for runs [{"features": {...}, "measured_s": s}, ...]: non-negative least squares of
    the relative errors, each rate held towards its prior."""
    from scipy.optimize import nnls

    scale = np.array([PRIORS[f] for f in FEATURES])  # solve for rate / prior: every unknown near 1
    rows = [[r["features"][f] * s / r["measured_s"] for f, s in zip(FEATURES, scale)] for r in runs]
    A = np.vstack([np.array(rows), math.sqrt(PRIOR_WEIGHT) * np.eye(len(FEATURES))])
    b = np.concatenate([np.ones(len(runs)), math.sqrt(PRIOR_WEIGHT) * np.ones(len(FEATURES))])
    solution, _ = nnls(A, b)
    return {f: float(v * s) for f, v, s in zip(FEATURES, solution, scale)}


def leave_one_out(runs: list[dict]) -> list[dict]:
    """Each run predicted by the rates fitted on all the others: name, measured, floor (the plan's
    bytes-and-FLOPs estimate with its launch cost), expected, error (expected / measured - 1)."""
    table = []
    for i, run in enumerate(runs):
        rates = fit(runs[:i] + runs[i + 1 :])
        expected = predict(run["features"], rates)
        table.append(
            {
                "name": run["name"],
                "measured_s": run["measured_s"],
                "floor_s": run["floor_s"],
                "expected_s": expected,
                "error": expected / run["measured_s"] - 1,
            }
        )
    return table


def table(target_name: str) -> dict | None:
    """The target's measured runs and fitted rates (rates_<target>.json), None where none."""
    if target_name not in MEASURED_TARGETS:
        return None
    return json.loads(resources.files("elmo_jax.plan").joinpath(f"rates_{target_name}.json").read_text())


def rates_table(target) -> dict:
    """The rates' table of a GPU target: its own where measured, else the H200's."""
    data = table(target.name) or table("h200")
    assert data is not None, "the H200's rates ship with the package"
    return data


def pallas_name(kernel: Kernel) -> str:
    """The name a Pallas kernel of ours was given (its pallas_call's, in the JAX op)."""
    return kernel.source.removesuffix("/pallas_call").rsplit("/", 1)[-1]


def never_run(kernels: list[Kernel]) -> dict[str, float]:
    """Our Pallas kernels of the program that no measured run had (not in MEASURED_PALLAS), by
    name: the FLOPs of their products a step (0 for one without), whose expected time borrows
    the pallas class's rate fitted on the measured ones."""
    out: dict[str, float] = {}
    for k in kernels:
        if k.kind == "pallas" and (name := pallas_name(k)) not in MEASURED_PALLAS:
            out[name] = out.get(name, 0.0) + k.runs * k.flops
    return out


def changed_since_measured(kernels: list[Kernel]) -> list[str]:
    """Our Pallas kernels of the program that the measured runs had, in code changed since
    (CHANGED_SINCE_MEASURED), by name."""
    return sorted({name for k in kernels if k.kind == "pallas" and (name := pallas_name(k)) in CHANGED_SINCE_MEASURED})


def expected(kernels: list[Kernel], target, collectives_s: float) -> dict | None:
    """The expected step on `target` and where it comes from, or None (a TPU: no rates measured
    on one, and its compiler's kernels are not a GPU's). A GPU other than the H200 borrows the
    H200's rates for its own floors."""
    if target.platform != "cuda":
        return None
    data = rates_table(target)
    rates = data["rates"]
    x = features(kernels, target)
    by_kernel = sorted(
        ((k.runs * k.floor(target) * (rates[f] - 1.0), k) for k in kernels if (f := feature_of(k, target)) is not None),
        key=lambda pair: -pair[0],
    )
    worst = max(abs(r["error"]) for r in data["leave_one_out"])
    return {
        "step_s": predict(x, rates) + collectives_s,
        "rates_from": data["target"],
        "borrowed": data["target"] != target.name,
        "fitted": data["fitted"],
        "runs": len(data["runs"]),
        "leave_one_out_worst": worst,
        "by_class_s": {f: x[f] * rates[f] for f in FEATURES},
        "furthest_above_floor": [
            {"name": k.name, "part": k.part, "kind": k.kind, "runs": k.runs, "above_floor_s": extra, "source": k.source}
            for extra, k in by_kernel[:5]
        ],
    }
