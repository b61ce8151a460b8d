"""What a benchmark records about the host it ran on: CPU units, oneDNN's ISA, load, commit.

Shared by the training benchmarks (train_throughput.py, step_profile.py, input_pipeline.py,
train_memory.py), so each names its host the same way. A ratio taken on a shared machine means
little without the load beside it, and a number taken while another developer changes the
training code means little without the commit it was taken at.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIMD_PREFIXES = ("avx", "amx", "fma", "f16c")
BF16_UNITS = frozenset({"avx512_bf16", "amx_bf16", "amx_tile"})
FP16_UNITS = frozenset({"avx512_fp16", "amx_fp16"})


def _cpuinfo() -> tuple[set[str], str]:
    flags: set[str] = set()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return flags, model


def simd_flags() -> list[str]:
    """The CPU's vector/matrix flags from /proc/cpuinfo (AVX*, AMX*, FMA, F16C)."""
    return sorted(f for f in _cpuinfo()[0] if f.startswith(SIMD_PREFIXES))


def onednn_isa() -> str | None:
    """The ISA oneDNN dispatches to here (from its verbose header), in a throwaway process."""
    code = ("import os; os.environ['TF_CPP_MIN_LOG_LEVEL']='2'; import tensorflow as tf; "
            "tf.nn.conv2d(tf.ones((1, 8, 8, 8)), tf.ones((3, 3, 8, 8)), 1, 'SAME').numpy()")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "ONEDNN_VERBOSE": "1"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((line.split("isa:", 1)[1].strip() for line in done.stdout.splitlines()
                 if "isa:" in line), None)


def cpu_capabilities() -> dict:
    """The CPU's bf16/fp16 units (from /proc/cpuinfo) and the ISA oneDNN dispatches to.

    Without AVX512_BF16 or AMX, oneDNN runs bfloat16 kernels emulated on AVX-512 (slower than
    float32), so no bf16 speed-up can be expected, and a bf16 goal does not apply.
    """
    flags, model = _cpuinfo()
    bf16 = sorted(flags & BF16_UNITS)
    return {"model_name": model, "bf16_units": bf16, "bf16_hardware": bool(bf16),
            "fp16_units": sorted(flags & FP16_UNITS), "onednn_isa": onednn_isa()}


def cpu_kind(capabilities: dict) -> str:
    """A short name for the CPU kind, for file names: amx, avx512_bf16 or no_bf16."""
    units = set(capabilities.get("bf16_units") or ())
    if "amx_bf16" in units:
        return "amx"
    return "avx512_bf16" if "avx512_bf16" in units else "no_bf16"


def device() -> str:
    """The GPU's name where nvidia-smi sees one, else 'CPU, N cores'."""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if gpu.returncode == 0 and gpu.stdout.strip():
            return gpu.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return f"CPU, {os.cpu_count()} cores"


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_commit(paths: tuple[str, ...] = ("components/train",)) -> dict:
    """The commit the numbers were taken at, and whether `paths` had uncommitted changes."""
    def git(*argv: str) -> str:
        try:
            done = subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout if done.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", *paths).splitlines()  # "XY path" each
    return {"commit": git("rev-parse", "HEAD").strip() or None,
            "uncommitted_in": sorted({line[3:] for line in changed})}
