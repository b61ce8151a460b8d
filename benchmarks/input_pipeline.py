"""Is the input pipeline fast enough for real images? tf.data alone vs the training step.

Makes a folder of JPEGs of realistic sizes (each side 300-500 px, drawn per image; a few
classes; smooth random pictures with grain so that they compress like photos; seeded), prepares
it with `ampflow prepare-data --image-folder ... --image-size S`, then measures, in one process,
interleaved over `--repeats` sweeps:

- **the tf.data pipeline alone** (`load_split` + `make_input_pipeline`, training's own: decode,
  resize, augment, batch, prefetch) in images/s, in the variants that matter:
    - `decode each epoch`: no cache, every image decoded and resized again (the first epoch,
      and every epoch of a dataset too large for memory);
    - `cached`: the decoded, resized images cached in memory (what training does when they fit),
      augmentation still run every epoch; the rate after the cache is filled;
    - `cached, no augment`: the same without the random crop + flip (what augmenting costs);
    - `decode each epoch, 1 thread`: tf.data limited to one thread (what one core delivers);
- **the training step alone** (`TrainLoop`'s step on one fixed batch in memory) for ResNet-50
  and MobileNetV2 at the same image size (the models' own input size set to it too), in
  images/s;
- **the training step fed by the pipeline** (decode each epoch, augment: the worst case the
  pipeline can be) with the share of time the loop waited on the iterator, which is what the
  trainer's per-epoch log reports (`input wait`, components/train/run/loop.py).

It prints the ratios pipeline/step (the goal: >= 2x for ResNet-50) and fed/alone, and writes
JSON + Markdown to benchmarks/results/ with the host's CPU flags. The machine may be shared:
timings are noisy, which is why everything is interleaved and reported as medians with ranges.

    .venv/bin/python benchmarks/input_pipeline.py              # ~5 min on 2 busy cores
    .venv/bin/python benchmarks/input_pipeline.py --smoke      # seconds: the plumbing only
    .venv/bin/python benchmarks/input_pipeline.py --augment-ab # ~2 min

`--augment-ab` measures one change side by side: augmentation enlarging its crop back with
images.py's antialiased resize (before) vs the plain bilinear one (`resize_crop_back`, now; the
same pixels within 0.005), the pipeline cached and decoding every epoch, in alternating rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = ("resnet50", "mobilenet_v2")
VARIANTS = ("decode each epoch", "cached", "cached, no augment", "decode each epoch, 1 thread")


def main() -> int:
    args = _parse()
    began = time.monotonic()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ampflow-input-bench-"))
    folder = work / "images"
    if not folder.exists():
        make_image_folder(folder, args.images, args.classes, args.seed)
    data_dir = work / "prepared"
    if not (data_dir / "dataset_info.json").exists():
        _prepare(folder, data_dir, args.image_size)
    info = json.loads((data_dir / "dataset_info.json").read_text())
    if args.augment_ab:
        _write_ab(_augment_ab(str(data_dir), args), Path(args.out), args)
        return 0

    steps = {m: _StepBench(m, info, args) for m in args.models}
    samples: dict[str, list[float]] = {}
    waits: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for variant in VARIANTS:
            ips = _time_pipeline(str(data_dir), variant, args)
            samples.setdefault(f"pipeline: {variant}", []).append(ips)
            print(f"sweep {repeat + 1}: pipeline, {variant}: {ips:.1f} img/s", flush=True)
        for model, bench in steps.items():
            ips = bench.alone()
            samples.setdefault(f"step: {model}", []).append(ips)
            fed, wait = bench.fed(str(data_dir))
            samples.setdefault(f"step fed by pipeline: {model}", []).append(fed)
            waits.setdefault(model, []).append(wait)
            print(f"sweep {repeat + 1}: {model}: step {ips:.1f} img/s, fed {fed:.1f} img/s "
                  f"(input wait {wait:.0%})", flush=True)

    report = {"benchmark": "input_pipeline", "args": vars(args),
              "dataset": {k: info.get(k) for k in ("image_shape", "num_classes", "splits",
                                                     "source_image_shape")},
              "jpeg_bytes_median": _median_file_size(folder),
              "rows": {name: _summary(values) for name, values in samples.items()},
              "input_wait_fraction": {m: _summary(v) for m, v in waits.items()},
              "ratios": _ratios(samples, args.models),
              "host": _host(), "wall_seconds": time.monotonic() - began}
    _write(report, Path(args.out), args)
    for line in _ratio_lines(report["ratios"]):
        print(line)
    return 0


def make_image_folder(root: Path, count: int, classes: int, seed: int) -> None:
    """`count` JPEGs in `classes` class folders, each side 300-500 px, seeded.

    A picture is a smooth colour field (a coarse random grid upsampled) with fine grain on top:
    it compresses to the size of a photo at quality 90 (tens of KB), unlike flat colour (tiny)
    or pure noise (huge), so decoding costs what a real photo's does.
    """
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(count):
        label = i % classes
        height, width = (int(s) for s in rng.integers(300, 501, size=2))
        coarse = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC),
                           dtype=np.int16)
        grain = rng.normal(0, 12, size=(height, width, 3))
        pixels = np.clip(field + grain, 0, 255).astype(np.uint8)
        target = root / f"class_{label}"
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(target / f"img_{i:05d}.jpg", quality=90)


def _prepare(folder: Path, data_dir: Path, image_size: int) -> None:
    cli = Path(sys.executable).with_name("ampflow")
    subprocess.run([str(cli), "prepare-data", "--image-folder", str(folder), "--output-dir",
                    str(data_dir), "--image-size", str(image_size)], check=True)


def _pipeline(data_dir: str, variant: str, batch_size: int):
    """Training's own pipeline (augment on, repeated), in one of VARIANTS."""
    import tensorflow as tf

    from ampflow.data import load_split, make_input_pipeline

    ds = make_input_pipeline(load_split(data_dir, "train"), batch_size=batch_size,
                             training=True, seed=0, augment=not variant.endswith("no augment"),
                             cache=variant.startswith("cached")).repeat()
    if variant.endswith("1 thread"):
        options = tf.data.Options()
        options.threading.private_threadpool_size = 1
        ds = ds.with_options(options)
    return ds


