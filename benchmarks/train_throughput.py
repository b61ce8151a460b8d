"""Training throughput of one model under float32, mixed_bfloat16 and mixed_float16, ± XLA.

Every configuration runs in its own subprocess (so peak RSS is that configuration's own) on the
same data (the offline digits, resized inside the model) with the same seed, side by side in
one run. Printed and written (JSON + Markdown): images/s after warm-up, the ratio to
float32-without-XLA, peak RSS, achieved conv/dense GFLOP/s, and that as a fraction of a matmul
peak measured in the same run for the policy's compute dtype. The same script runs unchanged on
a GPU machine (the peak probe then runs on the GPU).

    python benchmarks/train_throughput.py --model resnet50 --image-size 64 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def main() -> int:
    args = _parse()
    if args.worker:
        print(json.dumps(_worker(args)))
        return 0
    data_dir = _prepare(args)
    peaks = _peak_probe()
    rows = []
    for policy in POLICIES:
        for jit in (False, True):
            rows.append(_run_config(args, data_dir, policy, jit))
            _print_row(rows[-1])
    baseline = next(r for r in rows if r["policy"] == "float32" and not r["xla"])
    for row in rows:
        row["ratio_vs_float32"] = (row["images_per_sec"] / baseline["images_per_sec"]
                                   if row.get("images_per_sec") and baseline.get("images_per_sec")
                                   else None)
        dtype = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(row["policy"],
                                                                                "float32")
        peak = peaks.get(dtype)
        row["fraction_of_matmul_peak"] = (row["gflops"] / peak if row.get("gflops") and peak
                                          else None)
    report = {"model": args.model, "image_size": args.image_size, "batch_size": args.batch_size,
              "steps": args.steps, "warmup_steps": args.warmup_steps,
              "matmul_peak_gflops": peaks, "device": _device(), "rows": rows}
    _write(report, Path(args.out))
    return 0


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="resnet50", help="small_cnn, resnet50 or mobilenet_v2")
    p.add_argument("--image-size", type=int, default=64, help="in-model resize (square)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=12, help="timed steps after warm-up")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps (compilation)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--data-dir", default=None, help="a prepared dataset (default: prepare one)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--jit", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def _prepare(args) -> str:
    if args.data_dir:
        return args.data_dir
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    out = Path(tempfile.gettempdir()) / "ampflow-bench-digits"
    return str(run_prepare_data(PrepareDataConfig(output_dir=out)).output_dir)


def _run_config(args, data_dir: str, policy: str, jit: bool) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--policy", policy, "--model", args.model,
           "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
           "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
           "--data-dir", data_dir] + (["--jit"] if jit else [])
    row = {"policy": policy, "xla": jit}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {args.timeout:.0f} s"}
    if done.returncode != 0:
        return {**row, "error": done.stderr.strip().splitlines()[-1][:200]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def _worker(args) -> dict:
    """Train `args.model` for warm-up + timed steps under one policy/XLA setting."""
    import keras
    import numpy as np

    from ampflow.components.prepare_data import load_arrays, load_dataset_info
    from ampflow.components.train.models import build_model

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy(args.policy)
    info = load_dataset_info(args.data_dir)
    images, labels = load_arrays(args.data_dir, "train")
    n = args.batch_size * (args.steps + args.warmup_steps)
    reps = -(-n // len(images))
    x = np.tile(images.astype("float32"), (reps, 1, 1, 1))[:n]
    y = np.tile(labels, reps)[:n]
    model = build_model(args.model, tuple(info["image_shape"]), info["num_classes"],
                        image_size=args.image_size)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    if args.policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  jit_compile=args.jit)
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size).prefetch(2)
    timer = _StepTimer(args.warmup_steps)
    model.fit(ds, epochs=1, verbose=0, callbacks=[timer])
    seconds = timer.timed_seconds
    ips = args.steps * args.batch_size / seconds
    flops_per_image = 3 * _forward_flops(model)  # backward ≈ 2× forward
    return {"images_per_sec": ips, "step_ms": 1000 * seconds / args.steps,
            "gflops": ips * flops_per_image / 1e9,
            "train_gflop_per_image": flops_per_image / 1e9,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}




def _step_timer_class():
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self, warmup: int):
            super().__init__()
            self.warmup, self.start, self.timed_seconds = warmup, None, None

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 == self.warmup:
                self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.timed_seconds = time.perf_counter() - self.start

    return StepTimer


def _StepTimer(warmup: int):  # noqa: N802  (a factory so keras is imported in the worker only)
    return _step_timer_class()(warmup)


def _forward_flops(model) -> float:
    """Multiply-adds ×2 of every Conv2D, DepthwiseConv2D and Dense layer (nested models too)."""
    import keras

    total = 0.0
    for layer in _all_layers(model):
        if isinstance(layer, keras.layers.DepthwiseConv2D):
            kh, kw = layer.kernel_size
            _, h, w, c = layer.output.shape
            total += 2 * kh * kw * h * w * c
        elif isinstance(layer, keras.layers.Conv2D):
            kh, kw = layer.kernel_size
            _, h, w, cout = layer.output.shape
            total += 2 * kh * kw * layer.input.shape[-1] * h * w * cout
        elif isinstance(layer, keras.layers.Dense):
            total += 2 * layer.input.shape[-1] * layer.units
    return total


def _all_layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)
        else:
            yield layer


def _peak_probe() -> dict:
    """Measured matmul GFLOP/s per dtype on this device: the roofline for the ratios."""
    code = """
