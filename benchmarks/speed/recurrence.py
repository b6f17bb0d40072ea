"""The LSTM time loops: the layer wavefront against layer after layer, and the floor of one
loop step.

    python -m benchmarks.speed.recurrence [--config=cpu_peer] [--per_device_batch=N] [--steps=200]
    taskset -c 0 python -m benchmarks.speed.recurrence    # the same on one core (Linux)
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m benchmarks.speed.recurrence

First the real LSTM stacks (`lstm_stacks`, both directions, dropout between layers and the
residual, as in training), forward and backward (the gradient of the top layer), under both
schedules (model/lstm.py): all layers in one wavefront loop of T + L - 1 steps, and a loop of T
steps per layer. Prints milliseconds per forward + backward and the ratio.

Then the floor of a loop step:

Each loop step depends on the last (as in the LSTM), so this is the latency-bound part of a
train step: h (D, B, P) @ W_h (D, P, 4C), then tanh, for D = 2 directions batched into one
matmul, for one direction, and (with 2 or more devices) the two directions on two devices, one
each. Prints microseconds per step and the matmul's FLOP rate over the step time; the last line
is JSON. On this CPU one direction costs half of two and one core is as fast as two (XLA runs
these matmuls on one thread and nothing beside them), while two CPU devices run one direction
each in the time of one (see docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from benchmarks.common import EXPERIMENTS, size, timed
from elmo_jax.config import ModelConfig
from elmo_jax.host_memory import keep_freed_memory
from elmo_jax.model.dropout import dropout_keep_masks
from elmo_jax.model.lstm import LSTMState, init_lstm, lstm_stacks


def loop_step_seconds(directions: int, B: int, P: int, G: int, steps: int, devices: int = 1, reps: int = 10) -> float:
    """Median seconds per step of `steps` dependent steps h <- tanh(h @ W) (D, B, G) averaged
    down to (D, B, P), the directions split over `devices` devices."""
    k_h, k_w = jax.random.split(jax.random.key(0))
    h = 0.1 * jax.random.normal(k_h, (directions, B, P))
    W = 0.05 * jax.random.normal(k_w, (directions, P, G))

    def loop(h, W):
        def step(i, h):  # every gate column's tanh is used (of a slice, XLA computes only that)
            gates = jnp.tanh(jnp.einsum("dbp,dpg->dbg", h, W))
            return gates.reshape(*gates.shape[:-1], G // P, P).mean(axis=-2)

        return jax.lax.fori_loop(0, steps, step, h)

    if devices > 1:
        mesh = Mesh(np.array(jax.devices()[:devices]), ("direction",))
        h, W = (jax.device_put(x, NamedSharding(mesh, PartitionSpec("direction"))) for x in (h, W))
        loop = jax.shard_map(loop, mesh=mesh, in_specs=PartitionSpec("direction"), out_specs=PartitionSpec("direction"))
    return timed(jax.jit(loop), h, W, reps=reps) / steps


def schedules_seconds(config: ModelConfig, B: int, T: int, dropout: float = 0.1) -> dict[str, float]:
    """Median seconds of the gradient of the top layer's output under each LSTM schedule;
    checks that they give the same gradient."""
    k_p, k_x, k_keep = jax.random.split(jax.random.key(0), 3)
    params = init_lstm(k_p, config)
    x = jax.random.normal(k_x, (2, B, T, config.lstm.projection_dim))
    mask = jnp.ones((B, T), bool)
    state = LSTMState.zeros(config, B)
    keep = dropout_keep_masks(k_keep, dropout, config.lstm.n_layers, x.shape)

    def grad(schedule: str):
        scheduled = dataclasses.replace(config, lstm_schedule=schedule)
        return jax.jit(
            jax.grad(
                lambda p: jnp.sum(
                    lstm_stacks(p, x, mask, state, scheduled, keep_masks=keep, dropout=dropout, top_only=True)[0][-1]
                    ** 2
                )
            )
        )

    grads = {schedule: grad(schedule) for schedule in ("wavefront", "layers")}
    pairs = zip(*(jax.tree.leaves(g(params)) for g in grads.values()))
    difference = max(float(jnp.abs(a - b).max() / jnp.abs(a).max()) for a, b in pairs)
    print(f"largest gradient difference between the schedules, relative to the largest gradient: {difference:.1e}")
    return {schedule: timed(g, params) for schedule, g in grads.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="cpu_peer", choices=sorted(EXPERIMENTS))
    parser.add_argument("--per_device_batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--unroll_steps", type=int, default=20, help="T of the LSTM stacks")
    args = parser.parse_args()
    keep_freed_memory()
    options, _, _, default_batch = size(args.config)
    config = ModelConfig.from_options(options)
    lstm = config.lstm
    B, P, G = args.per_device_batch or default_batch, lstm.projection_dim, 4 * lstm.dim
    result = {
        "config": args.config,
        "device": jax.devices()[0].device_kind,
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "per_device_batch": B,
    }
    seconds = schedules_seconds(config, B, args.unroll_steps)
    L, T = config.lstm.n_layers, args.unroll_steps
    print(
        f"{args.config} B={B}, T={T}, L={L}, forward + backward of the LSTM stacks: wavefront ({T + L - 1} steps) "
        f"{1e3 * seconds['wavefront']:.2f} ms, a loop per layer ({L} x {T} steps) {1e3 * seconds['layers']:.2f} ms, "
        f"wavefront {seconds['layers'] / seconds['wavefront']:.2f}x as fast"
    )
    result.update({f"ms_{name}": 1e3 * value for name, value in seconds.items()})
    cases = [(2, 1), (1, 1)] + ([(2, 2)] if jax.device_count() >= 2 else [])
    for directions, devices in cases:
        seconds = loop_step_seconds(directions, B, P, G, args.steps, devices)
        gflops = 2 * directions * B * P * G / seconds / 1e9
        print(
            f"{args.config} B={B}, {directions} direction(s) on {devices} device(s): {1e6 * seconds:.1f} us per step, "
            f"matmul {gflops:.0f} GFLOP/s"
        )
        result[f"us_per_step_{directions}_directions_{devices}_devices"] = 1e6 * seconds
    print(json.dumps(result))


if __name__ == "__main__":
    main()
