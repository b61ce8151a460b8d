r"""AMP's two promises side by side: training speed and peak training memory, per policy.

For a user's model (written below as a user writes one: a functional model with a custom layer
holding its own weights, LayerNormalization and Dropout, built through ampflow's `--model
module:function` path, so it gets ampflow's float32 head) and for ResNet-50 at 64², each policy
(float32, mixed_bfloat16, mixed_float16) trains in a fresh subprocess, so no peak carries over
from another configuration, and the whole sweep is repeated interleaved (`--repeats`), so slow
drift of a shared machine hits every configuration alike. XLA follows train's rule
(precision.choose_jit): on a CPU off for float32/mixed_bfloat16 and on for mixed_float16, whose
float16 kernels are ~80× slower without it; on a GPU on for all.

Each worker runs ampflow's own train step (`TrainLoop`, the default strategy) on a fixed random
batch (pixels 0..255, random labels: the same compute as real data, without an input pipeline
to confound the timing), inside one `PeakMemory` region from before the model is built to the
last timed step: warm-up steps (tracing, XLA compilation) excluded from the timing, then
`--chunks` × `--steps` timed steps. Reported per configuration: images/s (median of the chunks
and repeats, and their range), its ratio to float32, and two peaks with their ratio to float32:

- the TF allocator's peak (`get_memory_info(...)["peak"]`: on a GPU its memory, on a CPU every
  tensor TF allocates): what AMP can shrink, and what a GPU's capacity bounds;
- the process's resident peak (VmHWM, reset at the region's start): what a container's memory
  limit counts. On a CPU it also holds the TF runtime, oneDNN's caches and XLA's compiled code,
  none of which AMP shrinks.

The float32 master weights and optimizer slots stay float32 under every policy (4 bytes of
weight + 8 of Adam slots per parameter, printed as "fixed"); only activations (and their
gradients) drop to 2 bytes, so the saving shows where activations dominate: large batches and
feature maps, small models.

    python benchmarks/train_memory.py --out benchmarks/results
    python benchmarks/train_memory.py --models user --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402  (the user's model below is written as a user writes one)
from keras import layers, ops  # noqa: E402

HERE = Path(__file__).resolve().parent
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
USER_MODEL = "train_memory:build_user_model"  # imported from this folder (--model-path)
# model -> (ampflow --model spec, image size inside the model, default batch)
MODELS = {"user": (USER_MODEL, None, 64), "resnet50": ("resnet50", 64, 32)}
INPUT_SHAPE = (64, 64, 3)
NUM_CLASSES = 10


# ---- the user's model, as a user writes it --------------------------------------------------

class ChannelScale(layers.Layer):
    """A learned per-channel scale: a custom layer holding its own weights.

    It computes in the layer's dtype (`ops.cast(self.gamma, x.dtype)`), so it stays in the
    mixed-precision chain.
    """

    def build(self, input_shape):
        self.gamma = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gamma")

    def call(self, x):
        return x * ops.cast(self.gamma, x.dtype)


def build_user_model(input_shape, num_classes):
    """A user's conv net: a custom layer with its own weights, LayerNormalization, Dropout."""
    inputs = keras.Input(shape=input_shape)
    x = layers.Rescaling(1 / 255.0)(inputs)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = ChannelScale()(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(128, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.LayerNormalization()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(128, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(num_classes, activation="softmax")(x))


# ---- the sweep -------------------------------------------------------------------------------

def main() -> int:
    args = _parse()
    if args.worker:
        print(json.dumps(_worker(args)))
        return 0
    sys.path.insert(0, str(HERE))
    from train_throughput import _cpu_capabilities, _device

    began = time.monotonic()
    configs, skipped = _configs(args)
    runs: dict[tuple[str, str, bool], list[dict]] = {}
    for repeat in range(args.repeats):  # whole sweeps interleaved
        for model, policy, jit in configs:
            row = _run_config(args, model, policy, jit)
            runs.setdefault((model, policy, jit), []).append(row)
            _print_row(row, repeat)
    rows = [_merge(r) for r in runs.values()] + skipped
    for model in args.models:
        base = next((r for r in rows if r["model"] == model and r["policy"] == "float32"
                     and not r.get("xla") and "images_per_sec" in r), None)
        for row in (r for r in rows if r["model"] == model and "images_per_sec" in r):
            row["speedup_vs_float32"] = _ratio(row["images_per_sec"], base, "images_per_sec")
            row["allocator_peak_ratio_vs_float32"] = _ratio(
                row["allocator_peak_bytes"], base, "allocator_peak_bytes")
            row["process_peak_ratio_vs_float32"] = _ratio(
                row["process_region_bytes"], base, "process_region_bytes")
    report = {"rows": rows, "repeats": args.repeats, "steps": args.steps, "chunks": args.chunks,
              "warmup_steps": args.warmup, "input_shape": list(INPUT_SHAPE),
              "num_classes": NUM_CLASSES, "optimizer": "adam (LossScaleOptimizer for float16)",
              "data": "one fixed random batch (pixels 0..255, random labels)",
              "loop": "ampflow TrainLoop (train's step), default strategy",
              "cpu": {**_cpu_capabilities(), "flags": _cpu_flags()}, "device": _device(),
              "cores": os.cpu_count(), "load_average": os.getloadavg(), "tag": args.tag,
              "wall_seconds": time.monotonic() - began,
              "versions": _versions()}
    _write(report, Path(args.out))
    return 0


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--policies", nargs="+", default=None, choices=POLICIES,
                   help="default: all three, but ResNet-50 under mixed_float16 only on a GPU "
                        "(on a CPU its XLA compilation alone took 197 s, then 4.2 img/s)")
    p.add_argument("--no-xla-reference", action="store_true",
                   help="leave out the float32+XLA row that is added where the sweep has a "
                        "policy that XLA compiles and float32 does not (XLA changes the peak)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="for every model (default: user 64, resnet50 32)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (tracing, XLA)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per chunk")
    p.add_argument("--chunks", type=int, default=3, help="timed chunks (the range)")
    p.add_argument("--repeats", type=int, default=1,
                   help="interleaved sweeps (1 keeps the default run within 5 min on 2 cores)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per configuration")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--tag", default="", help="suffix for the output files (e.g. the machine)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default="user", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--jit", choices=("rule", "on"), default="rule", help=argparse.SUPPRESS)
    return p.parse_args()


def _batch(args, model: str) -> int:
    return args.batch_size or MODELS[model][2]


def _configs(args) -> tuple[list[tuple[str, str, bool]], list[dict]]:
    """(model, policy, forced XLA) to run, in sweep order; rows for what is skipped and why."""
    from ampflow.components.train.precision.policy import choose_jit, detect_hardware

    hardware = detect_hardware()
    configs, skipped = [], []
    for model in args.models:
        policies = args.policies or list(POLICIES)
        if args.policies is None and model == "resnet50" and not hardware.gpus:
            policies.remove("mixed_float16")
            skipped.append({"model": model, "policy": "mixed_float16", "xla": True,
                            "batch_size": _batch(args, model), "skipped": (
                                "a GPU policy: on this CPU (no float16 units) XLA compiled its "
                                "train step for 197 s, then it ran at 4.2 img/s (measured "
                                "2026-12-03); pass --policies to run it")})
        configs += [(model, policy, False) for policy in policies]
        xla_only = [p for p in policies if choose_jit(None, hardware, p)[0]
                    and not choose_jit(None, hardware, "float32")[0]]
        if xla_only and "float32" in policies and not args.no_xla_reference:
            configs.append((model, "float32", True))
    return configs, skipped


def _run_config(args, model: str, policy: str, force_jit: bool) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--policy", policy,
           "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--chunks", str(args.chunks), "--jit", "on" if force_jit else "rule"]
    cmd += ["--batch-size", str(args.batch_size)] if args.batch_size else []
    row = {"model": model, "policy": policy, "batch_size": _batch(args, model)}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {args.timeout:.0f} s"}
    if done.returncode != 0:
        return {**row, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def _worker(args) -> dict:
    """One (model, policy): build, warm up, time; all inside one PeakMemory region."""
    import keras
    import tensorflow as tf

    from ampflow.components.train.precision.policy import choose_jit, detect_hardware
    from ampflow.components.train.run.loop import LoopConfig, Runtime, TrainLoop
    from ampflow.components.train.run.memory import PeakMemory
    from ampflow.modeling.models import build_model

    spec, image_size, _ = MODELS[args.model]
    batch = _batch(args, args.model)
    jit, jit_reason = choose_jit(True if args.jit == "on" else None, detect_hardware(),
                                 args.policy)
    keras.mixed_precision.set_global_policy(args.policy)
    keras.utils.set_random_seed(0)
    images = tf.random.uniform((batch, *INPUT_SHAPE), 0.0, 255.0, seed=0)
    labels = tf.random.uniform((batch,), 0, NUM_CLASSES, tf.int64, seed=0)
    data = iter(tf.data.Dataset.from_tensors((images, labels)).repeat())
    chunks = []
    with PeakMemory() as region:
        model = build_model(spec, INPUT_SHAPE, NUM_CLASSES, image_size=image_size,
                            model_path=str(HERE))
        optimizer = keras.optimizers.Adam(1e-3)
        if args.policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                      jit_compile=jit)
        loop = TrainLoop(Runtime(tf.distribute.get_strategy(), "default", "benchmark"), model,
                         LoopConfig(epochs=1, steps_per_epoch=args.steps, global_batch_size=batch,
                                    jit_compile=jit, loss_scaling=args.policy == "mixed_float16",
                                    state_dir=""))
        began = time.perf_counter()
        loop.run_steps(data, args.warmup)
        warmup_s = time.perf_counter() - began
        for _ in range(args.chunks):
            began = time.perf_counter()
            loop.run_steps(data, args.steps)
            chunks.append(args.steps * batch / (time.perf_counter() - began))
    peak = region.result
    params = int(sum(int(tf.size(w)) for w in model.trainable_weights))
    return {"images_per_sec": statistics.median(chunks), "chunk_images_per_sec": chunks,
            "warmup_s": warmup_s, "xla": jit, "xla_reason": jit_reason,
            "allocator_peak_bytes": peak.peak_bytes,
            "allocator_baseline_bytes": peak.baseline_bytes, "allocator_source": peak.source,
            "process_peak_bytes": peak.process_peak_bytes,
            "process_region_bytes": (peak.process_peak_bytes or 0)
            - (peak.process_baseline_bytes or 0),
            "process_source": peak.process_source, "memory": peak.to_json(),
            "trainable_params": params, "fixed_state_bytes": 12 * params}


def _merge(runs: list[dict]) -> dict:
    """One row per configuration: medians over the repeats, ranges over every chunk."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    row = dict(ok[len(ok) // 2])
    chunks = [x for r in ok for x in r["chunk_images_per_sec"]]
    row["images_per_sec"] = statistics.median(r["images_per_sec"] for r in ok)
    row["range_images_per_sec"] = [min(chunks), max(chunks)]
    for key in ("allocator_peak_bytes", "process_region_bytes", "process_peak_bytes"):
        values = [r[key] for r in ok]
        row[key] = statistics.median(values)
        row[f"range_{key}"] = [min(values), max(values)]
    row["repeats"] = len(ok)
    row["errors"] = [r["error"] for r in runs if "error" in r]
    return row


def _ratio(value, base: dict | None, key: str):
    return value / base[key] if base and base.get(key) and value is not None else None


def _cpu_flags() -> list[str]:
    """The CPU's vector and matrix flags (what bf16/fp16 speed depends on)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(f for f in line.split(":", 1)[1].split()
                              if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
    except OSError:
        pass
    return []


def _versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in ("tensorflow", "keras")}