import json, os, time
os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
import tensorflow as tf
out = {}
n = 2048
for name in ('float32', 'bfloat16', 'float16'):
    a = tf.random.normal((n, n), dtype=tf.float32)
    a = tf.cast(a, name)
    f = tf.function(lambda a: tf.matmul(a, a))
    f(a).numpy()
    reps, t = 0, time.perf_counter()
    while time.perf_counter() - t < 1.5:
        r = f(a); reps += 1
    r.numpy()
    out[name] = 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e9
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}


def _device() -> str:
    try:
        import subprocess as sp

        gpu = sp.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                     capture_output=True, text=True, timeout=10)
        if gpu.returncode == 0 and gpu.stdout.strip():
            return gpu.stdout.strip().splitlines()[0]
    except (OSError, sp.TimeoutExpired):
        pass
    return f"CPU, {os.cpu_count()} cores"


def _print_row(row: dict) -> None:
    if "error" in row:
        print(f"{row['policy']:>15} xla={row['xla']!s:<5}  {row['error']}", flush=True)
    else:
        print(f"{row['policy']:>15} xla={row['xla']!s:<5}  {row['images_per_sec']:8.1f} img/s  "
              f"{row['peak_rss_mib']:7.0f} MiB", flush=True)


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_throughput_{report['model']}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    lines = [f"# Training throughput: {report['model']} at {report['image_size']}², "
             f"batch {report['batch_size']}, {report['device']}", "",
             "| policy | XLA | img/s | × float32 | step ms | GFLOP/s | of matmul peak "
             "| peak RSS MiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        if "error" in r:
            lines.append(f"| {r['policy']} | {r['xla']} | {r['error']} | | | | | |")
            continue
        ratio = f"{r['ratio_vs_float32']:.2f}" if r.get("ratio_vs_float32") else "–"
        frac = f"{r['fraction_of_matmul_peak']:.0%}" if r.get("fraction_of_matmul_peak") else "–"
        lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | "
                     f"{r['images_per_sec']:.1f} | {ratio} | {r['step_ms']:.0f} | "
                     f"{r['gflops']:.0f} | {frac} | {r['peak_rss_mib']:.0f} |")
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in report["matmul_peak_gflops"].items())
    lines += ["", f"Matmul peak measured in the same run (GFLOP/s, 2048²): {peaks}."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
