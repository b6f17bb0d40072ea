"""Tolerances that float32 arithmetic can honour on any x86-64 CPU.

XLA compiles different code for each CPU (vector width, fused multiply-adds, matmul blocking),
so a float32 result differs from one CPU to another by rounding, which a recurrence amplifies:
an absolute 1e-5 against a float64 LSTM reference held on one CPU and failed on another.
Instead of a fixed number, these tolerances scale with how far float32 rounding can move the
values compared, so they hold on every CPU and stay orders of magnitude below what a real bug
changes. (Comparisons with the original TensorFlow outputs keep their fixed 1e-5: that is the
project's promise, and they pass it with a wide margin.)
"""

from collections.abc import Callable

import jax
import numpy as np

EPS = float(np.finfo(np.float32).eps)  # 2^-23, the float32 spacing at 1
BFLOAT16_EPS = 2.0**-7  # the bfloat16 spacing at 1
# The differences measured (two LLVM optimisation levels, which round differently) reached 1.4
# times the rounding spread against the float64 LSTM reference and 2.5 times between the
# hand-written and autodiff gradients: 16 leaves room for other CPUs' code.
MARGIN = 16


def ulps(want, n: int = MARGIN) -> float:
    """n float32 spacings at the largest |want|: the atol for two float32 runs of the same
    short computation (no long recurrence) that round differently, e.g. on other shapes."""
    return n * EPS * float(np.abs(np.asarray(want, np.float64)).max(initial=0.0))


def value_and_rounding_spread(f: Callable, args: tuple, trials: int = 8, seed: int = 0, eps: float = EPS):
    """f(*args) and how far float32 rounding can move it: the largest |change| of each output
    array of f (a pytree like f's result) over `trials` runs with every float32 element of `args`
    multiplied by 1 + eps * u (u uniform in [-1, 1]) and rounded back to float32, a change the
    size of one rounding (eps = BFLOAT16_EPS: of one rounding to bfloat16). It measures how much
    the computation amplifies rounding for the case at hand (a chaotic recurrence with clipping:
    many times its inputs' spacing). f runs on inputs of the same shapes each time, so a jitted f
    does not compile again."""
    rng = np.random.default_rng(seed)

    def nudge(x):
        if not (isinstance(x, np.ndarray | jax.Array) and x.dtype == np.float32):
            return x
        x = np.asarray(x)
        return (x * (1.0 + eps * rng.uniform(-1.0, 1.0, x.shape))).astype(np.float32)

    def changes(a, b):
        return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())

    value = f(*args)
    spread = jax.tree.map(lambda _: 0.0, value)
    for _ in range(trials):
        moved = f(*jax.tree.map(nudge, args))
        spread = jax.tree.map(lambda s, m, v: max(s, changes(m, v)), spread, moved, value)
    return value, spread


def assert_within_rounding(got, want, spread: float, name: str = "") -> None:
    """got equals want up to MARGIN times the rounding spread (value_and_rounding_spread), or
    times one float32 spacing of the largest |want| where that is more (the result's rounding)."""
    atol = MARGIN * max(spread, ulps(want, 1))
    np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=f"{name}: rounding spread {spread:.3g}")
