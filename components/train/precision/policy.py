"""All precision and XLA set-up in one small function (as TF Model Garden's performance.py).

Which half-precision formats the hardware computes natively is one rule, `native_formats`:
`auto`, `--autotune`'s default candidates, `check-model`'s warning and metadata.json all read
it. `auto` takes the first native format of (float16, bfloat16), else float32; XLA is on for
GPU/TPU, and on a CPU only for mixed_float16. The effective setting and why are always logged;
the hardware is injectable, so every branch is testable. The rule per hardware, measured:
docs/explanation/design-notes.md, "precision.py".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ampflow.artifacts.throughput import throughput_unit
from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT
from ampflow.errors import ConfigError
from ampflow.serving.cpu_features import BF16_CPU_FLAGS as _CPU_BF16_FLAGS
from ampflow.serving.cpu_features import read_cpu_flags as _read_cpu_flags

log = logging.getLogger(__name__)

POLICIES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
_CPU_FP16_FLAGS = frozenset({"avx512_fp16", "amx_fp16"})
HALF_POLICIES = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
_MEASURED = "benchmarks/results/native_formats.md"


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
class FormatSupport:
    """Whether one half-precision format is native on the hardware, and why (or why not)."""

    native: bool
    why: str


@dataclass(frozen=True)
class NativeFormats:
    """The rule's verdict for one machine: its kind and each half-precision format."""

    kind: str
    float16: FormatSupport
    bfloat16: FormatSupport

    def of_policy(self, policy: str) -> FormatSupport:
        """The verdict for a policy's compute dtype (float32 is native everywhere)."""
        dtype = HALF_POLICIES.get(policy)
        if dtype is None:
            return FormatSupport(True, "float32 is every device's native format")
        return getattr(self, dtype)

    def native_policies(self) -> tuple[str, ...]:
        """The half-precision policies computed natively, float16 first (auto's preference)."""
        return tuple(p for p in ("mixed_float16", "mixed_bfloat16") if self.of_policy(p).native)

    def as_metadata(self) -> dict:
        """`precision.native_formats` in metadata.json (docs/ARTIFACTS.md)."""
        return {"kind": self.kind,
                "formats": {name: {"native": f.native, "why": f.why}
                            for name, f in (("float16", self.float16),
                                            ("bfloat16", self.bfloat16))}}


def native_formats(hardware: HardwareInfo) -> NativeFormats:
    """THE rule of which half-precision formats `hardware` computes natively (module docstring).

    `auto`, `--autotune`'s default candidates and `check-model` all call this one function.
    """
    if hardware.tpu:
        return NativeFormats("TPU", FormatSupport(False, "a TPU has no float16 matmul units"),
                             FormatSupport(True, "bfloat16 is the TPU's native matmul type"))
    nvidia = [g for g in hardware.gpus if g.vendor == "nvidia"]
    if nvidia:
        return _gpu_formats(nvidia[0])
    return _cpu_formats(hardware.cpu_flags)


def _gpu_formats(gpu: GpuInfo) -> NativeFormats:
    cc = tuple(gpu.compute_capability) if gpu.compute_capability else None
    shown = f"{cc[0]}.{cc[1]}" if cc else "unknown"
    kind = f"NVIDIA GPU {gpu.name} (compute capability {shown})"
    fp16 = (FormatSupport(True, f"compute capability {shown} >= 7.0: float16 Tensor Cores")
            if cc and cc >= (7, 0) else
            FormatSupport(False, f"compute capability {shown} < 7.0: no Tensor Cores"))
    bf16 = (FormatSupport(True, f"compute capability {shown} >= 8.0: bfloat16 Tensor Cores")
            if cc and cc >= (8, 0) else
            FormatSupport(False, f"compute capability {shown} < 8.0: no bfloat16 Tensor Cores "
                                 "(emulated, slower than float32)"))
    return NativeFormats(kind, fp16, bf16)


def _cpu_formats(flags: frozenset[str]) -> NativeFormats:
    bf16_flags = sorted(flags & _CPU_BF16_FLAGS)
    fp16_flags = sorted(flags & _CPU_FP16_FLAGS)
    if "amx_bf16" in flags:
        kind = "CPU with AMX" + (f" and {', '.join(f.upper() for f in fp16_flags)}"
                                 if fp16_flags else "")
    elif bf16_flags:
        kind = "CPU with AVX512_BF16, no AMX"
    else:
        kind = "CPU without bfloat16 instructions (AVX2/AVX-512F)"
    bf16 = (FormatSupport(True, f"{', '.join(bf16_flags)}: oneDNN runs bfloat16 conv/matmul "
                                f"about 1.5-2× float32 ({_MEASURED})")
            if bf16_flags else
            FormatSupport(False, "no AVX512_BF16/AMX-BF16: bfloat16 is emulated, slower than "
                                 "float32 (ResNet-50 0.82×, "
                                 "benchmarks/results/train_autotune_resnet50_no_bf16_cpu.md)"))
    fp16 = FormatSupport(False, (
        (f"{', '.join(fp16_flags)} present, but " if fp16_flags else "")
        + "TF's float16 CPU kernels do not use AVX512_FP16/AMX-FP16: measured on a Xeon "
          "with both, float16 convolutions 0.5-0.6× float32 forward and 0.02-0.03× with "
          f"their gradients, matmul 1.0-1.2× ({_MEASURED})"))
    return NativeFormats(kind, fp16, bf16)


