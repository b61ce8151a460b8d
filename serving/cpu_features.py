"""Which bfloat16 instructions this CPU has: the one probe training and serving both read.

Training's precision rule (components/train/precision/policy.py: `native_formats`, `auto`,
`--autotune`) and `ampflow serve --compute-precision bfloat16` ask the same question of the
same flags, so the flags and the probe live here, in a module with no imports beyond the
standard library: serving may not import the step layer, and `preflight` runs this before
TensorFlow is imported.

A CPU computes bfloat16 natively with AVX512_BF16 (Cooper Lake, Zen 4 and later) or AMX-BF16
(Sapphire Rapids and later); elsewhere oneDNN emulates it, slower than float32
(benchmarks/results/native_formats.md, train_autotune_resnet50_no_bf16_cpu.md).
"""

from __future__ import annotations

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def read_cpu_flags() -> frozenset[str]:
    """The `flags` line of /proc/cpuinfo (empty where there is none: not Linux, not x86)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def bf16_flags(flags: frozenset[str]) -> list[str]:
    """The native-bfloat16 flags among `flags`, sorted (empty: bfloat16 is emulated)."""
    return sorted(flags & BF16_CPU_FLAGS)
