r"""Training throughput of one model under float32, mixed_bfloat16 and mixed_float16, ± XLA.

Every configuration runs `run_train` itself (the training loop, input pipeline and callbacks that
users get: TF checkpoints, loss-scale telemetry, epoch log, TensorBoard) in its own subprocess
(so peak RSS is that configuration's own), on the same data (the offline digits, resized inside
the model) with the same seed, side by side in one run; `--repeats` interleaves the whole sweep
again to show the noise. Epoch 1 (tracing) is warm-up. Printed and written (JSON + Markdown):
images/s of the timed epochs (median, and the range over epochs × repeats), the ratio to
float32-without-XLA, peak RSS, and the efficiency: FLOPs per training image counted from the
model (2 FLOPs per multiply-add of every Conv2D, DepthwiseConv2D and Dense layer: forward,
weight gradient, and input gradient except for the first layer, whose input needs none), the
achieved GFLOP/s, and that as a fraction of the conv peak (a 3×3 conv, 32×56×56×128→128,
counted the same way) and of the matmul peak, both measured in the same run for the policy's
compute dtype. The CPU's bf16 units (AVX512_BF16/AMX flags and the ISA oneDNN dispatches to) are
recorded: without them bfloat16 runs emulated and the bf16 efficiency goal (≥ 1.6× float32,
≥ 40 % of the bf16 conv peak, issue 13) does not apply. `--profile` instead runs
step_profile.py for the model (the op-level ceiling, the step per policy and the TF profiler's
split of the step by op group: where a step's time goes, benchmarks/step_profile.py).
`--progress-ab` instead runs each configuration with the progress display off (quiet), as plain
lines every second (stderr a pipe), and as a live bar (stderr a pseudo-terminal), interleaved
`--repeats` times, and writes the throughput of each as a ratio to off (issue 25: the display
must cost nothing measurable).
The same script runs unchanged on a GPU machine (the peak probes then run on the GPU).

    python benchmarks/train_throughput.py --model resnet50 --image-size 96 --out benchmarks/results
    python benchmarks/train_throughput.py --model resnet50 --image-size 96 --profile
    python benchmarks/train_throughput.py --model small_cnn --policies float32 --xla off \
        --progress-ab --repeats 3 --tag progress_cpu
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The host's facts live in bench_host.py; these names stay for the scripts that import them here
# (input_pipeline.py, train_memory.py).
from bench_host import cpu_capabilities as _cpu_capabilities  # noqa: E402
from bench_host import device as _device  # noqa: E402
from bench_host import simd_flags as _simd_flags  # noqa: E402

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
# The efficiency goal of issue 13 for mixed_bfloat16 on a CPU with bf16 units.
BF16_GOAL = {"ratio_vs_float32": 1.6, "fraction_of_conv_peak": 0.40}
_DTYPE = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def main() -> int:
    args = _parse()
    if args.worker:
        print(json.dumps(_worker(args)))
        return 0
    if args.profile:
        return _profile(args)
    data_dir = _prepare(args)
    if args.progress_ab:
        return _progress_ab(args, data_dir)
    cpu = _cpu_capabilities()
    peaks = _peak_probe()
    runs: dict[tuple[str, bool], list[dict]] = {}
    configs = [(p, jit) for p in args.policies for jit in args.xla]
    for _ in range(args.repeats):  # whole sweeps interleaved: slow drift hits every config
        for policy, jit in configs:
            runs.setdefault((policy, jit), []).append(_run_config(args, data_dir, policy, jit))
            _print_row(runs[(policy, jit)][-1])
    peaks_after = _peak_probe()  # the machine's state can drift during a long sweep
    rows = [_merge(r) for r in runs.values()]
    baseline = next((r for r in rows if r["policy"] == "float32" and not r["xla"]), {})
    for row in rows:
        row["ratio_vs_float32"] = (row["images_per_sec"] / baseline["images_per_sec"]
                                   if row.get("images_per_sec") and baseline.get("images_per_sec")
                                   else None)
        dtype = _DTYPE.get(row["policy"], "float32")
        for kind in ("conv", "matmul"):
            peak = max(peaks.get(kind, {}).get(dtype, 0), peaks_after.get(kind, {}).get(dtype, 0))
            row[f"fraction_of_{kind}_peak"] = (row["gflops"] / peak
                                               if row.get("gflops") and peak else None)
    report = {"model": args.model, "image_size": args.image_size, "batch_size": args.batch_size,
              "dataset": args.dataset, "steps_per_epoch": args.steps, "timed_epochs": args.epochs,
              "warmup": "epoch 1 (tracing/compilation)", "repeats": args.repeats,
              "optimizer": args.optimizer, "threads": _threads(args),
              "loop": "run_train (custom strategy.run loop + callbacks)",
              "flops_counting": "2 per multiply-add of Conv2D/DepthwiseConv2D/Dense: forward + "
                                "weight gradient + input gradient (not for the first layer)",
              "peak_gflops": peaks, "peak_gflops_after": peaks_after,
              "peak_note": "conv: 3x3, 32x56x56x128->128, forward; matmul: 2048x2048; "
                           "fractions use the higher of the two probes",
              "cpu": cpu, "device": _device(), "tag": args.tag, "rows": rows}
    report["bf16_goal"] = _bf16_goal(report)
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
    p.add_argument("--dataset", default="ampflow_digits",
                   help="offline dataset to prepare: ampflow_digits (8x8) or ampflow_mnist (28x28)")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--xla", nargs="+", type=_onoff, default=[False, True],
                   help="XLA settings to sweep: off on (default both)")
    p.add_argument("--inter-op-threads", type=int, default=0, help="0 = TF's default")
    p.add_argument("--intra-op-threads", type=int, default=0, help="0 = TF's default")
    p.add_argument("--profile", action="store_true",
                   help="run step_profile.py (ceiling, step, per-op profile) for the model "
                        "instead of the throughput sweep")
    p.add_argument("--profile-steps", type=int, default=4, help="profiled steps per policy")
    p.add_argument("--progress-ab", action="store_true",
                   help="throughput with the progress display off / plain lines / a bar, "
                        "interleaved, as ratios to off")
    p.add_argument("--tag", default="",
                   help="suffix for the output files (e.g. the machine), so runs do not overwrite")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--jit", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def _onoff(text: str) -> bool:
    if text.lower() in ("on", "true", "1"):
        return True
    if text.lower() in ("off", "false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off. Received: {text!r}")


def _threads(args) -> dict:
    return {"inter_op": args.inter_op_threads or "default",
            "intra_op": args.intra_op_threads or "default"}


def _prepare(args) -> str:
    if args.data_dir:
        return args.data_dir
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    out = Path(tempfile.gettempdir()) / f"ampflow-bench-{args.dataset}"
    return str(run_prepare_data(PrepareDataConfig(output_dir=out,
                                                  dataset=args.dataset)).output_dir)


def _worker_args(args, data_dir: str, policy: str) -> list[str]:
    return ["--policy", policy, "--model", args.model, "--image-size", str(args.image_size),
            "--batch-size", str(args.batch_size), "--steps", str(args.steps),
            "--epochs", str(args.epochs), "--optimizer", args.optimizer,
            "--learning-rate", str(args.learning_rate), "--data-dir", data_dir,
            "--inter-op-threads", str(args.inter_op_threads),
            "--intra-op-threads", str(args.intra_op_threads),
            "--profile-steps", str(args.profile_steps)]


def _set_threads(args) -> None:
    """Thread pools must be sized before TF runs anything (0 keeps TF's default)."""
    import tensorflow as tf

    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)


