"""The train step of an experiment compiled for a target without its devices (XLA's deviceless
ahead-of-time compilation: the real program, nothing run, no device memory used), its memory,
and the largest per-device batch that fits, found by compiling."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable

import ml_collections

from elmo_jax.errors import UserError
from elmo_jax.plan.targets import Target

INSTALL = "pip install 'elmo_jax[plan]' (Python 3.12 or newer; TPUs: on Linux)"


class DoesNotFit(UserError):
    """A TPU's compiler refused the program: its temporaries alone (`needs_bytes`, as libtpu
    reports them) exceed the chip's memory."""

    def __init__(self, message: str, needs_bytes: int):
        super().__init__(message)
        self.needs_bytes = needs_bytes


@dataclasses.dataclass
class CompiledStep:
    hlo: str  # the compiled program's text
    memory: dict[str, int]  # argument, output, alias, temp bytes per device
    per_device_batch: int
    unroll_steps: int
    devices: int
    lstm_schedule: str
    compile_s: float
    lstm_cell: str = "xla"
    char_conv: str = "xla"
    char_blocks: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # our char CNN's kernels
    softmax_kernel: str = "xla"

    @property
    def needs_bytes(self) -> int:
        """Device memory the step needs: its arguments, temporaries and the outputs that do not
        reuse an argument's buffer."""
        m = self.memory
        return m["argument"] + m["temp"] + m["output"] - m["alias"]


def memory_of(compiled) -> dict[str, int]:
    """A compiled program's argument, output, alias and temp bytes per device."""
    stats = compiled.memory_analysis()
    return {key: int(getattr(stats, f"{key}_size_in_bytes")) for key in ("argument", "output", "alias", "temp")}


