"""Embedding over this process's devices: batch rows sharded over a one-axis mesh ("rows"),
params replicated. Each device runs its own rows, so the vectors are those of one device."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elmo_jax.errors import UserError

AXIS = "rows"


class LocalDevices:
    """The first `devices` local devices (None: all of them), or of `among` (the abstract
    devices of a target that `elmo_jax.plan` compiles for)."""

    def __init__(self, devices: int | None = None, among: list | None = None):
        available = jax.local_devices() if among is None else among
        n = len(available) if devices is None else devices
        if not 0 < n <= len(available):
            raise UserError(f"devices={devices}: this process sees {len(available)} device(s)")
        self.size = n
        self.mesh = Mesh(np.array(available[:n]), (AXIS,))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())

    def sharded_on(self, axis: int) -> NamedSharding:
        """Array axis `axis` split over the devices."""
        return NamedSharding(self.mesh, PartitionSpec(*[None] * axis, AXIS))

    def round_up(self, rows: int) -> int:
        """The fewest rows >= `rows` that split evenly over the devices."""
        return -(-rows // self.size) * self.size

    def replicate(self, tree):
        return jax.device_put(tree, self.replicated)