def _run_config(args, data_dir: str, policy: str, jit: bool, progress: str | None = None) -> dict:
    """One configuration in its own process; `progress`: off, lines or bar (None: as is)."""
    cmd = [sys.executable, __file__, "--worker", *_worker_args(args, data_dir, policy)]
    cmd += ["--jit"] if jit else []
    row = {"policy": policy, "xla": jit}
    env = dict(os.environ)
    if progress is not None:
        row["progress"] = progress
        env.update({"AMPFLOW_QUIET": "1" if progress == "off" else "0",
                    "AMPFLOW_PROGRESS_EVERY_S": "1"})
    try:
        if progress == "bar":
            returncode, stdout, stderr = _run_on_a_terminal(cmd, env, args.timeout)
        else:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=env)
            returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {args.timeout:.0f} s"}
    if returncode != 0:
        return {**row, "error": stderr.strip().splitlines()[-1][:200]}
    if progress is not None:
        row["progress_output"] = {"bytes": len(stderr), "redraws": stderr.count("\r"),
                                  "lines": stderr.count("ampflow.progress:")}
    return {**row, **json.loads(stdout.strip().splitlines()[-1])}


def _progress_update_cost_us(calls: int = 200_000) -> dict[str, float]:
    """Microseconds per `Progress.update` in each mode, the bar drawn to a terminal stand-in."""
    import io
    import logging
    import time

    from ampflow.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

        def write(self, text):  # a real terminal's cost is the kernel's, not the caller's
            return len(text)

    logging.getLogger("ampflow.progress").propagate = False
    cost = {}
    values = {"loss": 0.25, "accuracy": 0.5, "scale": 32768.0}
    for mode, kwargs in (("off", {"quiet": True}), ("lines", {"every_s": 1.0,
                                                               "stream": io.StringIO()}),
                         ("bar", {"stream": Terminal()})):
        shown = Progress(calls, "bench", items_per_unit=32, item="img", remaining_after=calls,
                         **{"quiet": False, **kwargs})
        began = time.perf_counter()
        for _ in range(calls):
            shown.update(values=lambda: values)
        cost[mode] = 1e6 * (time.perf_counter() - began) / calls
        if mode != "off":  # one display (a redraw or a line), paid at most every interval
            began = time.perf_counter()
            for _ in range(200):
                shown._show(time.monotonic(), values)
            cost[f"one {mode} display"] = 1e6 * (time.perf_counter() - began) / 200
        shown.close()
    return cost