def quiet_accelerator_plugins() -> None:
    """Before JAX starts its backends: run on the CPU here, so that an installed GPU plugin does
    not look for a GPU, CUDA and cuDNN, which a deviceless compile does not need. Without the
    persistent compilation cache: a program compiled without its device cannot be loaded from
    it (JAX warns and compiles again), so each entry would be megabytes for nothing."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


# libtpu without a TPU: its lock on the TPU is for one process (several plans compile at once
# here), and it looks for the TPU host it runs on (the cloud's metadata server, the slice's
# workers), printing screens of warnings where there is none: this host alone, nothing to ask.
_LIBTPU_ALONE = {
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_HOST_BOUNDS": "1,1,1",
}


def abstract_devices(target: Target, devices: int) -> list:
    """`devices` abstract devices of the target, to lay a program out on."""
    from jax.experimental import topologies

    slice_ = target.topology(devices)
    if target.platform == "tpu":  # before libtpu starts
        for name, value in _LIBTPU_ALONE.items():
            os.environ.setdefault(name, value)
    try:
        return list(topologies.get_topology_desc(**slice_).devices)
    except (NotImplementedError, RuntimeError, ValueError) as e:
        raise UserError(
            f"target={target.name}: JAX cannot compile for {target.platform} on this machine ({e}); {INSTALL}",
            ("target",),
        ) from None


def compile_train_step(
    config: ml_collections.ConfigDict, target: Target, devices: int, per_device_batch: int, vocab_size: int
) -> CompiledStep:
    """The experiment's train step at `per_device_batch` rows per device over `devices` of the
    target, the softmax table of `vocab_size` rows laid out as the config says."""
    import jax

    from elmo_jax.experiment import model_config, train_settings
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.lstm import cell, schedule
    from elmo_jax.model.softmax import kernel as softmax_kernel
    from elmo_jax.model.token_encoder import conv, kernel_blocks
    from elmo_jax.text.batcher import round_up
    from elmo_jax.train.parallel import DataParallel
    from elmo_jax.train.step import abstract_train_state, make_train_step
    from elmo_jax.workdir import softmax_table_rows

    with config.unlocked():
        config.train.per_device_batch_size = per_device_batch
        config.train.devices = devices
    parallel = DataParallel(devices, among=abstract_devices(target, devices))
    with tracing_for(_traced_platform(target), parallel.mesh.devices.flat[0]):
        model = model_config(config)
        hp = train_settings(config, vocab_size)
        rows, T = per_device_batch * devices, hp.unroll_steps
        table_rows = softmax_table_rows(config, vocab_size)
        state = abstract_train_state(model, hp, rows, table_rows, parallel, config.train.shard_softmax)
        # The batcher's word table: one row per distinct word, at most one per position.
        words = round_up(min(rows * T, vocab_size), 8 * devices)
        batch = parallel.abstract_batch(rows, T, words, model.char_cnn.max_characters_per_token)
        step = make_train_step(model, hp, parallel, jax.tree.map(lambda a: a.sharding, state))
        start = time.perf_counter()
        # The target's abstract devices stand for the device where a kernel of ours asks what it runs on.
        with jax.sharding.use_abstract_mesh(parallel.mesh.abstract_mesh):
            lowered = step.lower(state, batch)
        compiled = compile_within_memory(lowered, target, per_device_batch)
        seconds = time.perf_counter() - start
        lstm_schedule, lstm_cell, char_conv = schedule(model), cell(model, per_device_batch), conv(model)
        char_blocks = kernel_blocks(model) if char_conv == "pallas" else {}
        softmax = softmax_kernel(model)
    return CompiledStep(
        compiled.as_text(),
        memory_of(compiled),
        per_device_batch,
        T,
        devices,
        lstm_schedule,
        seconds,
        lstm_cell,
        char_conv,
        char_blocks,
        softmax,
    )


def _traced_platform(target: Target) -> str:
    return "gpu" if target.platform == "cuda" else "tpu"


def compile_within_memory(lowered, target: Target, per_device_batch: int):
    """The lowered program compiled; DoesNotFit where the compiler says it needs more memory
    than the target has (XLA's TPU compiler does, with the bytes it needs; the GPU's compiles
    and memory_analysis tells), a UserError where a kernel needs more shared memory than the
    GPU has (more rows or fewer do not change that)."""
    import jax

    try:
        return lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        shared = re.search(r"Shared memory size limit exceeded: requested (\d+), available: (\d+)", str(e))
        if shared:  # one kernel's, whatever the batch: no use searching for rows that fit
            raise UserError(
                f"the program does not compile for {target.name} at any batch: one of its kernels asks for "
                f"{int(shared[1]):,} bytes of shared memory, and a block of the GPU has {int(shared[2]):,} "
                "(--config.train.lstm_cell=xla, --config.train.char_conv=xla and --config.train.softmax_kernel=xla "
                "leave out our Pallas kernels)"
            ) from None
        needed = re.search(r"required for HLO temporaries \(([\d.]+)G\)", str(e))
        needs_bytes = int(float(needed.group(1)) * 2**30) if needed else 0
        raise DoesNotFit(
            f"{per_device_batch} rows per device do not fit on {target.name}: {str(e).splitlines()[0]}",
            max(needs_bytes, target.memory_bytes + 1),
        ) from None


def largest_batch(
    needs: Callable[[int], int], capacity: float, known: dict[int, int], multiple: int = 8, limit: int = 1 << 16
) -> int:
    """The largest per-device batch, a multiple of `multiple` up to `limit`, whose `needs(rows)`
    bytes fit in `capacity` (0 when none does). `known` holds the needs already compiled, and
    gains each one compiled here: the answer is bracketed by compiled sizes, so that it is
    found, not guessed. Each guess follows the line through compiled sizes (the two nearest
    below until one fails, then the bracket's ends); a guess that did not halve a bracket of
    compiled sizes is followed by its midpoint: memory is not linear in the batch (XLA
    rematerialises more at some sizes than at others), and the line alone can creep to the
    answer a few rows a compile."""

    def need(rows: int) -> int:
        if rows not in known:
            known[rows] = needs(rows)
        return known[rows]

    fits, fails = 0, limit + multiple
    for rows, bytes_ in known.items():
        if bytes_ <= capacity:
            fits = max(fits, rows)
        else:
            fails = min(fails, rows)
    if fits == 0 and fails > multiple:
        fits = multiple if need(multiple) <= capacity else 0
        if fits == 0:
            return 0
    halved = True
    while fails - fits > multiple:
        if not halved and fails in known:
            guess = (fits + fails) // 2
        else:
            nearest = sorted(known, key=lambda r: abs(r - fits))[:2]
            lo, hi = (fits, fails) if fails in known else (min(nearest), max(nearest))
            slope = (known[hi] - known[lo]) / (hi - lo) if hi != lo else 0.0
            guess = fits * 2 if slope <= 0 else int(fits + (capacity - known[fits]) / slope)
        guess = min(max(int(guess) // multiple * multiple, fits + multiple), fails - multiple, limit)
        width = fails - fits
        if need(guess) <= capacity:
            fits = guess
            if fits == limit:
                return limit
        else:
            fails = guess
        halved = fails - fits <= width / 2
    return fits


@dataclasses.dataclass
class CompiledEmbed:
    """The programs `Embedder` runs, compiled for a target: the token encoder on a piece of
    words, layer 0's gate table (the layers schedule only), and the LSTM window."""

    programs: dict[str, tuple[str, dict[str, int]]]  # name -> (the compiled text, its memory)
    rows: int  # sentence rows per LSTM window call, over all devices
    words: int  # words per token encoder call, over all devices
    columns: int  # characters of each of those words
    table_rows: int  # distinct words in the table the LSTMs gather from
    devices: int
    lstm_schedule: str
    compile_s: float


EMBED_TABLE_ROWS = 1 << 15  # distinct words of a chunk of embed_file's lines (changes only memory)


def compile_embed(config: ml_collections.ConfigDict, target: Target, devices: int, batch_size: int) -> CompiledEmbed:
    """The embedding programs of the experiment's model for `devices` of the target: rounds of
    `batch_size` sentence rows, pieces of ENCODER_CHUNK words of the most characters a word
    has (the widest a piece can be)."""
    import jax

    from elmo_jax.embed import (
        ENCODER_CHUNK,
        lower_lstm_window,
        lower_token_encoder,
        lower_token_gates,
        uses_gates,
    )
    from elmo_jax.experiment import model_config
    from elmo_jax.local_devices import LocalDevices
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.bilm import init_params
    from elmo_jax.model.lstm import schedule, split_input_weights

    on = LocalDevices(devices, among=abstract_devices(target, devices))
    with tracing_for(_traced_platform(target), on.mesh.devices.flat[0]):
        model = model_config(config)
        params = jax.eval_shape(lambda: init_params(jax.random.key(0), model, None))
        encoder, lstm = params["token_encoder"], params["lstm"]
        if schedule(model) == "layers":  # as the Embedder splits them
            lstm = jax.eval_shape(split_input_weights, lstm)
        rows, words = on.round_up(batch_size), on.round_up(ENCODER_CHUNK)
        columns = model.char_cnn.max_characters_per_token
        lowered = {
            "token encoder": lower_token_encoder(model, on, encoder, words, columns),
            "LSTM window": lower_lstm_window(model, on, lstm, rows, EMBED_TABLE_ROWS),
        }
        if uses_gates(model, EMBED_TABLE_ROWS):
            lowered["gate table"] = lower_token_gates(model, on, lstm, EMBED_TABLE_ROWS)
        start = time.perf_counter()
        compiled = {name: program.compile() for name, program in lowered.items()}
        seconds = time.perf_counter() - start
        programs = {name: (c.as_text(), memory_of(c)) for name, c in compiled.items()}
        return CompiledEmbed(programs, rows, words, columns, EMBED_TABLE_ROWS, devices, schedule(model), seconds)
