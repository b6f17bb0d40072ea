"""The dependent loop iterations of one train step and the ops inside each loop, read from the
compiled HLO on any backend.

Compiles (without running or allocating) the real train step of a published config or
`cpu_peer` for one device, finds every while loop of the compiled program with its trip count
and the ops in its body (elmo_jax/plan/hlo.py), and prints them. The loops with matmuls are the LSTM
time loops: they run one after another and each iteration waits for the last, so the sum of
their trip counts is the step's critical path in loop steps. The ops per iteration (kernels on
an accelerator: fusions, matmuls, copies; free ops such as tuples and bitcasts not counted) say
what each of those steps costs in launches. The other loops (the sampler's binary searches and,
on the CPU only, the random number generator's rounds) are counted apart. Compare before and
after a change on this CPU; an accelerator's counts differ by its backend's fusion choices.
The last line is one JSON object with `dependent_loop_iterations` (per train step),
`ops_per_iteration` (over those loops, weighted by their trip counts) and every loop.

    python -m benchmarks.speed.critical_path [--config=original] [--per_device_batch=128] [--dtype=bf16]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from benchmarks.common import DTYPES, size
from elmo_jax.config import ModelConfig
from elmo_jax.settings import LSTM_SCHEDULES, TrainSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="original")
    parser.add_argument("--per_device_batch", type=int, default=128)
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--unroll_steps", type=int, default=20)
    parser.add_argument("--lstm_schedule", default="auto", choices=LSTM_SCHEDULES)
    args = parser.parse_args()

    import jax

    from elmo_jax.model.lstm import schedule
    from elmo_jax.plan.hlo import recurrence
    from elmo_jax.text.batcher import round_up
    from elmo_jax.train.parallel import DataParallel
    from elmo_jax.train.step import init_train_state, make_train_step

    options, vocab, negatives, _ = size(args.config)
    config = dataclasses.replace(
        ModelConfig.from_options(options), compute_dtype=DTYPES[args.dtype], lstm_schedule=args.lstm_schedule
    )
    B, T = args.per_device_batch, args.unroll_steps
    hp = TrainSettings(
        per_device_batch_size=B, unroll_steps=T, n_tokens_vocab=vocab, n_negative_samples_batch=negatives
    )
    parallel = DataParallel(1)
    abstract = jax.eval_shape(lambda: init_train_state(jax.random.key(0), config, hp, B, vocab))
    batch = parallel.abstract_batch(B, T, round_up(min(B * T, vocab), 8), config.char_cnn.max_characters_per_token)
    step = make_train_step(config, hp, parallel=parallel, state_shardings=parallel.state_shardings(abstract, False))
    result = recurrence(step.lower(abstract, batch).compile().as_text())
    for loop in sorted(result["loops"], key=lambda loop: not loop["matmul"]):
        del loop["computations"]
        ops = ", ".join(f"{op} {n}" for op, n in sorted(loop["ops"].items(), key=lambda kv: -kv[1]))
        outer = f" inside loops of {loop['outer_trips']} iterations" if loop["outer_trips"] > 1 else ""
        kind = "matmul loop" if loop["matmul"] else "loop"
        print(
            f"{kind} from {loop['source'] or loop['body']}: {loop['trip_count']} iterations{outer}, "
            f"{sum(loop['ops'].values())} ops per iteration ({ops})"
        )
    print(
        f"{args.config}, {B} rows, T = {T}, {args.dtype}, {schedule(config)} schedule on {jax.devices()[0].platform}: "
        f"{result['dependent_loop_iterations']} dependent loop iterations with matmuls per train step, "
        f"{result['ops_per_iteration']:.1f} ops per iteration; "
        f"{result['other_loop_iterations']} iterations of other loops"
    )
    print(
        json.dumps(
            {
                "config": args.config,
                "per_device_batch": B,
                "unroll_steps": T,
                "dtype": args.dtype,
                "lstm_schedule": schedule(config),
                "backend": jax.devices()[0].platform,
                **result,
            }
        )
    )


if __name__ == "__main__":
    main()