def _run_on_a_terminal(cmd: list[str], env: dict, timeout: float) -> tuple[int, str, str]:
    """Run `cmd` with stderr on a 120x40 pseudo-terminal (drained by a thread)."""
    import fcntl
    import struct
    import termios
    import threading

    main, child = os.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    chunks: list[bytes] = []

    def drain():
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the child side closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=child, text=True, env=env)
    os.close(child)
    reader.start()
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        reader.join(timeout=10)
        os.close(main)
    return proc.returncode, stdout, b"".join(chunks).decode(errors="replace")


PROGRESS_MODES = ("off", "lines", "bar")


def _progress_ab(args, data_dir: str) -> int:
    """Each configuration with the display off / lines / bar, interleaved; ratios to off."""
    runs: dict[tuple[str, bool, str], list[dict]] = {}
    configs = [(p, jit) for p in args.policies for jit in args.xla]
    for _ in range(args.repeats):
        for policy, jit in configs:
            for mode in PROGRESS_MODES:  # interleaved: drift hits every mode alike
                row = _run_config(args, data_dir, policy, jit, mode)
                runs.setdefault((policy, jit, mode), []).append(row)
                print(f"{mode:>6}: ", end="")
                _print_row(row)
    rows = []
    for (_policy, _jit, mode), mode_runs in runs.items():
        row = _merge(mode_runs)
        row["progress"] = mode
        row["repeat_images_per_sec"] = [r.get("images_per_sec") for r in mode_runs]
        rows.append(row)
    for row in rows:
        off = next((r for r in rows if (r["policy"], r["xla"], r["progress"]) ==
                    (row["policy"], row["xla"], "off")), {})
        row["ratio_vs_off"] = (row["images_per_sec"] / off["images_per_sec"]
                               if row.get("images_per_sec") and off.get("images_per_sec")
                               else None)
        off_epochs = off.get("epoch_images_per_sec") or []
        row["noise_off"] = ((max(off_epochs) - min(off_epochs)) / statistics.median(off_epochs)
                            if off_epochs else None)
    update_us = _progress_update_cost_us()
    report = {"model": args.model, "image_size": args.image_size, "batch_size": args.batch_size,
              "dataset": args.dataset, "steps_per_epoch": args.steps, "timed_epochs": args.epochs,
              "repeats": args.repeats, "update_cost_us": update_us, "modes": {
                  "off": "AMPFLOW_QUIET=1", "lines": "stderr a pipe, a line every 1 s",
                  "bar": "stderr a 120x40 pseudo-terminal, a tqdm bar redrawn every 0.1 s"},
              "cpu": _cpu_capabilities(), "cpu_simd_flags": _simd_flags(), "device": _device(),
              "tag": args.tag, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_throughput_progress_{args.model}" + (f"_{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    cpu = report["cpu"]
    lines = [f"# Training throughput with the progress display off, as lines, as a bar: "
             f"{args.model} at {args.image_size}², batch {args.batch_size}, {report['device']}",
             "", f"run_train, {args.epochs} timed epochs × {args.steps} steps after a warm-up "
             f"epoch; the three modes interleaved, {args.repeats} repeat(s). Modes: "
             + "; ".join(f"{k}: {v}" for k, v in report["modes"].items()) + ".", "",
             "| policy | XLA | progress | img/s (median) | per repeat | range over epochs "
             "| × off | step ms |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | {r['progress']} "
                         f"| {r['error']} | | | | |")
            continue
        lo, hi = r["range_images_per_sec"]
        ratio = f"{r['ratio_vs_off']:.3f}" if r.get("ratio_vs_off") else "–"
        per_repeat = ", ".join(f"{x:.0f}" for x in r["repeat_images_per_sec"] if x)
        lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | {r['progress']} | "
                     f"{r['images_per_sec']:.1f} | {per_repeat} | {lo:.1f}–{hi:.1f} | {ratio} "
                     f"| {r['step_ms']:.1f} |")
    step_ms = next((r["step_ms"] for r in rows if r.get("progress") == "off" and
                    r.get("step_ms")), None)
    redraw = update_us["one bar display"]
    lines += ["", "Host cost of the display, timed alone: per training step (`Progress.update` "
              "with the loop's values callable, 200,000 calls) " + ", ".join(
                  f"{mode} {us:.2f} µs" for mode, us in update_us.items()
                  if not mode.startswith("one "))
              + f"; one bar redraw {redraw:.0f} µs (at most 1 per "
              "0.1 s: at most "
              f"{redraw / 1000:.2f} % of the wall time), one plain line "
              f"{update_us['one lines display']:.0f} µs (1 per --progress-every-s)"
              + (f"; a step here takes {step_ms:.1f} ms, so the per-step part is "
                 f"{update_us['bar'] / (10 * step_ms):.4f} % of it" if step_ms else "") + "."]
    lines += ["", f"CPU: {cpu['model_name']}, {os.cpu_count()} cores; SIMD flags: "
              f"{' '.join(report['cpu_simd_flags']) or 'unknown'}; bf16 units: "
              f"{', '.join(cpu['bf16_units']) or 'none'}; oneDNN ISA: {cpu['onednn_isa']}."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


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

    from ampflow.components.train import TrainConfig, run_train
    from ampflow.data import load_dataset_info
    from ampflow.modeling.models import build_model

    _set_threads(args)
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
    forward, flops_per_image = _model_flops(model)
    keras.backend.clear_session()
    return {"images_per_sec": ips, "epoch_images_per_sec": timed, "batch_size": args.batch_size,
            "step_ms": 1000 * args.batch_size / ips,
            "gflops": ips * flops_per_image / 1e9,
            "train_gflop_per_image": flops_per_image / 1e9,
            "forward_gflop_per_image": forward / 1e9,
            "xla_reason": meta["xla"]["reason"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _model_flops(model) -> tuple[float, float]:
    """(forward, training) FLOPs per image: 2 per multiply-add of the conv/dense layers.

    Training = forward + the weight gradient (as many multiply-adds as the forward) + the input
    gradient (as many again) for every layer but the first, whose input (the preprocessed
    image) needs no gradient. Normalization, activations, pooling and the optimizer are not
    counted (memory-bound, and not what the peak measures).
    """
    forward = training = 0.0
    for index, flops in enumerate(_layer_flops(model)):
        forward += flops
        training += flops * (2 if index == 0 else 3)
    return forward, training


def _layer_flops(model):
    """Forward FLOPs of each Conv2D, DepthwiseConv2D and Dense layer, in model order."""
    import keras

    for layer in _all_layers(model):
        if isinstance(layer, keras.layers.DepthwiseConv2D):
            kh, kw = layer.kernel_size
            _, h, w, c = layer.output.shape
            yield 2 * kh * kw * h * w * c
        elif isinstance(layer, keras.layers.Conv2D):
            kh, kw = layer.kernel_size
            _, h, w, cout = layer.output.shape
            yield 2 * kh * kw * layer.input.shape[-1] * h * w * cout
        elif isinstance(layer, keras.layers.Dense):
            yield 2 * layer.input.shape[-1] * layer.units


def _all_layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)
        else:
            yield layer


_PEAK_PROBE = """
import json, os, sys, time
os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
import tensorflow as tf

def rate(fn, args, flops, seconds=1.5):
    fn(*args).numpy()
    reps, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        r = fn(*args); reps += 1
    r.numpy()
    return flops * reps / (time.perf_counter() - t) / 1e9

out = {"conv": {}, "matmul": {}}
n, (b, h, w, c) = 2048, (32, 56, 56, 128)
for name in sys.argv[1:]:
    a = tf.cast(tf.random.normal((n, n)), name)
    out["matmul"][name] = rate(tf.function(lambda a: tf.matmul(a, a)), (a,), 2 * n ** 3)
    x = tf.cast(tf.random.normal((b, h, w, c)), name)
    k = tf.cast(tf.random.normal((3, 3, c, c)) * 0.05, name)
    conv = tf.function(lambda x, k: tf.nn.conv2d(x, k, 1, "SAME"))
    out["conv"][name] = rate(conv, (x, k), 2 * 9 * b * h * w * c * c)
print(json.dumps(out))
"""


def _peak_probe(dtypes=("float32", "bfloat16", "float16")) -> dict:
    """Measured conv and matmul GFLOP/s per dtype on this device: the roofline for the ratios.

    The conv is a 3×3, 32×56×56×128→128 forward conv (a ResNet stage-2 shape; 2 FLOPs per
    multiply-add, as the model count). {} when the probe fails.
    """
    done = subprocess.run([sys.executable, "-c", _PEAK_PROBE, *dtypes], capture_output=True,
                          text=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}


def _bf16_goal(report: dict) -> dict:
    """Whether mixed_bfloat16 without XLA meets issue 13's goal, or why it cannot apply here."""
    row = next((r for r in report["rows"]
                if r["policy"] == "mixed_bfloat16" and not r["xla"] and "error" not in r), None)
    goal = dict(BF16_GOAL)
    if row is None:
        return {**goal, "status": "not measured"}
    measured = {"ratio_vs_float32": row.get("ratio_vs_float32"),
                "fraction_of_conv_peak": row.get("fraction_of_conv_peak")}
    if report["device"].startswith("CPU") and not report["cpu"]["bf16_hardware"]:
        status = ("not applicable: this CPU has no AVX512_BF16/AMX, so bfloat16 runs emulated "
                  f"(oneDNN ISA: {report['cpu']['onednn_isa']})")
    elif None in measured.values():
        status = "not measured"
    else:
        met = all(measured[k] >= v for k, v in BF16_GOAL.items())
        status = "met" if met else "not met"
    return {**goal, "measured": measured, "status": status}


def _profile(args) -> int:
    """`--profile`: step_profile.py for this model, batch and policies (its own report)."""
    import step_profile

    argv = ["--model", args.model, "--image-size", str(args.image_size),
            "--batch-size", str(args.batch_size), "--profile-steps", str(args.profile_steps),
            "--out", args.out, "--tag", args.tag]
    if args.policies != list(POLICIES):  # else step_profile's default: float16 where native
        argv += ["--policies", *args.policies]
    return step_profile.main(argv + (["--data-dir", args.data_dir] if args.data_dir else []))


def _print_row(row: dict) -> None:
    if "error" in row:
        print(f"{row['policy']:>15} xla={row['xla']!s:<5}  {row['error']}", flush=True)
    else:
        epochs = ", ".join(f"{x:.1f}" for x in row["epoch_images_per_sec"])
        print(f"{row['policy']:>15} xla={row['xla']!s:<5}  {row['images_per_sec']:8.1f} img/s "
              f"(epochs: {epochs})  {row['peak_rss_mib']:7.0f} MiB", flush=True)


def _pct(value) -> str:
    return f"{value:.0%}" if value else "–"


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_throughput_{report['model']}" + (f"_{report['tag']}" if report["tag"] else "")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    ok = [r for r in report["rows"] if "error" not in r]
    gflop = ok[0]["train_gflop_per_image"] if ok else None
    lines = [f"# Training throughput: {report['model']} at {report['image_size']}², "
             f"batch {report['batch_size']}, {report['device']}", "",
             f"Loop: {report['loop']}, optimizer {report['optimizer']}, threads "
             f"{report['threads']}; {report['timed_epochs']} timed epochs × "
             f"{report['steps_per_epoch']} steps after a warm-up epoch, {report['repeats']} "
             f"interleaved sweep(s). "
             + (f"{gflop:.2f} GFLOP per training image ({report['flops_counting']})."
                if gflop else ""), "",
             "| policy | XLA | img/s (median) | range over epochs | × float32 | step ms | GFLOP/s "
             "| of conv peak | of matmul peak | peak RSS MiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        if "error" in r:
            lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | {r['error']} "
                         "| | | | | | | |")
            continue
        ratio = f"{r['ratio_vs_float32']:.2f}" if r.get("ratio_vs_float32") else "–"
        lo, hi = r["range_images_per_sec"]
        lines.append(f"| {r['policy']} | {'on' if r['xla'] else 'off'} | "
                     f"{r['images_per_sec']:.1f} | {lo:.1f}–{hi:.1f} | {ratio} | "
                     f"{r['step_ms']:.0f} | {r['gflops']:.0f} | "
                     f"{_pct(r.get('fraction_of_conv_peak'))} | "
                     f"{_pct(r.get('fraction_of_matmul_peak'))} | {r['peak_rss_mib']:.0f} |")
    cpu = report["cpu"]
    after = report["peak_gflops_after"]
    peaks = "; ".join(f"{kind} " + ", ".join(
        f"{dtype} {value:.0f} / {after.get(kind, {}).get(dtype, 0):.0f}"
        for dtype, value in report["peak_gflops"].get(kind, {}).items())
        for kind in ("conv", "matmul"))
    lines += ["", f"Peaks measured in the same run, before / after the sweep (GFLOP/s): {peaks} "
              f"({report['peak_note']}).",
              "", f"CPU: {cpu['model_name']}; bf16 units: "
              f"{', '.join(cpu['bf16_units']) or 'none'}; oneDNN ISA: {cpu['onednn_isa']}.",
              "", f"bf16 goal (≥ {BF16_GOAL['ratio_vs_float32']}× float32 and ≥ "
              f"{BF16_GOAL['fraction_of_conv_peak']:.0%} of the bf16 conv peak): "
              f"{report['bf16_goal']['status']}."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