def _mib(value) -> str:
    return f"{value / 2**20:,.0f}" if value is not None else "–"


def _x(value) -> str:
    return f"{value:.2f}×" if value else "–"


def _label(row: dict) -> str:
    return row["policy"] + (" (XLA)" if row.get("xla") else "")


def _print_row(row: dict, repeat: int) -> None:
    head = f"[{repeat + 1}] {row['model']:>8} {_label(row):>21}"
    if "error" in row:
        print(f"{head}  {row['error']}", flush=True)
        return
    print(f"{head}  {row['images_per_sec']:7.1f} img/s  allocator peak "
          f"{_mib(row['allocator_peak_bytes'])} MiB  process +{_mib(row['process_region_bytes'])}"
          f" MiB  (warm-up {row['warmup_s']:.0f} s)", flush=True)


def _summary(rows: list[dict]) -> list[str]:
    """One line per measured AMP row: speed and memory against float32 (same XLA too)."""
    out = []
    for r in rows:
        if r["policy"] == "float32" or "images_per_sec" not in r:
            continue
        line = (f"- {r['model']}, {_label(r)}: {_x(r['speedup_vs_float32'])} the speed of "
                f"float32, {_x(r['allocator_peak_ratio_vs_float32'])} its TF allocator peak, "
                f"{_x(r['process_peak_ratio_vs_float32'])} its process RSS growth")
        same = next((b for b in rows if b["model"] == r["model"] and b["policy"] == "float32"
                     and b.get("xla") and "images_per_sec" in b), None) if r.get("xla") else None
        if same:
            line += (f"; against float32 with XLA too: "
                     f"{_x(r['images_per_sec'] / same['images_per_sec'])} the speed, "
                     f"{_x(r['allocator_peak_bytes'] / same['allocator_peak_bytes'])} the "
                     "allocator peak")
        out.append(line + ".")
    return out


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = "train_memory" + (f"_{report['tag']}" if report["tag"] else "")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    cpu = report["cpu"]
    lines = [f"# AMP's speed and memory, side by side: {report['device']}", "",
             f"{report['loop']}; {report['optimizer']}; {report['data']}; input "
             f"{'×'.join(map(str, report['input_shape']))}. Each configuration in a fresh "
             f"subprocess, {report['repeats']} interleaved sweep(s); {report['warmup_steps']} "
             f"warm-up steps, then {report['chunks']} × {report['steps']} timed steps. XLA as "
             "train's rule sets it. Memory: the peak of one region from before the model is "
             "built to the last step.", "",
             "| model | policy | batch | XLA | img/s (median) | range | speed × float32 "
             "| TF allocator peak MiB | × float32 | process RSS growth MiB | × float32 "
             "| fixed (fp32 weights + Adam) MiB |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        if "images_per_sec" not in r:
            why = r.get("error") or f"skipped: {r.get('skipped')}"
            lines.append(f"| {r['model']} | {r['policy']} | {r['batch_size']} | "
                         f"{'on' if r.get('xla') else ''} | {why} | | | | | | | |")
            continue
        lo, hi = r["range_images_per_sec"]
        lines.append(
            f"| {r['model']} | {r['policy']} | {r['batch_size']} | {'on' if r['xla'] else 'off'}"
            f" | {r['images_per_sec']:.1f} | {lo:.1f}–{hi:.1f} | {_x(r['speedup_vs_float32'])} "
            f"| {_mib(r['allocator_peak_bytes'])} | {_x(r['allocator_peak_ratio_vs_float32'])} "
            f"| {_mib(r['process_region_bytes'])} | {_x(r['process_peak_ratio_vs_float32'])} "
            f"| {_mib(r['fixed_state_bytes'])} |")
    lines += ["", *_summary(report["rows"])]
    lines += ["", f"Host: {cpu['model_name']}, {report['cores']} cores (load average "
              f"{', '.join(f'{x:.1f}' for x in report['load_average'])} at the end: a shared "
              "machine; the interleaving keeps ratios fair, absolute img/s are low); bf16 units: "
              f"{', '.join(cpu['bf16_units']) or 'none'}; fp16 units: "
              f"{', '.join(cpu['fp16_units']) or 'none'}; oneDNN ISA: {cpu['onednn_isa']}; "
              f"flags: {' '.join(cpu['flags'])}. TensorFlow {report['versions']['tensorflow']}, "
              f"Keras {report['versions']['keras']}. Wall time {report['wall_seconds']:.0f} s.",
              "", "How to read the memory columns: the TF allocator peak counts every tensor "
              "(weights, optimizer slots, activations, gradients, workspaces) — on a GPU it is "
              "the number its capacity bounds. The process's RSS growth over the same region "
              "also holds what TF allocates outside its allocator (oneDNN primitive caches, "
              "XLA's compiled code and buffers), which no policy shrinks. float32 master "
              "weights and Adam slots (the fixed column) stay under every policy; only "
              "activations and their gradients halve, so the saving is largest where they "
              "dominate (large batch × feature map, small model)."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