def _time_pipeline(data_dir: str, variant: str, args) -> float:
    """Images/s of the pipeline alone, after a warm-up (after one filled epoch when cached)."""
    import json as _json

    info = _json.loads((Path(data_dir) / "dataset_info.json").read_text())
    per_epoch = max(1, info["splits"]["train"] // args.batch_size)
    iterator = iter(_pipeline(data_dir, variant, args.batch_size))
    for _ in range(per_epoch if variant.startswith("cached") else 2):
        next(iterator)
    began = time.perf_counter()
    for _ in range(args.pipeline_batches):
        next(iterator)
    return args.pipeline_batches * args.batch_size / (time.perf_counter() - began)


class _StepBench:
    """One model's training step (ampflow's TrainLoop), built once, timed on demand."""

    def __init__(self, model_name: str, info: dict, args):
        import keras
        import tensorflow as tf

        from ampflow.components.train.run.loop import LoopConfig, Runtime, TrainLoop
        from ampflow.modeling.models import build_model

        keras.mixed_precision.set_global_policy(args.policy)
        keras.utils.set_random_seed(args.seed)
        shape = tuple(int(d) for d in info["image_shape"])
        self.model = build_model(model_name, shape, int(info["num_classes"]),
                                 image_size=args.image_size, policy=args.policy)
        self.model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                           loss="sparse_categorical_crossentropy")
        runtime = Runtime(tf.distribute.get_strategy(), "default", "input pipeline benchmark")
        self.loop = TrainLoop(runtime, self.model, LoopConfig(
            epochs=1, steps_per_epoch=args.steps, global_batch_size=args.batch_size,
            jit_compile=False, loss_scaling=False, state_dir="", progress=False))
        images = tf.random.uniform((args.batch_size, *shape), 0.0, 255.0, seed=args.seed)
        labels = tf.random.uniform((args.batch_size,), 0, int(info["num_classes"]), tf.int64,
                                   seed=args.seed)
        self.fixed = iter(tf.data.Dataset.from_tensors((images, labels)).repeat())
        self.args = args
        self.loop.run_steps(self.fixed, 2)  # trace and warm up (the 2nd step still sets up)

    def alone(self) -> float:
        """Images/s of the step on a batch already in memory."""
        began = time.perf_counter()
        self.loop.run_steps(self.fixed, self.args.steps)
        return self.args.steps * self.args.batch_size / (time.perf_counter() - began)

    def fed(self, data_dir: str) -> tuple[float, float]:
        """(images/s, share of the time waiting on the iterator) fed by the real pipeline."""
        iterator = iter(_pipeline(data_dir, "decode each epoch", self.args.batch_size))
        self.loop.run_steps(iterator, 1)  # the pipeline's start-up is not the steady state
        waited = self.loop.input_wait_seconds
        began = time.perf_counter()
        self.loop.run_steps(iterator, self.args.steps)
        seconds = time.perf_counter() - began
        return (self.args.steps * self.args.batch_size / seconds,
                (self.loop.input_wait_seconds - waited) / seconds)


