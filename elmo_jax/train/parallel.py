"""Data parallelism over a one-axis mesh ("data") of devices, on one host or many.

Batch rows (and the LSTM state they carry) are sharded over "data"; params and optimizer state
are replicated, except the softmax table, which can be sharded by rows. Each process feeds only
the rows that live on its own devices: a contiguous block of the global batch, so row r of the
global batch reads the same text whatever the number of processes. `jax.jit` over the mesh
inserts the collectives (gathers of the softmax rows a step touches, the encoded words); the
LSTMs and the loss run per device under `jax.shard_map` (train/step.py), which sums each
gradient over the devices once per step.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from elmo_jax.errors import UserError
from elmo_jax.model.lstm import LSTMState
from elmo_jax.text.batcher import Batch

AXIS = "data"


class DataParallel:
    """The mesh of the first `devices` devices (0 = all) and how arrays are laid out on it.
    `among`: the devices to take them from (default `jax.devices()`; `elmo_jax.plan` passes a
    target's abstract devices, to compile for hardware it does not have)."""

    def __init__(self, devices: int = 0, among: list | None = None):
        available = jax.devices() if among is None else among
        n = devices or len(available)
        if not 0 < n <= len(available):
            raise UserError(f"config.train.devices={devices}: this run sees {len(available)} device(s)")
        if jax.process_count() > 1 and n != len(available):
            raise UserError(
                f"config.train.devices={devices}: a multi-process run uses all {len(available)} devices "
                f"of its {jax.process_count()} processes (devices=0)"
            )
        # Ordered by process, so each process's devices hold one contiguous block of rows
        # (jax.make_mesh may reorder devices by physical topology, e.g. on TPU pods).
        chosen = sorted(available[:n], key=lambda d: (d.process_index, d.id))
        self.mesh = Mesh(np.array(chosen), (AXIS,), axis_types=(AxisType.Auto,))
        self.size = n
        self.local_size = sum(d.process_index == jax.process_index() for d in self.mesh.devices.flat)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.rows = NamedSharding(self.mesh, PartitionSpec(AXIS))

    def sharded_on(self, axis: int) -> NamedSharding:
        """Sharded on array axis `axis` over the devices."""
        return NamedSharding(self.mesh, PartitionSpec(*[None] * axis, AXIS))

    # -- batches ----------------------------------------------------------------------------
    def check_rows(self, global_rows: int, what: str) -> None:
        if global_rows % self.size:
            raise UserError(
                f"{what}={global_rows} rows cannot be split evenly over {self.size} devices; use a "
                f"multiple of {self.size}"
            )

    def local_rows(self, global_rows: int) -> range:
        """The global batch rows whose shards live on this process's devices."""
        self.check_rows(global_rows, "batch")
        indices = self.rows.addressable_devices_indices_map((global_rows,)).values()
        slices = sorted((s[0].start or 0) if s else 0 for s in indices)
        per_device = global_rows // self.size
        start = slices[0]
        if slices != list(range(start, start + per_device * len(slices), per_device)):
            raise ValueError(f"this process's devices hold rows starting at {slices}: not one contiguous block")
        return range(start, start + per_device * len(slices))

    @property
    def fixed_table(self) -> bool:
        """Whether the batcher's word table must have a fixed size (see StreamBatcher): when
        several processes feed the mesh, each sends the same shape without asking the others."""
        return jax.process_count() > 1

    def batch_shardings(self) -> Batch:
        return Batch(chars=self.rows, ids=self.sharded_on(1), targets=self.sharded_on(1), mask=self.rows)

    def abstract_batch(self, rows: int, unroll_steps: int, distinct_words: int, max_chars: int) -> Batch:
        """Shapes, dtypes and shardings of a global batch, to compile a step without data."""
        shapes = Batch(
            chars=((distinct_words, max_chars), np.int32),
            ids=((2, rows, unroll_steps), np.int32),
            targets=((2, rows, unroll_steps), np.int32),
            mask=((rows, unroll_steps), np.bool_),
        )
        return Batch(
            *(
                jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
                for (shape, dtype), sharding in zip(shapes, self.batch_shardings(), strict=True)
            )
        )

    def put_batch(self, local: Batch) -> Batch:
        """This process's rows of a batch -> global arrays. Each process's `chars` table becomes
        its block of the global table, so its `ids` are offset to point into that block."""
        n_proc, index = jax.process_count(), jax.process_index()
        local = local._replace(ids=local.ids + index * local.chars.shape[0])

        def put(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
            axis = sharding.spec.index(AXIS)
            shape = x.shape[:axis] + (x.shape[axis] * n_proc,) + x.shape[axis + 1 :]
            return jax.make_array_from_process_local_data(sharding, x, shape)

        return Batch(*map(put, local, self.batch_shardings()))

    def lstm_state_sharding(self) -> LSTMState:
        return LSTMState(self.sharded_on(2), self.sharded_on(2))

    def state_shardings(self, abstract_state, shard_softmax: bool):
        """Shardings of a TrainState: replicated but for the carried LSTM state (by rows, like
        the batch) and, with `shard_softmax`, the softmax table and its Adagrad accumulators
        (by table rows)."""
        table = self.rows if shard_softmax else self.replicated
        shardings = jax.tree.map(lambda _: self.replicated, abstract_state)
        return shardings.replace(
            params={**shardings.params, "softmax": {"W": table, "b": table}},
            opt_state={**shardings.opt_state, "softmax": {"W": table, "b": table}},
            lstm_state=self.lstm_state_sharding(),
        )

    def onto_mesh(self, tree):
        """Arrays already laid out on this mesh's devices stay as they are; the others (numpy,
        or on other devices) are replicated onto it."""
        devices = set(self.mesh.devices.flat)

        def place(x):
            if isinstance(x, jax.Array) and x.sharding.device_set == devices:
                return x
            return jax.device_put(x, self.replicated)

        return jax.tree.map(place, tree)

    def zeros_lstm_state(self, config, global_rows: int) -> LSTMState:
        """Zero carried state (2, L, B, .) with its rows sharded like the batch."""
        return jax.jit(lambda: LSTMState.zeros(config, global_rows), out_shardings=self.lstm_state_sharding())()


@functools.cache
def data_parallel(devices: int = 0) -> DataParallel:
    """One DataParallel per device count, so jitted functions keyed on it are reused."""
    return DataParallel(devices)
