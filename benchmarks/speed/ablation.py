"""Where a train step's time goes: the parts of the step timed alone, forward + backward, at a
named config's sizes on the default device.

    python -m benchmarks.speed.ablation [--config=cpu_peer] [--per_device_batch=N] [--dtype=f32|bf16]

Parts: the token encoder over a batch's distinct words, both LSTM stacks over the batch, the
sampled softmax of both directions, and the whole train step (which adds the row gather, the
clip and the Adagrad updates). Prints ms per part and its share of the step; last line JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import DTYPES, EXPERIMENTS, size, synthetic_corpus, timed
from elmo_jax.config import ModelConfig
from elmo_jax.host_memory import keep_freed_memory
from elmo_jax.model.lstm import LSTMState, lstm_stacks
from elmo_jax.model.softmax import sampled_softmax_ce
from elmo_jax.model.token_encoder import encode_tokens
from elmo_jax.settings import TrainSettings
from elmo_jax.text.batcher import StreamBatcher
from elmo_jax.train.step import init_train_state, make_train_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="cpu_peer", choices=sorted(EXPERIMENTS))
    parser.add_argument("--per_device_batch", type=int, default=None)
    parser.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    args = parser.parse_args()
    keep_freed_memory()
    options, V, S, default_batch = size(args.config)
    B, T = args.per_device_batch or default_batch, 20
    config = dataclasses.replace(ModelConfig.from_options(options), compute_dtype=DTYPES[args.dtype])
    hp = TrainSettings(per_device_batch_size=B, unroll_steps=T, n_tokens_vocab=V, n_negative_samples_batch=S)
    corpus, vocab = synthetic_corpus(V, max(4 * B, 2000))
    batch = next(StreamBatcher(corpus, vocab, B, T, seed=0, char_window=config.char_cnn.widest_filter))
    state = init_train_state(jax.random.key(0), config, hp, B)
    params = state.params
    P = config.lstm.projection_dim

    def encoder(p, chars):
        return jax.grad(lambda p: jnp.sum(encode_tokens(p, chars, config)))(p)

    def lstms(p, x):
        return jax.grad(
            lambda p: jnp.sum(lstm_stacks(p, x, batch.mask, LSTMState.zeros(config, B), config, top_only=True)[0][-1])
        )(p)

    candidates = jnp.arange(S)
    log_q = jnp.zeros(S)

    def softmax(W, b, h):
        def loss(W, h):
            return sum(
                jnp.sum(
                    sampled_softmax_ce(
                        h[d],
                        batch.targets[d].reshape(-1),
                        W,
                        b,
                        candidates,
                        log_q,
                        jnp.zeros(B * T),
                        config.compute_dtype,
                    )
                )
                for d in range(2)
            )

        return jax.grad(loss, argnums=(0, 1))(W, h)

    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, B, T, P)), jnp.float32)
    h = x.reshape(2, B * T, P)
    step = make_train_step(config, hp)
    parts = {
        "token encoder": timed(jax.jit(encoder), params["token_encoder"], batch.chars),
        "LSTMs": timed(jax.jit(lstms), params["lstm"], x),
        "sampled softmax": timed(jax.jit(softmax), params["softmax"]["W"], params["softmax"]["b"], h),
    }

    def run_step(batch):
        nonlocal state
        state, metrics = step(state, batch)
        return metrics["loss"]

    whole = timed(run_step, batch)
    print(
        f"{args.config} {args.dtype} B={B} on {jax.devices()[0].device_kind}: step {1000 * whole:.1f} ms "
        f"({len(batch.chars)} distinct-word rows)"
    )
    for name, seconds in parts.items():
        print(f"  {name:16s} {1000 * seconds:7.1f} ms  {100 * seconds / whole:5.1f}% of the step")
    rest = whole - sum(parts.values())
    print(f"  {'the rest':16s} {1000 * rest:7.1f} ms  {100 * rest / whole:5.1f}% (gathers, clip, Adagrad, overheads)")
    print(
        json.dumps(
            {
                "config": args.config,
                "dtype": args.dtype,
                "per_device_batch": B,
                "step_ms": 1000 * whole,
                **{f"{k}_ms": 1000 * v for k, v in parts.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
