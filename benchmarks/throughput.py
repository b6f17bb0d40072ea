"""Train-step (or embed-forward) throughput of a named config on one device.

    python benchmarks/throughput.py --config=original --per-device-batch=128 [--dtype=bf16|f32] [--mode=train|embed]

Builds the real train step (sampled softmax, Adagrad, carried state) or the embedding forward
(`bilm_layers`) for a published size or `cpu_peer`, feeds it batches from the real batcher over
a synthetic Zipfian corpus with the config's vocabulary size, warms up, then times steps. Prints
tokens/s, step time (median and spread), compile time, analytic FLOPs per token (every position
through the whole network, docs/MODEL.md section 5), achieved TFLOP/s, MFU against a matmul peak
measured on the same device in the same run, and peak device memory; the last line is JSON.
A token is one corpus position, processed by both directions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import cpu_peer  # noqa: E402  (experiments/cpu_peer.py)
from elmo_jax.config import PUBLISHED_OPTIONS, ModelConfig, TrainHParams  # noqa: E402
from elmo_jax.host_memory import keep_freed_memory  # noqa: E402
from elmo_jax.model.bilm import bilm_layers, init_params  # noqa: E402
from elmo_jax.model.lstm import LSTMState  # noqa: E402
from elmo_jax.text.batcher import StreamBatcher  # noqa: E402
from elmo_jax.text.chars import PAD_CHAR  # noqa: E402
from elmo_jax.text.vocab import SPECIAL_TOKENS, Vocabulary  # noqa: E402
from elmo_jax.train.step import init_train_state, make_train_step  # noqa: E402

CPU_PEER = cpu_peer.get_config()  # the size compared with the original bilm-tf code
# name: (options, vocabulary size, negatives, default per-device batch)
CONFIGS = {
    "cpu_peer": (CPU_PEER.model.to_dict(), 5_000, CPU_PEER.train.n_negative_samples_batch, CPU_PEER.train.per_device_batch_size),
    **{name: (options, 793_471, 8192, 128) for name, options in PUBLISHED_OPTIONS.items()},
}


def flops_per_token(config: ModelConfig, negatives: int, mode: str) -> float:
    """Nominal FLOPs per corpus position: token encoder once, both LSTM stacks, and (train)
    the sampled softmax of both directions; a training step counts 3x the forward pass."""
    cnn, lstm = config.char_cnn, config.lstm
    C, D, F, P, H = cnn.max_characters_per_token, cnn.embedding_dim, cnn.n_filters, lstm.projection_dim, lstm.dim
    encoder = sum(2 * (C - w + 1) * w * D * n for w, n in cnn.filters) + cnn.n_highway * 2 * 2 * F * F + 2 * F * P
    lstms = 2 * lstm.n_layers * 2 * (2 * P * 4 * H + H * P)
    if mode == "embed":
        return encoder + lstms
    softmax = 2 * 2 * P * (negatives + 1)
    return 3 * (encoder + lstms + softmax)


def synthetic_corpus(vocab_size: int, sentences: int, seed: int = 0):
    """Sentences of Zipf(1)-distributed words over `vocab_size` invented, frequency-ordered
    words of 2 to 12 letters; returns (corpus, vocabulary)."""
    rng = np.random.default_rng(seed)
    n_words = vocab_size - len(SPECIAL_TOKENS)
    letters = np.array(list("etaoinshrdlucmfwypvbgkqjxz"))
    lengths = 2 + np.minimum(np.log2(np.arange(n_words) + 2).astype(int), 10)
    words = ["".join(letters[(i // 26**k) % 26] for k in range(n)) + str(i) for i, n in enumerate(lengths)]
    p = 1.0 / np.arange(1, n_words + 1)
    ids = rng.choice(n_words, size=(sentences, 25), p=p / p.sum())

    class Corpus:
        name = "synthetic"

        def __len__(self):
            return sentences

        def __getitem__(self, i):
            return [words[j] for j in ids[i]]

    return Corpus(), Vocabulary(list(SPECIAL_TOKENS) + words)


DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def matmul_peak(dtype, n: int = 8192, reps: int = 10) -> float:
    """Achieved FLOP/s of an n x n matmul on the default device."""
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(reps):
        out = f(a)
    out.block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="cpu_peer", choices=sorted(CONFIGS))
    parser.add_argument("--per-device-batch", type=int, default=None)
    parser.add_argument("--dtype", default="f32", choices=sorted(DTYPES), help="compute dtype of the matmuls")
    parser.add_argument("--mode", default="train", choices=["train", "embed"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--unroll-steps", type=int, default=20)
    parser.add_argument("--scan-unroll", type=int, default=1, help="jax.lax.scan unroll of the LSTM time loop")
    parser.add_argument("--release-freed-memory", action="store_true", help="leave JAX's CPU dispatch and glibc malloc as they are (launch.py keeps freed memory)")
    args = parser.parse_args()
    if not args.release_freed_memory:
        keep_freed_memory()

    options, vocab_size, negatives, default_batch = CONFIGS[args.config]
    B, T = args.per_device_batch or default_batch, args.unroll_steps
    config = dataclasses.replace(ModelConfig.from_options(options), compute_dtype=DTYPES[args.dtype])
    device = jax.devices()[0]
    corpus, vocab = synthetic_corpus(vocab_size, max(4 * B, 2000))
    batches = StreamBatcher(corpus, vocab, B, T, seed=0, char_window=config.char_cnn.widest_filter)

    if args.mode == "train":
        hp = TrainHParams(batch_size=B, unroll_steps=T, n_tokens_vocab=vocab_size, n_negative_samples_batch=negatives)
        state = init_train_state(jax.random.key(0), config, hp, B)
        step_fn = make_train_step(config, hp, unroll=args.scan_unroll)

        def run(batch):
            nonlocal state
            state, metrics = step_fn(state, batch)
            return metrics["loss"]

        tokens_per_step = B * T
    else:
        params = init_params(jax.random.key(0), config, None)
        fn = jax.jit(lambda p, c, s: bilm_layers(p, c, s, config, unroll=args.scan_unroll)[0])
        zero = LSTMState.zeros(config, B)

        def run(batch):
            return fn(params, batch["chars"][batch["ids"][0]], zero)  # (B, T, C): the forward stream

        tokens_per_step = B * T

    host = [next(batches) for _ in range(args.warmup + args.steps)]
    # One distinct-word bucket and one width for all (more padding characters change nothing):
    # one compile.
    U, W = max(b["chars"].shape[0] for b in host), max(b["chars"].shape[1] for b in host)
    for b in host:
        u, w = b["chars"].shape
        b["chars"] = np.pad(np.pad(b["chars"], ((0, 0), (0, W - w)), constant_values=PAD_CHAR + 1), ((0, U - u), (0, 0)))
    start = time.perf_counter()
    jax.block_until_ready(run(host[0]))
    compile_s = time.perf_counter() - start
    for batch in host[1 : args.warmup]:
        jax.block_until_ready(run(batch))
    times = []
    for batch in host[args.warmup :]:
        start = time.perf_counter()
        jax.block_until_ready(run(batch))
        times.append(time.perf_counter() - start)

    step_s = statistics.median(times)
    tokens_per_sec = tokens_per_step / step_s
    flops = flops_per_token(config, negatives, args.mode)
    achieved = flops * tokens_per_sec
    stats = device.memory_stats() or {}  # before the peak matmul, whose autotuning allocates too
    peak = matmul_peak(DTYPES[args.dtype])
    result = {
        "config": args.config,
        "mode": args.mode,
        "dtype": args.dtype,
        "scan_unroll": args.scan_unroll,
        "keep_freed_memory": not args.release_freed_memory,
        "device": device.device_kind,
        "per_device_batch": B,
        "tokens_per_sec": tokens_per_sec,
        "step_time_s": step_s,
        "step_time_spread_s": [min(times), max(times)],
        "compile_s": compile_s,
        "gflop_per_token": flops / 1e9,
        "achieved_tflops": achieved / 1e12,
        "matmul_peak_tflops": peak / 1e12,
        "mfu": achieved / peak,
        "peak_memory_gb": stats.get("peak_bytes_in_use", 0) / 1e9 or None,
    }
    print(
        f"{args.config} {args.mode} {args.dtype} B={B} on {device.device_kind}: {tokens_per_sec:,.0f} tokens/s, "
        f"step {1000 * step_s:.1f} ms (min {1000 * min(times):.1f}, max {1000 * max(times):.1f}), "
        f"compile {compile_s:.1f} s, {flops / 1e9:.3f} GFLOP/token, {achieved / 1e12:.2f} TFLOP/s, "
        f"MFU {100 * achieved / peak:.1f}% of a measured {peak / 1e12:.1f} TFLOP/s matmul"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
