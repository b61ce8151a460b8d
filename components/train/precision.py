"""All precision and XLA set-up in one small function (as TF Model Garden's performance.py).

`auto` follows docs/DESIGN.md ("Precision policy"): an NVIDIA GPU of compute capability ≥ 7.0
(Tensor Cores) gets `mixed_float16` with dynamic loss scaling; a TPU, or a CPU with AVX512_BF16/AMX,
gets `mixed_bfloat16`; anything else stays `float32`. XLA (`jit_compile`) is on by default on
GPU/TPU; on a CPU it is off for float32 and mixed_bfloat16 (measured slower there) and on for
mixed_float16 (TF's float16 CPU kernels without XLA are far slower still). Keras's own
`jit_compile="auto"` decides silently, so we always log the *effective* setting and why.
The hardware is an injectable value so that every branch is testable on any machine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ampflow.errors import ConfigError

log = logging.getLogger(__name__)

POLICIES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
_CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True)
class GpuInfo:
    """One accelerator as TensorFlow reports it."""

    name: str
    vendor: str = "nvidia"
    compute_capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class HardwareInfo:
    """What the precision choice depends on; built by `detect_hardware` or by a test."""

    gpus: tuple[GpuInfo, ...] = ()
    tpu: bool = False
    cpu_flags: frozenset[str] = field(default_factory=frozenset)

    def describe(self) -> str:
        """One line for logs and metadata."""
        if self.tpu:
            return "TPU"
        if self.gpus:
            g = self.gpus[0]
            cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "?"
            return f"{len(self.gpus)}× GPU {g.name} (compute capability {cc})"
        bf16 = sorted(self.cpu_flags & _CPU_BF16_FLAGS)
        return f"CPU only ({'bf16: ' + ', '.join(bf16) if bf16 else 'no bf16 instructions'})"


@dataclass(frozen=True)
class PrecisionSetup:
    """The effective precision and XLA settings, with the reasons, as recorded in metadata."""

    policy: str
    reason: str
    jit_compile: bool
    jit_reason: str
    hardware: str

    @property
    def compute_dtype(self) -> str:
        """The dtype layers compute in."""
        return {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}.get(
            self.policy, "float32"
        )

    @property
    def loss_scaling(self) -> bool:
        """float16 has too few exponent bits for small gradients; bfloat16 does not need it."""
        return self.policy == "mixed_float16"

    def as_metadata(self) -> dict:
        """The `precision` and `xla` blocks of the model metadata."""
        return {
            "precision": {
                "policy": self.policy,
                "reason": self.reason,
                "compute_dtype": self.compute_dtype,
                "variable_dtype": "float32",
                "loss_scaling": "dynamic" if self.loss_scaling else "none",
                "hardware": self.hardware,
            },
            "xla": {"effective": self.jit_compile, "reason": self.jit_reason},
        }


def detect_hardware() -> HardwareInfo:
    """Describe this machine's accelerators and CPU flags."""
    import tensorflow as tf

    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        gpus.append(
            GpuInfo(
                name=details.get("device_name", device.name),
                compute_capability=details.get("compute_capability"),
            )
        )
    tpu = bool(tf.config.list_logical_devices("TPU"))
    return HardwareInfo(gpus=tuple(gpus), tpu=tpu, cpu_flags=_read_cpu_flags())


def choose_policy(requested: str, hardware: HardwareInfo) -> tuple[str, str]:
    """Return `(policy, reason)` for `requested` on `hardware`."""
    if requested not in POLICIES:
        raise ConfigError(f"precision must be one of {POLICIES}. Received: precision={requested!r}")
    if requested != "auto":
        return requested, f"requested explicitly (auto would pick {_auto(hardware)[0]})"
    return _auto(hardware)


def choose_jit(
    requested: bool | None, hardware: HardwareInfo, policy: str = "float32"
) -> tuple[bool, str]:
    """Return `(jit_compile, reason)`; None means decide from the hardware and the policy."""
    if requested is not None:
        return requested, "requested explicitly"
    if hardware.tpu or hardware.gpus:
        return True, "accelerator present: XLA fuses the mixed-precision casts"
    if policy == "mixed_float16":
        return True, (
            "CPU with mixed_float16: TF's float16 conv kernels without XLA are far slower on "
            "a CPU (benchmarks/results/train_throughput_small_cnn.md: 2.4 vs 187 img/s)"
        )
    return False, (
        "CPU only: XLA measured slower than plain TF on a CPU for float32 and bfloat16 "
        "(benchmarks/results/train_throughput_small_cnn.md); pass --xla on to force it"
    )


def configure_precision(
    precision: str = "auto",
    jit_compile: bool | None = None,
    hardware: HardwareInfo | None = None,
) -> PrecisionSetup:
    """Choose the policy and XLA setting, set the Keras global policy, and log the result.

    Callers that build models afterwards get the chosen policy; restore it with
    `keras.mixed_precision.set_global_policy(...)` when done (tests use a fixture).
    """
    import keras

    hardware = hardware or detect_hardware()
    policy, reason = choose_policy(precision, hardware)
    jit, jit_reason = choose_jit(jit_compile, hardware, policy)
    keras.mixed_precision.set_global_policy(policy)
    setup = PrecisionSetup(policy, reason, jit, jit_reason, hardware.describe())
    log.info("precision policy %s: %s [%s]", policy, reason, setup.hardware)
    log.info("XLA jit_compile=%s: %s", jit, jit_reason)
    return setup


def _auto(hardware: HardwareInfo) -> tuple[str, str]:
    if hardware.tpu:
        return "mixed_bfloat16", "TPU: bfloat16 is its native matmul type"
    nvidia = [g for g in hardware.gpus if g.vendor == "nvidia"]
    if nvidia:
        cc = nvidia[0].compute_capability
        if cc is not None and tuple(cc) >= (7, 0):
            return "mixed_float16", (
                f"NVIDIA GPU with compute capability {cc[0]}.{cc[1]} ≥ 7.0 has float16 "
                "Tensor Cores; dynamic loss scaling keeps small gradients"
            )
        return "float32", f"NVIDIA GPU with compute capability {cc} < 7.0: no Tensor Cores"
    bf16 = sorted(hardware.cpu_flags & _CPU_BF16_FLAGS)
    if bf16:
        return "mixed_bfloat16", (
            f"CPU with {', '.join(bf16)}: oneDNN runs bfloat16 conv/matmul about 1.9× float32"
        )
    return "float32", "no GPU/TPU and no bfloat16 CPU instructions: mixed precision would be slower"


def _read_cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