def _augment_ab(data_dir: str, args) -> dict:
    """Augmentation's resize before (antialiased, images.py) and now, in alternating rounds."""
    from ampflow.data import input_pipeline
    from ampflow.data.images import to_model_input

    now = input_pipeline.resize_crop_back
    resizes = {"antialiased (before)": lambda crop, shape: to_model_input(crop, shape),
               "plain bilinear (now)": now}
    samples: dict[str, list[float]] = {}
    try:
        for round_ in range(args.repeats + 1):
            order = list(resizes) if round_ % 2 == 0 else list(reversed(resizes))
            for variant in ("cached", "decode each epoch"):
                for name in order:
                    input_pipeline.resize_crop_back = resizes[name]
                    samples.setdefault(f"{variant}, {name}", []).append(
                        _time_pipeline(data_dir, variant, args))
    finally:
        input_pipeline.resize_crop_back = now
    ratios = {variant: _summary([n / b for n, b in zip(
        samples[f"{variant}, plain bilinear (now)"], samples[f"{variant}, antialiased (before)"],
        strict=True)]) for variant in ("cached", "decode each epoch")}
    return {"benchmark": "input_pipeline_augment_ab", "args": vars(args),
            "rows": {k: _summary(v) for k, v in samples.items()}, "ratios_now_over_before": ratios,
            "host": _host()}


def _write_ab(report: dict, out: Path, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"input_pipeline_augment_ab{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    host = report["host"]
    lines = [f"# Augmentation's resize, before vs now: {args.image_size}² JPEG folder, batch "
             f"{args.batch_size}", "",
             f"The training pipeline (augment on) alone, {args.repeats + 1} alternating rounds; "
             f"{host['cores']} cores shared with other jobs (load average "
             f"{host['load_average'][0]:.1f}). Host: {host['cpu'].get('model_name', '')}; CPU "
             f"flags: {' '.join(host['cpu']['flags'])}.", "",
             "| pipeline | img/s (median) | range |", "|---|---:|---:|"]
    lines += [f"| {k} | {r['median']:.0f} | {r['min']:.0f}–{r['max']:.0f} |"
              for k, r in report["rows"].items()]
    lines += ["", "| now / before | median | per round |", "|---|---:|---|"]
    lines += [f"| {k} | {r['median']:.2f}× | {', '.join(f'{v:.2f}' for v in r['samples'])} |"
              for k, r in report["ratios_now_over_before"].items()]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "samples": values}


