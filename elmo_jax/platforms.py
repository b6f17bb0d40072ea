"""The platforms JAX starts: on a machine with no GPU or TPU attached, the CPU alone (unless the
user chose), so that installed accelerator plugins (the `plan` extra's CUDA plugin and libtpu)
do not probe for hardware that is not there and print screens of tracebacks (cuDNN not found,
TPU worker hostnames). A command sets `JAX_PLATFORMS=cpu` before JAX is imported; the library
sets JAX's own config instead, leaving the user's environment (and the processes it starts)
as it was. Compiling for an accelerator without one (`plan`) works either way."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import MutableMapping
from pathlib import Path

# Device files of attached accelerators: NVIDIA GPUs, AMD GPUs (ROCm), TPUs (/dev/accel*: v2-v4,
# /dev/vfio/N: v5e and later), GPUs under WSL 2 (/dev/dxg).
_ACCELERATORS = ("nvidiactl", "nvidia[0-9]*", "kfd", "accel[0-9]*", "vfio/[0-9]*", "dxg")
# The plugins that probe for their hardware when JAX starts (the `plan` extra installs them).
_PROBING_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13", "jax_cuda12_plugin", "libtpu")


def accelerator_attached(dev: Path = Path("/dev")) -> bool:
    return any(next(dev.glob(pattern), None) is not None for pattern in _ACCELERATORS)


def cpu_unless_accelerated(environ: MutableMapping[str, str] = os.environ, dev: Path = Path("/dev")) -> None:
    """Before JAX starts: JAX_PLATFORMS=cpu where it is unset and no accelerator is attached."""
    if not environ.get("JAX_PLATFORMS") and not accelerator_attached(dev):
        environ["JAX_PLATFORMS"] = "cpu"


def cpu_in_jax_unless_accelerated(dev: Path = Path("/dev")) -> None:
    """For the library: JAX's `jax_platforms` set to "cpu" where a plugin that probes for its
    hardware is installed, no platform was chosen (JAX_PLATFORMS or the config: the way to
    choose another), JAX has not started its backends and no accelerator is attached."""
    import jax

    if not any(_installed(name) for name in _PROBING_PLUGINS) or jax.config.jax_platforms or accelerator_attached(dev):
        return
    try:
        from jax._src import xla_bridge

        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # another JAX: leave its platforms alone
        return
    if not started:
        jax.config.update("jax_platforms", "cpu")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is not there
        return False
