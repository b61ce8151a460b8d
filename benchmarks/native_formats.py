r"""Which half-precision formats this machine computes natively, measured: TF's conv and matmul.

The native-format rule (`components/train/precision/policy.py: native_formats`) is one table per
hardware kind; this is the measurement behind its CPU rows. A format is native where TF's own
kernels run it at least as fast as float32 (bfloat16 on oneDNN with AVX512_BF16/AMX runs
~1.5-2x); an emulated one runs slower (bfloat16 on an AVX2-only CPU, float16 convolutions on
any CPU: TF's float16 Conv2D CPU kernel does not use AVX512_FP16). Interleaved rounds, the
median of each, so a shared machine's load falls on every format alike.

    python benchmarks/native_formats.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DTYPES = ("float32", "bfloat16", "float16")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()

    import tensorflow as tf

    from ampflow.components.train.precision.policy import detect_hardware, native_formats

    hardware = detect_hardware()
    ops = {  # (GFLOP per call, function)
        "conv3x3 32x28x28x64->64": (2 * 32 * 28 * 28 * 64 * 64 * 9 / 1e9, _conv(tf)),
        "conv3x3 8x14x14x32->32 forward+backward": (3 * 2 * 8 * 14 * 14 * 32 * 32 * 9 / 1e9,
                                                    _conv_train(tf)),
        "matmul 1024x1024": (2 * 1024**3 / 1e9, _matmul(tf)),
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for op, (_, make) in ops.items():
            for dtype in DTYPES:
                times.setdefault((op, dtype), []).append(make(dtype))
    rows = []
    for op, (gflop, _) in ops.items():
        base = statistics.median(times[(op, "float32")])
        for dtype in DTYPES:
            seconds = statistics.median(times[(op, dtype)])
            rows.append({"op": op, "dtype": dtype, "ms": 1000 * seconds,
                         "gflops": gflop / seconds, "vs_float32": base / seconds})
    flags = sorted(hardware.cpu_flags & {"avx2", "avx512f", "avx512_bf16", "avx512_fp16",
                                         "amx_tile", "amx_bf16", "amx_fp16"})
    report = {"tensorflow": tf.__version__, "cpu_flags": flags, "cpus": os.cpu_count(),
              "rule": native_formats(hardware).as_metadata(), "rows": rows}
    _write(report, Path(args.out))
    return 0


def _conv(tf):
    def run(dtype: str) -> float:
        x = tf.random.normal([32, 28, 28, 64], dtype=tf.float32)
        w = tf.random.normal([3, 3, 64, 64], dtype=tf.float32)
        x, w = tf.cast(x, dtype), tf.cast(w, dtype)
        return _time(lambda: tf.nn.conv2d(x, w, 1, "SAME"))
    return run


def _conv_train(tf):
    """What training runs: the convolution and its two gradients (input and filter)."""
    def run(dtype: str) -> float:
        x = tf.cast(tf.random.normal([8, 14, 14, 32]), dtype)  # small: float16 takes seconds
        w = tf.Variable(tf.cast(tf.random.normal([3, 3, 32, 32]), dtype))

        def step():
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.nn.conv2d(x, w, 1, "SAME")
            dx, dw = tape.gradient(y, [x, w])
            return dx[0, 0, 0, 0] + dw[0, 0, 0, 0]
        return _time(step, repeats=1)
    return run


def _matmul(tf):
    def run(dtype: str) -> float:
        a = tf.cast(tf.random.normal([1024, 1024]), dtype)
        return _time(lambda: tf.linalg.matmul(a, a))
    return run


def _time(fn, repeats: int = 3) -> float:
    fn().numpy()  # warm-up: kernel selection
    began = time.perf_counter()
    for _ in range(repeats):
        fn().numpy()
    return (time.perf_counter() - began) / repeats


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "native_formats.json").write_text(json.dumps(report, indent=2))
    rule = report["rule"]
    lines = [f"# Native half-precision formats: TF {report['tensorflow']}, {report['cpus']} CPUs, "
             f"flags {', '.join(report['cpu_flags'])}", "",
             "Median of interleaved rounds; × float32 > 1 is faster than float32.", "",
             "| op | dtype | ms | GFLOP/s | × float32 |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['op']} | {r['dtype']} | {r['ms']:.1f} | {r['gflops']:.0f} | "
              f"{r['vs_float32']:.2f} |" for r in report["rows"]]
    lines += ["", f"The rule (`native_formats`) for this machine, {rule['kind']}:", ""]
    lines += [f"- {fmt}: {'native' if v['native'] else 'not native'} — {v['why']}"
              for fmt, v in rule["formats"].items()]
    (out / "native_formats.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
