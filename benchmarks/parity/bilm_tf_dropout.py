"""Dropout as the original applies it, checked in distribution: bilm-tf's own training graph and
our loss, from the same weights on the same batch, each differentiated over many dropout draws.

    bash $SHARED/tools/bilm_tf/setup_bilmtf.sh       # once: /tmp/bilmvenv, /tmp/bilm-work
    python -m benchmarks.parity.bilm_tf_dropout [--draws=2000] [--dropout=0.1] [--ours_dropout=0.1]

Masks are random on both sides, so no single draw can match; what must match is the law of the
gradient. Both sides start from the initial values of fixtures/bilm_tf_training (a tiny model,
full softmax) with `dropout` set, take its first batch and zero LSTM state, and compute the two
directions' losses and the gradient of unroll_steps x the loss `--draws` times with fresh masks:
bilm-tf as `LanguageModel(options, is_training=True)` builds it (DropoutWrapper around
ResidualWrapper around LSTMCell, then dropout on the top output), run in bilm-tf's venv by this
same file (`--side=tf`); ours as the train step's loss. It prints, per variable, the gradient
means' difference in standard errors (z) and the ratio of the gradient variances. Where and how
often masks are drawn, what they are applied to and how they are scaled all change these;
`--ours_dropout` different from `--dropout` shows how far off a wrong law lands.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # (its bilm-tf side cannot import benchmarks.common)
FIXTURE = Path(os.environ.get("ELMO_JAX_FIXTURES", ROOT / "tests" / "fixtures")) / "bilm_tf_training"


def tf_side(draws: int, rate: float, out: str) -> None:
    """In bilm-tf's venv, its code on PYTHONPATH: per-variable mean and mean square of the
    gradients, and the losses."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import bilm.training as bt
    import h5py
    import numpy as np
    import tensorflow.compat.v1 as tf

    with h5py.File(FIXTURE / "fixture.hdf5", "r") as f:
        options = {**json.loads(f.attrs["options"]), "dropout": rate}
        tf.set_random_seed(1)
        with tf.variable_scope("lm"):
            model = bt.LanguageModel(options, True)
        variables = tf.trainable_variables()
        grads = [tf.convert_to_tensor(g) for g in tf.gradients(model.total_loss * options["unroll_steps"], variables)]
        feed = {
            placeholder: f[f"step_1/batch/{name}"][...]
            for placeholder, name in (
                (model.tokens_characters, "tokens_characters"),
                (model.tokens_characters_reverse, "tokens_characters_reverse"),
                (model.next_token_id, "next_token_id"),
                (model.next_token_id_reverse, "next_token_id_reverse"),
            )
        }
        initial = {v.name[:-2]: f["initial/" + v.name[:-2]][...] for v in variables}
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for v in variables:
            v.load(initial[v.name[:-2]], sess)
        losses, total, squares = [], [0.0] * len(variables), [0.0] * len(variables)
        for _ in range(draws):
            loss, g = sess.run([model.individual_losses, grads], feed)
            losses.append(loss)
            total = [t + x.astype(np.float64) for t, x in zip(total, g)]
            squares = [s + x.astype(np.float64) ** 2 for s, x in zip(squares, g)]
    np.savez(
        out,
        losses=np.array(losses),
        **{f"mean/{v.name[:-2]}": t / draws for v, t in zip(variables, total)},
        **{f"square/{v.name[:-2]}": s / draws for v, s in zip(variables, squares)},
    )


