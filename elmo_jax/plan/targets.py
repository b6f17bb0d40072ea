"""Accelerators that `elmo-jax plan` compiles for without having one: what XLA needs to build
their programs (a GPU's target description, a TPU slice's topology) and the published figures
the estimate divides by. Peaks are dense (no sparsity), per chip; sources beside each."""

from __future__ import annotations

import dataclasses

from elmo_jax.errors import UserError

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    description: str  # JAX's device_kind of the chip
    platform: str  # "cuda" or "tpu"
    memory_bytes: int  # device memory per chip
    hbm_bytes_per_s: float
    peak_flops: dict[str, float]  # by matmul operand dtype: "bf16", "f32" (TF32 on NVIDIA GPUs)
    link_bytes_per_s: float  # between chips, per direction (NVLink; TPU ICI)
    launch_s: float  # cost of one kernel launch
    source: str
    usable_memory: float = 0.75  # JAX's default pool on GPUs: 75% of the memory
    gpu: dict | None = None  # XLA's GpuTargetConfig fields (SMs, clock, L2, compute capability)
    tpu_topologies: dict[int, str] | None = None  # chips -> topology name

    def peak(self, dtype: str) -> float:
        return self.peak_flops["bf16" if dtype in ("bf16", "f16") else "f32"]

    def topology(self, devices: int) -> dict:
        """Arguments of `jax.experimental.topologies.get_topology_desc` for `devices` chips."""
        if self.platform == "cuda":
            if not 1 <= devices <= 8:
                raise UserError(f"devices={devices}: one host of {self.name} holds 1 to 8 GPUs", ("devices",))
            return {"platform": "cuda", "target_config": self.target_config(), "topology": f"1x1x{devices}"}
        topologies = self.tpu_topologies or {}
        if devices not in topologies:
            raise UserError(f"devices={devices}: {self.name} slices here have {sorted(topologies)} chips", ("devices",))
        return {"platform": "tpu", "topology_name": topologies[devices]}

    def target_config(self) -> str:
        """XLA's GpuTargetConfigProto (text format) for this GPU."""
        g = self.gpu
        if g is None:
            raise ValueError(f"{self.name} is not a GPU")
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {g["shared_memory_per_core"]}
  threads_per_core_limit: 2048
  core_count: {g["sms"]}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.hbm_bytes_per_s)}
  l2_cache_size: {g["l2_bytes"]}
  clock_rate_ghz: {g["clock_ghz"]}
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: {g["shared_memory_per_block_optin"]}
  cuda_compute_capability {{
    major: {g["compute_capability"][0]}
    minor: {g["compute_capability"][1]}
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 7
}}
runtime_version {{
  major: 12
  minor: 8
  patch: 0
}}
device_description_str: "{self.description}"
"""


_HOPPER = {"sms": 132, "clock_ghz": 1.98, "l2_bytes": 50 * 2**20, "compute_capability": (9, 0)}
_HOPPER |= {"shared_memory_per_core": 233_472, "shared_memory_per_block_optin": 232_448}

TARGETS = {
    "h200": Target(
        "h200",
        "NVIDIA H200",
        "cuda",
        memory_bytes=150_754_820_096,  # 141 GB HBM3e, as the driver reports it
        hbm_bytes_per_s=4.8e12,
        peak_flops={"bf16": 989e12, "f32": 494e12},
        link_bytes_per_s=450 * GB,  # NVLink 900 GB/s, both directions
        launch_s=3e-6,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, BF16 989 TFLOP/s and "
        "TF32 494 TFLOP/s dense, NVLink 900 GB/s",
        gpu=_HOPPER,
    ),
    "h100": Target(
        "h100",
        "NVIDIA H100 80GB HBM3",
        "cuda",
        memory_bytes=85_520_809_984,  # 80 GB HBM3 (81,559 MiB as the driver reports it)
        hbm_bytes_per_s=3.35e12,
        peak_flops={"bf16": 989e12, "f32": 494e12},
        link_bytes_per_s=450 * GB,
        launch_s=3e-6,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM): 80 GB HBM3 at 3.35 TB/s, BF16 989 TFLOP/s and "
        "TF32 494 TFLOP/s dense, NVLink 900 GB/s",
        gpu=_HOPPER,
    ),
    "a100": Target(
        "a100",
        "NVIDIA A100-SXM4-80GB",
        "cuda",
        memory_bytes=85_198_045_184,  # 80 GB HBM2e (81,251 MiB as the driver reports it)
        hbm_bytes_per_s=2.039e12,
        peak_flops={"bf16": 312e12, "f32": 156e12},
        link_bytes_per_s=300 * GB,  # NVLink 600 GB/s, both directions
        launch_s=3e-6,
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): HBM2e at 2,039 GB/s, BF16 312 TFLOP/s and "
        "TF32 156 TFLOP/s dense, NVLink 600 GB/s",
        gpu={
            "sms": 108,
            "clock_ghz": 1.41,
            "l2_bytes": 40 * 2**20,
            "compute_capability": (8, 0),
            "shared_memory_per_core": 167_936,
            "shared_memory_per_block_optin": 166_912,
        },
    ),
    # TPUs run float32 matmuls as passes of bfloat16 ones (JAX's default precision: one pass).
    "v5e": Target(
        "v5e",
        "TPU v5 lite",
        "tpu",
        memory_bytes=16 * 2**30,
        hbm_bytes_per_s=819 * GB,
        peak_flops={"bf16": 197e12, "f32": 197e12},
        link_bytes_per_s=200 * GB,  # ICI 400 GB/s per chip, both directions
        launch_s=0.0,  # one program per step: no kernel launches from the host
        source="Google Cloud TPU v5e documentation: 16 GB HBM2 at 819 GB/s, 197 TFLOP/s bf16, ICI 400 GB/s "
        "bidirectional per chip",
        usable_memory=0.95,
        tpu_topologies={1: "v5e:1x1", 4: "v5e:2x2", 8: "v5e:2x4"},
    ),
    "v5p": Target(
        "v5p",
        "TPU v5",
        "tpu",
        memory_bytes=95 * 2**30,
        hbm_bytes_per_s=2765 * GB,
        peak_flops={"bf16": 459e12, "f32": 459e12},
        link_bytes_per_s=600 * GB,  # ICI 1,200 GB/s per chip, both directions
        launch_s=0.0,
        source="Google Cloud TPU v5p documentation: 95 GiB HBM2e at 2,765 GB/s, 459 TFLOP/s bf16, ICI 1,200 GB/s "
        "bidirectional per chip",
        usable_memory=0.95,
        tpu_topologies={1: "v5p:1x1x1", 4: "v5p:2x2x1", 8: "v5p:2x2x2"},
    ),
    "v6e": Target(
        "v6e",
        "TPU v6 lite",
        "tpu",
        memory_bytes=32 * 2**30,
        hbm_bytes_per_s=1638 * GB,
        peak_flops={"bf16": 918e12, "f32": 918e12},
        link_bytes_per_s=400 * GB,  # ICI 800 GB/s per chip, both directions
        launch_s=0.0,
        source="Google Cloud TPU v6e (Trillium) documentation: 32 GB HBM at 1,638 GB/s, 918 TFLOP/s bf16, ICI "
        "800 GB/s bidirectional per chip",
        usable_memory=0.95,
        tpu_topologies={1: "v6e:1x1", 4: "v6e:2x2", 8: "v6e:2x4"},
    ),
}


def for_device_kind(kind: str) -> Target | None:
    """The target whose chip JAX names `kind` (`device.device_kind`), or None."""
    return next((t for t in TARGETS.values() if t.description == kind), None)


def target(name: str) -> Target:
    if name not in TARGETS:
        raise UserError(f"target={name}: one of {', '.join(TARGETS)}", ("target",))
    return TARGETS[name]
