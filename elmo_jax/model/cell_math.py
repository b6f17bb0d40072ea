"""The LSTM cell's arithmetic (docs/MODEL.md section 1), written once for XLA's cell
(`lstm`) and our kernels' (`cell_kernels`): the gate activations as one tanh, the cell update,
the clips, and their gradients. Arguments broadcast: a step's (L, D, B, .) arrays in XLA's cell,
a block's (rows, columns) in a kernel."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# Per gate i, j, f, o: (slope, offset, shift) of act = slope * tanh(slope * z + offset) + shift,
# the four activations [sigmoid(i), tanh(j), sigmoid(f + 1), sigmoid(o)] as one tanh
# (sigmoid(x) = tanh(x / 2) / 2 + 1 / 2; the +1 forget bias as the offset 1/2).
GATES = ((0.5, 0.0, 0.5), (1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, 0.0, 0.5))


def gate_constants(C: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GATES per gate column (4C,): slope, offset and shift, the gates' blocks i, j, f, o."""
    slope, offset, shift = np.repeat(np.array(GATES, np.float32), C, axis=0).T
    return slope, offset, shift


def activation(z, slope, offset, shift):
    """A gate's activation of its pre-activation z (`GATES`)."""
    return slope * jnp.tanh(slope * z + offset) + shift


def activation_gradient(d_act, act, slope, shift):
    """The gradient at z of a gate's activation `act`, given the gradient at it."""
    tanh_of_act = (act - shift) / slope
    return d_act * slope * slope * (1.0 - tanh_of_act * tanh_of_act)


def clipped(x, value: float | None):
    """x clipped to [-value, value] (None: not clipped)."""
    return x if value is None else jnp.clip(x, -value, value)


def clipped_gradient(g, x, value: float | None):
    """The gradient g of a clip's output at its input x: g where |x| < value, else 0."""
    return g if value is None else jnp.where(jnp.abs(x) < value, g, 0.0)


def cell_update(si, tj, sf, c, clip: float | None):
    """The new cell from the activations of gates i, j, f and the cell before: clipped f c + i j."""
    return clipped(sf * c + si * tj, clip)


def cell_left(acts, c, ran, clip: float | None):
    """The cell that a step leaves, as its save slot keeps it: from the activations (i, j, f, o)
    and the cell c it read, the update where it ran, else c. The backward pass computes it again
    from what it reads anyway (the activations, the cell before) rather than read it: the
    forward's arithmetic, on the same values, to the same bits where the compiler emits the same
    code."""
    si, tj, sf, _ = acts
    return jnp.where(ran, cell_update(si, tj, sf, c, clip), c)


def cell_gradients(acts, c_new, c_prev, d_a, d_c, ran, clip: float | None):
    """One step's gradients: the activations (i, j, f, o), the cell it left and the one it read,
    the gradient of the projection's operand a = o tanh(c) and the cell's carried from the step
    after, where the step ran -> (the gradients of the four activations, the cell gradient
    carried to the step before). Where a step did not run it passes d_c through."""
    si, tj, sf, so = acts
    tc = jnp.tanh(c_new)
    d_c_raw = clipped_gradient(jnp.where(ran, d_c, 0.0) + d_a * so * (1.0 - tc * tc), c_new, clip)
    d_acts = (d_c_raw * tj, d_c_raw * si, d_c_raw * c_prev, d_a * tc)
    return d_acts, d_c_raw * sf + jnp.where(ran, 0.0, d_c)
