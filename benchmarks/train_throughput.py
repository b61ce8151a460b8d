r"""Training throughput of one model under float32, mixed_bfloat16 and mixed_float16, ± XLA.

Every configuration runs `run_train` itself (the training loop, input pipeline and callbacks that
users get: TF checkpoints, loss-scale telemetry, epoch log, TensorBoard) in its own subprocess
(so peak RSS is that configuration's own), on the same data (the offline digits, resized inside
the model) with the same seed, side by side in one run; `--repeats` interleaves the whole sweep
again to show the noise. Epoch 1 (tracing) is warm-up. Printed and written (JSON + Markdown):
images/s of the timed epochs (median, and the range over epochs × repeats), the ratio to
float32-without-XLA, peak RSS, achieved conv/dense GFLOP/s, and that as a fraction of a matmul
peak measured in the same run for the policy's compute dtype. The same script runs unchanged on
a GPU machine (the peak probe then runs on the GPU).

    python benchmarks/train_throughput.py --model resnet50 --image-size 64 --timeout 240 \
        --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
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
    runs: dict[tuple[str, bool], list[dict]] = {}
    for _ in range(args.repeats):  # whole sweeps interleaved: slow drift hits every config
        for policy in POLICIES:
            for jit in (False, True):
                runs.setdefault((policy, jit), []).append(_run_config(args, data_dir, policy, jit))
                _print_row(runs[(policy, jit)][-1])
    rows = [_merge(r) for r in runs.values()]
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
              "steps_per_epoch": args.steps, "timed_epochs": args.epochs,
              "warmup": "epoch 1 (tracing/compilation)", "repeats": args.repeats,
              "optimizer": args.optimizer,
              "loop": "run_train (custom strategy.run loop + callbacks)",
              "matmul_peak_gflops": peaks, "device": _device(), "rows": rows}
    _write(report, Path(args.out))
    return 0


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="resnet50", help="small_cnn, resnet50 or mobilenet_v2")
    p.add_argument("--image-size", type=int, default=64, help="in-model resize (square)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=8, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs after the warm-up epoch")
    p.add_argument("--repeats", type=int, default=1, help="interleaved sweeps (noise)")
    p.add_argument("--optimizer", default="adam", help="adam (run_train's default) or sgd")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds per configuration; a slower one is reported as timed out")
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
           "--steps", str(args.steps), "--epochs", str(args.epochs),
           "--optimizer", args.optimizer, "--learning-rate", str(args.learning_rate),
           "--data-dir", data_dir] + (["--jit"] if jit else [])
    row = {"policy": policy, "xla": jit}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {args.timeout:.0f} s"}
    if done.returncode != 0:
        return {**row, "error": done.stderr.strip().splitlines()[-1][:200]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def _merge(runs: list[dict]) -> dict:
    """One row per configuration: the median over repeats, and the range over timed epochs."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    row = dict(ok[len(ok) // 2])
    row["images_per_sec"] = statistics.median(r["images_per_sec"] for r in ok)
    epochs = [x for r in ok for x in r["epoch_images_per_sec"]]
    row["epoch_images_per_sec"] = epochs
    row["range_images_per_sec"] = [min(epochs), max(epochs)]
    row["step_ms"] = 1000 * row["batch_size"] / row["images_per_sec"]
    row["gflops"] = row["images_per_sec"] * row["train_gflop_per_image"]
    row["repeats"] = len(ok)
    return row


def _worker(args) -> dict:
    """Train `args.model` with `run_train` itself: the loop, input pipeline and callbacks we ship.

    Epoch 1 (tracing/compilation) is warm-up; the timed epochs' throughput is what `run_train`
    records in the metadata (training steps only, validation excluded).
    """
    import keras

    from ampflow.components.prepare_data import load_dataset_info
    from ampflow.components.train import TrainConfig, run_train
    from ampflow.components.train.models import build_model

    with tempfile.TemporaryDirectory() as out:
        meta = run_train(TrainConfig(
            data_dir=Path(args.data_dir), output_dir=Path(out), model=args.model,
            image_size=args.image_size, precision=args.policy, jit_compile=args.jit,
            epochs=1 + args.epochs, batch_size=args.batch_size, steps_per_epoch=args.steps,
            optimizer=args.optimizer, learning_rate=args.learning_rate)).metadata
    timed = [e["examples_per_sec"] for e in meta["epochs"][1:]]
    ips = meta["throughput_examples_per_sec"]
    info = load_dataset_info(args.data_dir)
    model = build_model(args.model, tuple(info["image_shape"]), info["num_classes"],
                        image_size=args.image_size, policy=args.policy)
    flops_per_image = 3 * _forward_flops(model)  # backward ≈ 2× forward
    keras.backend.clear_session()
    return {"images_per_sec": ips, "epoch_images_per_sec": timed, "batch_size": args.batch_size,
            "step_ms": 1000 * args.batch_size / ips,
            "gflops": ips * flops_per_image / 1e9,
            "train_gflop_per_image": flops_per_image / 1e9,
            "xla_reason": meta["xla"]["reason"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


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
        epochs = ", ".join(f"{x:.1f}" for x in row["epoch_images_per_sec"])
        print(f"{row['policy']:>15} xla={row['xla']!s:<5}  {row['images_per_sec']:8.1f} img/s "
              f"(epochs: {epochs})  {row['peak_rss_mib']:7.0f} MiB", flush=True)


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_throughput_{report['model']}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    lines = [f"# Training throughput: {report['model']} at {report['image_size']}², "
             f"batch {report['batch_size']}, {report['device']}", "",
             f"Loop: {report['loop']}, optimizer {report['optimizer']}; "
             f"{report['timed_epochs']} timed epochs × {report['steps_per_epoch']} steps after a "
             f"warm-up epoch, {report['repeats']} interleaved sweep(s).", "",
             "| policy | XLA | img/s (median) | range over epochs | × float32 | step ms | GFLOP/s "
             "| of matmul peak | peak RSS MiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        if "error" in r:
            lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | {r['error']} "
                         "| | | | | | |")
            continue
        ratio = f"{r['ratio_vs_float32']:.2f}" if r.get("ratio_vs_float32") else "–"
        frac = f"{r['fraction_of_matmul_peak']:.0%}" if r.get("fraction_of_matmul_peak") else "–"
        lo, hi = r["range_images_per_sec"]
        lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | "
                     f"{r['images_per_sec']:.1f} | {lo:.1f}–{hi:.1f} | {ratio} | "
                     f"{r['step_ms']:.0f} | {r['gflops']:.0f} | {frac} | "
                     f"{r['peak_rss_mib']:.0f} |")
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in report["matmul_peak_gflops"].items())
    lines += ["", f"Matmul peak measured in the same run (GFLOP/s, 2048²): {peaks}."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
