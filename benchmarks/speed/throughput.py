"""Train-step or embedding throughput of a named config on one device.

    python -m benchmarks.speed.throughput --config=original --per_device_batch=128 [--dtype=bf16|f32]
        [--mode=train|embed] [--lstm_schedule=auto|wavefront|layers] [--lstm_cell=auto|xla|pallas|fused]
        [--char_conv=auto|xla|pallas] [--softmax_kernel=auto|xla|pallas] [--profile=STEPS]
        [--trace_dir=DIR]

`--mode=train` builds the real train step (sampled softmax, Adagrad, carried state) for a published
size or `cpu_peer`, feeds it batches from the real batcher over a synthetic Zipfian corpus with the
config's vocabulary size, warms up, then times steps. Prints tokens/s, step time (median and
spread) and the step time of the same steps dispatched back to back with their batches already on
the device (one wait at the end, as the train loop runs), compile time, analytic FLOPs per token
(every position through the whole network, docs/MODEL.md section 5), achieved TFLOP/s, MFU against
a matmul peak measured on the same device in the same run, and peak device memory. A token is one
corpus position, processed by both directions. `--profile=N` then traces N more steps with
`jax.profiler` and prints where their time goes (benchmarks/speed/step_profile.py): the top ops,
the ops run per step and the shares of the LSTM loops, token encoder, softmax, sampler, dropout and
optimizer; `--trace_dir=DIR` keeps that trace (TensorBoard's profile plugin or Perfetto read it)
and the compiled program's text (DIR/program.hlo) to read it against. On a chip that `elmo-jax
plan` knows (an H200, H100, A100, TPU v5e/v5p/v6e), the step's own compiled program is read as
`plan` reads it, and its estimated step time is reported beside the measured one
(`--plan_target=NAME` forces a target: on a CPU, only to exercise the code).

`--mode=embed` runs the embedding path of `launch.py embed` (`Embedder`: each distinct word
encoded once, batches of --per_device_batch sentences) over --sentences Zipfian sentences
(benchmarks/common.py, a real text's repeat rate), times whole passes after a first one that
compiles, and reports tokens/s, the distinct-word count, and the token encoder's time on the
distinct words against its time on every position (what encoding each distinct word once saves).
The last line is JSON in both modes.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import DTYPES, EXPERIMENTS, size, synthetic_corpus, zipf_sentences
from benchmarks.speed import step_profile
from elmo_jax import settings
from elmo_jax.config import ModelConfig
from elmo_jax.host_memory import keep_freed_memory
from elmo_jax.model.bilm import init_params
from elmo_jax.model.lstm import cell, schedule
from elmo_jax.model.softmax import kernel as softmax_kernel
from elmo_jax.model.token_encoder import conv
from elmo_jax.plan.targets import target
from elmo_jax.settings import LSTM_SCHEDULES, TrainSettings
from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.text.chars import BOS_TOKEN, EOS_TOKEN, PAD_CHAR, ByteChars, CharTable
from elmo_jax.train.step import init_train_state, make_train_step


def flops_per_token(config: ModelConfig, negatives: int) -> float:
    """Nominal FLOPs per corpus position of a training step: token encoder once, both LSTM
    stacks and the sampled softmax of both directions, 3x the forward pass."""
    cnn, lstm = config.char_cnn, config.lstm
    C, D, F, P, H = cnn.max_characters_per_token, cnn.embedding_dim, cnn.n_filters, lstm.projection_dim, lstm.dim
    encoder = sum(2 * (C - w + 1) * w * D * n for w, n in cnn.filters) + cnn.n_highway * 2 * 2 * F * F + 2 * F * P
    lstms = 2 * lstm.n_layers * 2 * (2 * P * 4 * H + H * P)
    softmax = 2 * 2 * P * (negatives + 1)
    return 3 * (encoder + lstms + softmax)


def matmul_peak(dtype, reps: int = 10) -> float:
    """Achieved FLOP/s of an n x n matmul on the default device (n = 8192; 2048 on a CPU, where
    8192 takes two minutes and 2048 already runs at the same rate)."""
    n = 2048 if jax.devices()[0].platform == "cpu" else 8192
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(reps):
        out = f(a)
    out.block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - start)


def embed_throughput(args, config: ModelConfig, B: int, device) -> None:
    # Imported here: the embedding path needs h5py, which a bare accelerator machine may lack.
    from elmo_jax.compile_time import CompileClock
    from elmo_jax.embed import Embedder, encode_words
    from elmo_jax.model_io import Model

    sentences = zipf_sentences(args.sentences)
    tokens = sum(len(s) for s in sentences)
    model = Model(config, init_params(jax.random.key(0), config, None))
    embedder = Embedder(model, batch_size=B, max_tokens=B * 128, devices=1)
    clock, start = CompileClock(), time.perf_counter()
    embedder(sentences)
    first_s, compiled = time.perf_counter() - start, clock.since()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        embedder(sentences)
        times.append(time.perf_counter() - start)
    pass_s = statistics.median(times)

    table = CharTable(ByteChars(config.char_cnn.max_characters_per_token))
    positions = np.concatenate([table.ids([BOS_TOKEN, *s, EOS_TOKEN]) for s in sentences])
    encoder_s = {}
    all_columns = functools.partial(encode_words, cut_columns=False)  # the path before: no column cut
    for name, rows, encode in (
        ("distinct_words", np.unique(positions), encode_words),
        ("every_position", positions, encode_words),
        ("every_position_all_columns", positions, all_columns),
    ):
        encode(model, table.lookup(rows))  # compiles
        start = time.perf_counter()
        encode(model, table.lookup(rows))
        encoder_s[name] = time.perf_counter() - start
    distinct = len(np.unique(positions))
    result = {
        "config": args.config,
        "mode": "embed",
        "dtype": args.dtype,
        "device": device.device_kind,
        "per_device_batch": B,
        "sentences": len(sentences),
        "tokens": tokens,
        "positions": len(positions),
        "distinct_words": distinct,
        "tokens_per_sec": tokens / pass_s,
        "pass_s": pass_s,
        "pass_spread_s": [min(times), max(times)],
        "first_pass_s": first_s,
        "compile_s": compiled.seconds,
        "programs": compiled.programs,
        "encoder_distinct_words_s": encoder_s["distinct_words"],
        "encoder_every_position_s": encoder_s["every_position"],
        "encoder_every_position_all_columns_s": encoder_s["every_position_all_columns"],
        "encoder_saving": encoder_s["every_position_all_columns"] / encoder_s["distinct_words"],
    }
    print(
        f"{args.config} embed {args.dtype} B={B} on {device.device_kind}: {tokens / pass_s:,.0f} tokens/s "
        f"({len(sentences)} sentences, {tokens:,} tokens, {distinct:,} distinct words; pass {pass_s:.2f} s, "
        f"min {min(times):.2f}, max {max(times):.2f}; first pass {first_s:.1f} s with {compiled}); "
        f"token encoder {encoder_s['distinct_words']:.2f} s on the distinct words against "
        f"{encoder_s['every_position']:.2f} s on every position and {encoder_s['every_position_all_columns']:.2f} s "
        f"on every position's 50 columns ({result['encoder_saving']:.1f}x)"
    )
    print(json.dumps(result))


def plan_estimate(name: str, device, compiled, B: int, T: int, config: ModelConfig, step_s: float) -> dict | None:
    """`elmo-jax plan`'s estimate of the compiled step on target `name` ("auto": this device's
    chip, None where plan does not know it), beside the measured step time `step_s`."""
    from elmo_jax.plan.program import CompiledStep, memory_of
    from elmo_jax.plan.report import estimate
    from elmo_jax.plan.targets import for_device_kind

    chip = for_device_kind(device.device_kind) if name == "auto" else target(name)
    if chip is None:
        return None
    step = CompiledStep(
        compiled.as_text(), memory_of(compiled), B, T, 1, schedule(config), 0.0, cell(config, B), conv(config)
    )
    r = estimate(step, chip)
    keys = ("step_s", "compute_floor_s", "memory_floor_s", "launches_s", "hbm_bytes", "flops")
    e = r["expected"] or {}
    return {
        "target": chip.name,
        **{key: r[key] for key in keys},
        "tokens_per_sec": r["tokens_per_s"],
        "kernels": r["kernels"]["per_step"],
        "parts": r["parts"],
        "measured_over_estimate": step_s / r["step_s"],
        "expected_step_s": e.get("step_s"),
        "expected_by_class_s": e.get("by_class_s"),
        "measured_over_expected": step_s / e["step_s"] if e else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="cpu_peer", choices=sorted(EXPERIMENTS))
    parser.add_argument("--per_device_batch", type=int, default=None)
    parser.add_argument("--dtype", default="f32", choices=sorted(DTYPES), help="compute dtype of the matmuls")
    parser.add_argument("--mode", default="train", choices=["train", "embed"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="train: also trace this many steps with jax.profiler and print where their time goes",
    )
    parser.add_argument("--trace_dir", default=None, help="train: keep the --profile trace and program text here")
    parser.add_argument("--unroll_steps", type=int, default=20)
    parser.add_argument("--scan_unroll", type=int, default=1, help="jax.lax.scan unroll of the LSTM time loop")
    parser.add_argument(
        "--lstm_schedule", default="auto", choices=LSTM_SCHEDULES, help="the LSTM layers in one loop or a loop each"
    )
    parser.add_argument(
        "--lstm_cell", default="auto", choices=settings.LSTM_CELLS, help="train: the LSTM cell, XLA's or our kernels"
    )
    parser.add_argument(
        "--char_conv", default="auto", choices=settings.CHAR_CONVS, help="the char CNN's max, XLA's or our kernels"
    )
    parser.add_argument(
        "--softmax_kernel",
        default="auto",
        choices=settings.SOFTMAX_KERNELS,
        help="train: the sampled softmax, XLA's or our kernels",
    )
    parser.add_argument(
        "--backward_order",
        default="independent",
        choices=settings.BACKWARD_ORDERS,
        help="train: the backward LM's sentences",
    )
    parser.add_argument(
        "--plan_target", default="auto", help="train: the plan target to estimate for (auto: this device's, if known)"
    )
    parser.add_argument("--sentences", type=int, default=2000, help="embed: Zipfian sentences per pass")
    parser.add_argument(
        "--release_freed_memory",
        action="store_true",
        help="leave JAX's CPU dispatch and glibc malloc as they are (launch.py keeps freed memory)",
    )
    args = parser.parse_args()
    if not args.release_freed_memory:
        keep_freed_memory()

    options, vocab_size, negatives, default_batch = size(args.config)
    B, T = args.per_device_batch or default_batch, args.unroll_steps
    config = dataclasses.replace(
        ModelConfig.from_options(options),
        compute_dtype=DTYPES[args.dtype],
        lstm_schedule=args.lstm_schedule,
        lstm_cell=args.lstm_cell,
        char_conv=args.char_conv,
        softmax_kernel=args.softmax_kernel,
        scan_unroll=args.scan_unroll,
    )
    device = jax.devices()[0]
    if args.mode == "embed":
        return embed_throughput(args, config, B, device)
    corpus, vocab = synthetic_corpus(vocab_size, max(4 * B, 2000))
    batches = StreamBatcher(
        corpus, vocab, B, T, seed=0, char_window=config.char_cnn.widest_filter, backward_order=args.backward_order
    )

    hp = TrainSettings(
        per_device_batch_size=B, unroll_steps=T, n_tokens_vocab=vocab_size, n_negative_samples_batch=negatives
    )
    state = init_train_state(jax.random.key(0), config, hp, B)
    tokens_per_step = B * T
    host = [next(batches) for _ in range(args.warmup + args.steps + args.profile)]
    distinct = statistics.mean(len(np.unique(b.ids)) for b in host)
    # One distinct-word bucket and one width for all (more padding characters change nothing):
    # one compile.
    U, W = max(b.chars.shape[0] for b in host), max(b.chars.shape[1] for b in host)
    host = [
        b._replace(
            chars=np.pad(
                np.pad(b.chars, ((0, 0), (0, W - b.chars.shape[1])), constant_values=PAD_CHAR + 1),
                ((0, U - b.chars.shape[0]), (0, 0)),
            )
        )
        for b in host
    ]
    start = time.perf_counter()
    step_fn = make_train_step(config, hp).lower(state, host[0]).compile()
    compile_s = time.perf_counter() - start

    def run(batch):
        nonlocal state
        state, metrics = step_fn(state, batch)
        return metrics["loss"]

    for batch in host[: args.warmup]:
        jax.block_until_ready(run(batch))
    times = []
    for batch in host[args.warmup : args.warmup + args.steps]:
        start = time.perf_counter()
        jax.block_until_ready(run(batch))
        times.append(time.perf_counter() - start)

    step_s = statistics.median(times)
    on_device = jax.device_put(host[args.warmup : args.warmup + args.steps])
    jax.block_until_ready(on_device)
    start = time.perf_counter()
    for batch in on_device:
        loss = run(batch)
    jax.block_until_ready(loss)
    back_to_back_s = (time.perf_counter() - start) / len(on_device)
    tokens_per_sec = tokens_per_step / step_s
    flops = flops_per_token(config, negatives)
    achieved = flops * tokens_per_sec
    stats = device.memory_stats() or {}  # before the peak matmul, whose autotuning allocates too
    profile = None
    if args.profile:
        trace = step_profile.profile_steps(run, [(b,) for b in host[args.warmup + args.steps :]], args.trace_dir)
        program = step_fn.as_text()
        if args.trace_dir:
            Path(trace, "program.hlo").write_text(program)
    estimate = plan_estimate(args.plan_target, device, step_fn, B, T, config, step_s)
    if args.profile:
        chip = target(estimate["target"]) if estimate else None
        profile = step_profile.breakdown(trace, program, args.profile, target=chip)
    peak = matmul_peak(DTYPES[args.dtype])
    result = {
        "config": args.config,
        "mode": args.mode,
        "dtype": args.dtype,
        "scan_unroll": args.scan_unroll,
        "lstm_schedule": schedule(config),
        "lstm_cell": cell(config, B),
        "char_conv": conv(config),
        "softmax_kernel": softmax_kernel(config),
        "keep_freed_memory": not args.release_freed_memory,
        "device": device.device_kind,
        "per_device_batch": B,
        "backward_order": args.backward_order,
        "distinct_words_per_batch": distinct,
        "word_table_rows": U,
        "tokens_per_sec": tokens_per_sec,
        "step_time_s": step_s,
        "step_time_spread_s": [min(times), max(times)],
        "back_to_back_step_s": back_to_back_s,
        "compile_s": compile_s,
        "gflop_per_token": flops / 1e9,
        "achieved_tflops": achieved / 1e12,
        "matmul_peak_tflops": peak / 1e12,
        "mfu": achieved / peak,
        "peak_memory_gb": stats.get("peak_bytes_in_use", 0) / 1e9 or None,
        "profile": profile,
        "estimate": estimate,
    }
    print(
        f"{args.config} {args.mode} {args.dtype} B={B} {schedule(config)} {args.backward_order} order "
        f"({distinct:.0f} distinct words a batch) on {device.device_kind}: "
        f"{tokens_per_sec:,.0f} tokens/s, "
        f"step {1000 * step_s:.1f} ms (min {1000 * min(times):.1f}, max {1000 * max(times):.1f}; "
        f"back to back {1000 * back_to_back_s:.1f}), "
        f"compile {compile_s:.1f} s, {flops / 1e9:.3f} GFLOP/token, {achieved / 1e12:.2f} TFLOP/s, "
        f"MFU {100 * achieved / peak:.1f}% of a measured {peak / 1e12:.1f} TFLOP/s matmul"
    )
    if estimate:
        e = estimate
        print(
            f"plan estimate of this program on {e['target']}: step {1000 * e['step_s']:.1f} ms "
            f"(floors: compute {1000 * e['compute_floor_s']:.1f}, memory {1000 * e['memory_floor_s']:.1f}, "
            f"launches {1000 * e['launches_s']:.1f} ms; {e['kernels']:,} kernels, {e['hbm_bytes'] / 1e9:.1f} GB), "
            f"{e['tokens_per_sec']:,.0f} tokens/s; measured / estimated {e['measured_over_estimate']:.2f}"
        )
        if e["expected_step_s"]:
            print(
                f"plan's expected step {1000 * e['expected_step_s']:.1f} ms; measured / expected "
                f"{e['measured_over_expected']:.2f}"
            )
    if profile:
        print(step_profile.describe(profile))
        if estimate and estimate["expected_by_class_s"]:
            print(step_profile.by_class(profile, estimate["expected_by_class_s"]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