def native_format_notes(policy: str, formats: NativeFormats) -> tuple[str, ...]:
    """What `check-model` says of the hardware: the native formats, and a policy that is not.

    The same verdicts `auto` and `--autotune` act on, so the three never disagree.
    """
    native = [HALF_POLICIES[p] for p in formats.native_policies()]
    notes = [f"native half-precision formats on this {formats.kind}: "
             f"{', '.join(native) if native else 'none'} (the rule --precision auto and "
             "--autotune follow)"]
    support = formats.of_policy(policy)
    if not support.native:
        auto = (formats.native_policies() or ("float32",))[0]
        notes.append(f"{policy} computes in {HALF_POLICIES[policy]}, which is not native here: "
                     f"{support.why}. It trains, slower than float32; auto picks {auto}")
    return tuple(notes)


@dataclass(frozen=True)
class PrecisionSetup:
    """The effective precision and XLA settings, with the reasons, as recorded in metadata."""

    policy: str
    reason: str
    jit_compile: bool
    jit_reason: str
    hardware: str
    native: NativeFormats | None = None  # the rule's verdict on this hardware (metadata)

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
                **({"native_formats": self.native.as_metadata()} if self.native else {}),
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
    # listing logical devices starts TF's runtime (and takes the GPUs' memory): not with GPUs,
    # where autotune's measuring process still needs that memory
    tpu = not gpus and bool(tf.config.list_logical_devices("TPU"))
    return HardwareInfo(gpus=tuple(gpus), tpu=tpu, cpu_flags=_read_cpu_flags())


def choose_policy(requested: str, hardware: HardwareInfo) -> tuple[str, str]:
    """Return `(policy, reason)` for `requested` on `hardware`."""
    if requested not in POLICIES:
        raise ConfigError(f"precision must be one of {POLICIES}. Received: precision={requested!r}")
    if requested != "auto":
        return requested, f"requested explicitly (auto would pick {_auto(hardware)[0]})"
    return _auto(hardware)


def choose_jit(
    requested: bool | None, hardware: HardwareInfo, policy: str = "float32",
    modality: str | None = None,
) -> tuple[bool, str]:
    """Return `(jit_compile, reason)`; None means decide from the hardware and the policy.

    The rule is the same for every model; the reason quotes the measurement of the data's kind
    (`modality`, in its throughput unit), so a text run is not told about images.
    """
    if requested is not None:
        return requested, "requested explicitly"
    if hardware.tpu or hardware.gpus:
        return True, "accelerator present: XLA fuses the mixed-precision casts"
    fp16_note, cpu_note = CPU_JIT_NOTES.get(modality or MODALITY_IMAGE,
                                             CPU_JIT_NOTES[MODALITY_IMAGE])
    if policy == "mixed_float16":
        return True, "CPU with mixed_float16: " + fp16_note
    return False, "CPU only: " + cpu_note.format(
        rate=throughput_unit(modality).rate) + "; pass --xla on to force it"


# The measurement each modality's CPU XLA choice quotes: (under mixed_float16, otherwise).
CPU_JIT_NOTES = {
    MODALITY_IMAGE: (
        "TF's float16 conv kernels without XLA are far slower on a CPU "
        "(benchmarks/results/train_throughput_small_cnn.md: 2.4 vs 187 img/s)",
        "XLA measured slower than plain TF on a CPU for float32 and bfloat16 "
        "(benchmarks/results/train_throughput_small_cnn.md)"),
    MODALITY_TEXT: (
        "TF's float16 CPU kernels without XLA were far slower where measured, on the small "
        "CNN's convolutions (benchmarks/results/train_throughput_small_cnn.md); not "
        "measured on a text model: --xla off to compare",
        "XLA measured slower than plain TF on a CPU for bert_tiny in float32 (15.9 {rate} "
        "with XLA, 63.5 without; bfloat16 within the noise: "
        "benchmarks/results/train_autotune_bert_tiny_amx.md)"),
}


def configure_precision(
    precision: str = "auto",
    jit_compile: bool | None = None,
    hardware: HardwareInfo | None = None,
    modality: str | None = None,
) -> PrecisionSetup:
    """Choose the policy and XLA setting, set the Keras global policy, and log the result.

    Callers that build models afterwards get the chosen policy; restore it with
    `keras.mixed_precision.set_global_policy(...)` when done (tests use a fixture). `modality`
    is the data's (dataset_info.json): the XLA reason quotes a measurement of that kind.
    """
    import keras

    hardware = hardware or detect_hardware()
    policy, reason = choose_policy(precision, hardware)
    jit, jit_reason = choose_jit(jit_compile, hardware, policy, modality)
    keras.mixed_precision.set_global_policy(policy)
    setup = PrecisionSetup(policy, reason, jit, jit_reason, hardware.describe(),
                           native_formats(hardware))
    log.info("precision policy %s: %s [%s]", policy, reason, setup.hardware)
    support = setup.native.of_policy(policy)
    if not support.native:  # an explicit choice the rule would not make: say what it costs
        log.warning("%s is not native on this %s: %s", policy, setup.native.kind, support.why)
    log.info("XLA jit_compile=%s: %s", jit, jit_reason)
    return setup


def _auto(hardware: HardwareInfo) -> tuple[str, str]:
    """The first native format of (float16, bfloat16), else float32; the reason is the rule's."""
    formats = native_formats(hardware)
    for policy in formats.native_policies():
        why = formats.of_policy(policy).why
        if policy == "mixed_float16":
            why += "; dynamic loss scaling keeps small gradients"
        return policy, f"{formats.kind}: {why}"
    return "float32", (f"{formats.kind}: no native half-precision format (float16: "
                       f"{formats.float16.why}; bfloat16: {formats.bfloat16.why})")
