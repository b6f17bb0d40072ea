"""The benchmark scripts that benchmarks/gpu.sh runs (and the input pipeline's and host path's) run end to end at
toy sizes and print their JSON result line last, so a change to the library cannot leave gpu.sh
broken for the next accelerator session. No timing is asserted. (ablation.py and
communication.py are left out: half a minute each, and no accelerator session depends on them.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.launches  # every test here starts processes

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--config=cpu_peer", "--per_device_batch=2"]  # cpu_peer: a 5,000-word vocabulary

# name: (script and flags, the measurements its JSON line must report as positive numbers)
COMMANDS = {
    "throughput train, profiled": (
        ["speed.throughput", *TINY, "--unroll_steps=4", "--steps=1", "--warmup=1", "--profile=1", "--plan_target=h200"],
        (
            "tokens_per_sec",
            "step_time_s",
            "back_to_back_step_s",
            "compile_s",
            "profile.ops_per_step",
            "profile.op_seconds_per_step",
            # The plan's reading of the (CPU) program, as gpu.sh gets it of the H200's.
            "estimate.step_s",
            "estimate.kernels",
            "estimate.hbm_bytes",
            "estimate.measured_over_estimate",
            # and its expected step at the H200's measured rates (plan/rates.py)
            "estimate.expected_step_s",
            "estimate.measured_over_expected",
        ),
    ),
    "throughput embed": (
        ["speed.throughput", *TINY, "--mode=embed", "--sentences=40", "--steps=1"],
        ("tokens_per_sec", "pass_s", "encoder_distinct_words_s"),
    ),
    "critical path": (["speed.critical_path", *TINY, "--unroll_steps=4"], ("dependent_loop_iterations",)),
    "recurrence": (["speed.recurrence", *TINY, "--steps=1", "--unroll_steps=4"], ("ms_wavefront", "ms_layers")),
    "input pipeline": (
        ["speed.input_pipeline", "--batch=4", "--unroll=5", "--vocab=500", "--batches=3"],
        ("tokens_per_sec", "ms_per_batch"),
    ),
    "host path": (
        ["speed.host_path", "--shards=3", "--tokens=30000", "--vocab=3000", "--batches=3", "--shapes=2x4"],
        ("results.0.tokens_per_sec", "results.0.first_batch_cold_s", "results.0.first_batch_warm_s"),
    ),
}


@pytest.mark.parametrize("name", COMMANDS)
def test_benchmark_runs_and_reports_its_measurements(name):
    (script, *args), measurements = COMMANDS[name]
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in measurements:
        value = result
        for part in key.split("."):
            value = value[int(part)] if part.isdigit() else value[part]
        assert isinstance(value, (int, float)) and value > 0, (key, value)