def our_side(draws: int, rate: float) -> tuple:
    """Our losses (draws, 2) and per-variable (mean, mean square) of the gradients, by bilm-tf name."""
    import functools

    import jax
    import numpy as np

    jax.config.update("jax_default_matmul_precision", "highest")
    from elmo_jax.model.lstm import LSTMState
    from elmo_jax.train.parallel import data_parallel
    from elmo_jax.train.step import _scaled_loss
    from tests.bilm_tf_fixture import load, params_to_tf

    config, hp, values, steps, *_ = load(FIXTURE, dropout=rate)
    batch, state, mesh = steps[0]["batch"], LSTMState.zeros(config, hp.per_device_batch_size), data_parallel(1).mesh
    grad_fn = jax.grad(functools.partial(_scaled_loss, hp=hp), has_aux=True)  # the train step's objective

    @jax.jit
    def draw(key):
        grads, (_, (losses, _)) = grad_fn(values["initial"], batch, state, key, None, config, hp, 1, mesh)
        return losses, grads

    losses, total, squares = [], None, None
    for i in range(draws):
        loss, g = draw(jax.random.key(i))
        losses.append(np.asarray(loss))
        g = {name: x.astype(np.float64) for name, x in params_to_tf(g, config).items()}
        total = g if total is None else {name: total[name] + x for name, x in g.items()}
        squares = (
            {name: x * x for name, x in g.items()}
            if squares is None
            else {name: squares[name] + x * x for name, x in g.items()}
        )
    return np.array(losses), {name: (total[name] / draws, squares[name] / draws) for name in total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--dropout", type=float, default=0.1, help="bilm-tf's rate")
    parser.add_argument("--ours_dropout", type=float, default=None, help="our rate (default: --dropout)")
    parser.add_argument("--bilm_python", default="/tmp/bilmvenv/bin/python")
    parser.add_argument("--bilm_work", default="/tmp/bilm-work")
    parser.add_argument("--side", choices=["both", "tf"], default="both")
    parser.add_argument("--tf_out", default=None)
    args = parser.parse_args()
    if args.side == "tf":
        tf_side(args.draws, args.dropout, args.tf_out)
        return

    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/tf.npz"
        subprocess.run(
            [
                args.bilm_python,
                __file__,
                "--side=tf",
                f"--draws={args.draws}",
                f"--dropout={args.dropout}",
                f"--tf_out={out}",
            ],
            env={**os.environ, "PYTHONPATH": args.bilm_work},
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        theirs = dict(np.load(out))
    ours_rate = args.dropout if args.ours_dropout is None else args.ours_dropout
    losses, moments = our_side(args.draws, ours_rate)
    n = args.draws
    their_losses = theirs["losses"]
    z_loss = (losses.mean(0) - their_losses.mean(0)) / np.sqrt((losses.var(0) + their_losses.var(0)) / n)
    print(f"dropout: bilm-tf {args.dropout}, ours {ours_rate}; {n} draws each")
    print(
        f"losses (forward, backward): bilm-tf {their_losses.mean(0).round(5)}, ours {losses.mean(0).round(5)}, "
        f"z {z_loss.round(2)}"
    )
    print("| variable | max abs z of the gradient means | variance ratio (ours / bilm-tf) |")
    print("|---|---|---|")
    all_z, ratios = [], []
    for name, (mean, square) in moments.items():
        their_mean, their_square = theirs[f"mean/{name}"], theirs[f"square/{name}"]
        var, their_var = np.maximum(square - mean**2, 0), np.maximum(their_square - their_mean**2, 0)
        varies = (var + their_var) > 0  # rows of characters the batch does not hold have no gradient
        z = (mean - their_mean)[varies] / np.sqrt((var + their_var)[varies] / n)
        ratio = var.sum() / their_var.sum()
        all_z.append(z)
        ratios.append(ratio)
        print(f"| {name} | {np.abs(z).max():.2f} | {ratio:.3f} |")
    z = np.concatenate(all_z)
    print(
        f"all {z.size} gradient coordinates: |z| > 3 for {100 * (np.abs(z) > 3).mean():.2f}% "
        f"(0.27% expected for equal laws), mean |z| {np.abs(z).mean():.3f} (0.798 expected); "
        f"variance ratio median {np.median(ratios):.3f}, range {min(ratios):.3f} - {max(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
