"""Bytes one train step communicates between devices, read from the compiled HLO.

Compiles (without running or allocating) the real train step of a published config on N fake
CPU devices for several vocabulary sizes, with the softmax table replicated and sharded by rows,
and prints the bytes each kind of collective produces per step, next to what one dense
gradient of the table would be. The last line is one JSON object with every measurement.

    python -m benchmarks.speed.communication [--config=original] [--devices=8] [--per_device_batch=128]
"""

from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="original", choices=["small", "medium", "original"])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--per_device_batch", type=int, default=128)
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--negatives", type=int, default=8192)
    parser.add_argument("--distinct_words", type=int, default=8192, help="rows of the batch's table of distinct words")
    parser.add_argument("--vocab", type=int, nargs="+", default=[100_000, 400_000, 793_471])
    args = parser.parse_args()
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax

    from elmo_jax.config import published
    from elmo_jax.plan.hlo import communication_bytes
    from elmo_jax.settings import TrainSettings
    from elmo_jax.text.batcher import round_up
    from elmo_jax.train.parallel import DataParallel
    from elmo_jax.train.step import init_train_state, make_train_step

    config, parallel = published(args.config), DataParallel(args.devices)
    B = args.per_device_batch * args.devices
    P = config.lstm.projection_dim
    results = []
    for shard_softmax in (False, True):
        for V in args.vocab:
            hp = TrainSettings(
                per_device_batch_size=args.per_device_batch,
                unroll_steps=args.unroll,
                n_tokens_vocab=V,
                n_negative_samples_batch=args.negatives,
            )
            rows = round_up(V, args.devices) if shard_softmax else V
            abstract = jax.eval_shape(lambda hp=hp, rows=rows: init_train_state(jax.random.key(0), config, hp, B, rows))
            shardings = parallel.state_shardings(abstract, shard_softmax)
            batch = parallel.abstract_batch(
                B, args.unroll, round_up(args.distinct_words, args.devices), config.char_cnn.max_characters_per_token
            )
            hlo = (
                make_train_step(config, hp, parallel=parallel, state_shardings=shardings)
                .lower(abstract, batch)
                .compile()
                .as_text()
            )
            by_kind = communication_bytes(hlo)
            result = {
                "shard_softmax": shard_softmax,
                "vocab": V,
                "bytes": sum(by_kind.values()),
                **by_kind,
                "dense_table_gradient_bytes": V * P * 4,
            }
            results.append(result)
            kinds = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(by_kind.items()))
            print(
                f"{args.config}, {args.devices} devices, softmax {'sharded' if shard_softmax else 'replicated'}, "
                f"V = {V:,}: {sum(by_kind.values()) / 2**20:.1f} MiB per step ({kinds}); "
                f"a dense table gradient would be {V * P * 4 / 2**20:.0f} MiB",
                flush=True,
            )
    print(
        json.dumps(
            {
                "config": args.config,
                "devices": args.devices,
                "per_device_batch": args.per_device_batch,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