def _ratios(samples: dict[str, list[float]], models) -> dict[str, dict]:
    """Per-sweep ratios (side by side in the same sweep), summarized."""
    ratios = {}
    for model in models:
        step = samples[f"step: {model}"]
        for variant in VARIANTS:
            pipe = samples[f"pipeline: {variant}"]
            ratios[f"pipeline ({variant}) / {model} step"] = _summary(
                [p / s for p, s in zip(pipe, step, strict=True)])
        fed = samples[f"step fed by pipeline: {model}"]
        ratios[f"{model} fed by pipeline / step alone"] = _summary(
            [f / s for f, s in zip(fed, step, strict=True)])
    return ratios


def _ratio_lines(ratios: dict[str, dict]) -> list[str]:
    return [f"{name}: {r['median']:.2f}x (per sweep: "
            f"{', '.join(f'{v:.2f}' for v in r['samples'])})" for name, r in ratios.items()]


def _median_file_size(folder: Path) -> int:
    return int(statistics.median(p.stat().st_size for p in folder.rglob("*.jpg")))


def _host() -> dict:
    from importlib.metadata import version

    from train_memory import _cpu_flags
    from train_throughput import _cpu_capabilities

    return {"cpu": {**_cpu_capabilities(), "flags": _cpu_flags()}, "cores": os.cpu_count(),
            "load_average": os.getloadavg(),
            "versions": {n: version(n) for n in ("tensorflow", "keras")}}


def _write(report: dict, out: Path, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"input_pipeline{'_smoke' if args.smoke else ''}{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    host = report["host"]
    shape = report["dataset"]["image_shape"]
    lines = [
        f"# Input pipeline vs training step: JPEG folder at {shape[0]}×{shape[1]}, "
        f"batch {args.batch_size}, {args.policy}",
        "",
        f"{args.images} JPEGs (each side 300–500 px, median {report['jpeg_bytes_median']:,} "
        f"bytes, {args.classes} classes), prepared with `ampflow prepare-data --image-folder`; "
        f"{args.repeats} interleaved sweep(s); {host['cores']} cores shared with other jobs "
        f"(load average at the end {host['load_average'][0]:.1f}): noisy, compare ratios.",
        f"Host: {host['cpu'].get('model_name', '')}; CPU flags: {' '.join(host['cpu']['flags'])}.",
        "",
        "| measured | img/s (median) | range |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {r['median']:.1f} | {r['min']:.1f}–{r['max']:.1f} |"
              for name, r in report["rows"].items()]
    lines += ["", "| ratio (per sweep, side by side) | median | per sweep |", "|---|---:|---|"]
    lines += [f"| {name} | {r['median']:.2f}× | {', '.join(f'{v:.2f}' for v in r['samples'])} |"
              for name, r in report["ratios"].items()]
    lines += ["", "Input wait (share of the fed step's time spent waiting on the iterator): "
              + ", ".join(f"{m} {r['median']:.0%}"
                          for m, r in report["input_wait_fraction"].items()), ""]
    stem.with_suffix(".md").write_text("\n".join(lines))


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help="timed training steps per sample")
    p.add_argument("--pipeline-batches", type=int, default=12, help="timed pipeline batches")
    p.add_argument("--repeats", type=int, default=3, help="interleaved sweeps")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--policy", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="reuse a folder made by an earlier run")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--tag", default="", help="suffix of the result files")
    p.add_argument("--augment-ab", action="store_true",
                   help="augmentation's resize before vs now, side by side (pipeline only)")
    p.add_argument("--smoke", action="store_true", help="tiny: 48 images at 64 px, 1 sweep")
    args = p.parse_args()
    if args.smoke:
        args.images, args.image_size, args.repeats = 48, 64, 1
        args.batch_size, args.steps, args.pipeline_batches = 8, 1, 2
    return args


if __name__ == "__main__":
    sys.exit(main())
