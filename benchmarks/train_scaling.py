r"""Training loop throughput: 1 vs 2 workers, the loop vs Keras `fit`, telemetry on vs off.

All side by side in one run (JSON + Markdown).

Every configuration is a fresh subprocess on the same data (the offline digits), model, seed
and per-replica batch; `--repeats` interleaves the whole sweep again to show the noise. The
first epoch (tracing, XLA compilation) is warm-up; images/s is what `run_train` records (the
timed epochs' training steps, validation excluded), and it is GLOBAL (all workers' images).

1. Scaling: one worker pinned to one core (taskset + one TF thread) vs two workers on loopback
   (`ampflow train --workers 2 --cpus-per-worker 1`, MultiWorkerMirroredStrategy), the same
   per-replica batch (so the global batch doubles). Efficiency = 2-worker img/s / (2 × 1-worker).
   On a 2-core machine this is the most that can be shown: two single-core workers; the
   collectives go over loopback gRPC, not a network.
2. The loop vs `fit` (one process, all cores): today's `run_train` (the custom step) beside the
   `model.fit` path it replaced, rebuilt here with the same model, optimizer, input pipeline
   and callbacks (BackupAndRestore, loss-scale telemetry, epoch log, TensorBoard).
3. Telemetry (mixed_float16, where the loss scale exists): recorded every step vs never (only
   the per-epoch guard reads the device), in one process with the two settings alternating epoch
   by epoch, so that the machine's drift hits both alike; the paired median is reported, and the
   host cost of one recorded step timed alone (the part that does not drown in the noise).

    python benchmarks/train_scaling.py --out benchmarks/results            # small_cnn
    python benchmarks/train_scaling.py --model resnet50 --image-size 32 --steps 10
    python benchmarks/train_scaling.py --smoke                             # a quick check
    python benchmarks/train_scaling.py --loop-vs-fit-ci --pairs 20         # the 95 % interval

4. `--loop-vs-fit-ci`: the loop vs `fit` with a confidence interval. Separate processes and
   epoch medians (group 2) could not tell a 0.82x loss from noise (per sweep 1.20, 0.99, 0.55
   on this shared machine). Here both run in ONE process on twin models (same seed, model,
   policy, XLA, optimizer, batch, input pipeline, callbacks: loss-scale telemetry every step
   and the epoch log), in `--pairs` alternating chunks of one epoch of `--steps` steps (order
   ABBA, so that a drift hits both alike) after one warm-up chunk each. Each pair gives a ratio
   of the epoch logs' img/s; the report is their geometric mean with a 95 % t-interval over the
   pairs' log-ratios (the goal: >= 1.0x, the interval not below 0.95).
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

ALL_GROUPS = ("scaling", "loop_vs_fit", "telemetry")


def main() -> int:
    args = _parse()
    if args.fit_worker:
        print(json.dumps(_fit_path(args)))
        return 0
    if args.telemetry_worker:
        print(json.dumps(_telemetry_epochs(args)))
        return 0
    data_dir = _prepare(args)
    if args.loop_vs_fit_ci:
        _write_ci(_loop_vs_fit_paired(args, data_dir), Path(args.out))
        return 0
    groups = set(args.groups.split(","))
    unknown = groups - set(ALL_GROUPS)
    if unknown:
        raise SystemExit(f"--groups must be among {ALL_GROUPS}. Received: {sorted(unknown)}")
    configs = {k: v for k, v in _configs(args).items() if v["group"] in groups}
    runs: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        for name, spec in configs.items():
            row = _run(args, data_dir, name, spec)
            runs.setdefault(name, []).append(row)
            print(f"[{repeat + 1}/{args.repeats}] {name:>28}: "
                  + (f"{row['images_per_sec']:8.1f} img/s" if "images_per_sec" in row
                     else row["error"]), flush=True)
    rows = {name: _merge(name, configs[name], r) for name, r in runs.items()}
    paired = _paired_ratios(runs)
    telemetry = _telemetry_cost(args, data_dir) if "telemetry" in groups else {}
    report = {
        "model": args.model, "image_size": args.image_size, "per_replica_batch": args.batch_size,
        "steps_per_epoch": args.steps, "timed_epochs": args.epochs, "repeats": args.repeats,
        "warmup": "epoch 1 (tracing/compilation)", "cpus": os.cpu_count(),
        "note": ("2-core machine shared with other jobs; scaling = two single-core workers "
                 "over loopback; ratios measured side by side, interleaved"),
        "groups": [g for g in ALL_GROUPS if g in groups],
        "rows": list(rows.values()), "ratios": _ratios(rows), "per_sweep": paired,
        "telemetry": telemetry,
    }
    _write(report, Path(args.out))
    return 0


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32, help="per replica")
    p.add_argument("--steps", type=int, default=None, help="steps per epoch (default: all)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs after the warm-up one")
    p.add_argument("--repeats", type=int, default=2, help="interleaved sweeps")
    p.add_argument("--policy", default="float32", help="policy of the scaling and loop rows")
    p.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    p.add_argument("--smoke", action="store_true", help="1 timed epoch of 5 steps, 1 sweep")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--groups", default="scaling,loop_vs_fit,telemetry",
                   help="which measurements (comma-separated)")
    p.add_argument("--telemetry-epochs", type=int, default=16,
                   help="epochs of the telemetry on/off measurement (alternating)")
    p.add_argument("--loop-vs-fit-ci", action="store_true",
                   help="the loop vs fit in one process, alternating, with a 95 %% interval")
    p.add_argument("--pairs", type=int, default=20, help="alternating pairs (--loop-vs-fit-ci)")
    p.add_argument("--fit-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--telemetry-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--output-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smoke:
        args.epochs, args.steps, args.repeats, args.telemetry_epochs = 1, 5, 1, 4
    return args


def _prepare(args) -> str:
    if args.data_dir:
        return args.data_dir
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    out = Path(tempfile.gettempdir()) / "ampflow-bench-digits"
    return str(run_prepare_data(PrepareDataConfig(output_dir=out)).output_dir)


def _configs(args) -> dict[str, dict]:
    """Configuration name -> how to run it (run_train via the CLI, or the rebuilt fit path)."""
    p = args.policy
    return {
        "1 worker, 1 core": {"loop": "run_train", "policy": p, "workers": 1, "pin": 1,
                             "group": "scaling"},
        "2 workers, 1 core each": {"loop": "run_train", "policy": p, "workers": 2, "pin": 1,
                                   "group": "scaling"},
        "run_train loop, 1 process": {"loop": "run_train", "policy": p, "workers": 1,
                                      "group": "loop_vs_fit"},
        "keras fit path, 1 process": {"loop": "fit", "policy": p, "workers": 1,
                                      "group": "loop_vs_fit"},
    }


def _train_flags(args, data_dir, out, spec) -> list[str]:
    flags = ["--data-dir", data_dir, "--output-dir", str(out), "--model", args.model,
             "--precision", spec["policy"], "--batch-size", str(args.batch_size),
             "--epochs", str(1 + args.epochs), "--seed", "1",
             "--telemetry-every-n-steps", str(spec.get("telemetry", 1))]
    if args.image_size:
        flags += ["--image-size", str(args.image_size)]
    if args.steps:
        flags += ["--steps-per-epoch", str(args.steps)]
    return flags


def _run(args, data_dir: str, name: str, spec: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model"
        flags = _train_flags(args, data_dir, out, spec)
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        preexec = None
        if spec["loop"] == "fit":
            cmd = [sys.executable, __file__, "--fit-worker", "--output-dir", str(out),
                   "--model", args.model, "--batch-size", str(args.batch_size),
                   "--epochs", str(args.epochs), "--policy", spec["policy"],
                   "--data-dir", data_dir] + (["--steps", str(args.steps)] if args.steps else []) \
                + (["--image-size", str(args.image_size)] if args.image_size else [])
        elif spec["workers"] > 1:
            cmd = [sys.executable, "-m", "ampflow.cli", "train", *flags,
                   "--workers", str(spec["workers"]), "--cpus-per-worker", str(spec["pin"])]
        else:
            cmd = [sys.executable, "-m", "ampflow.cli", "train", *flags]
            if spec.get("pin"):
                env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1",
                           OMP_NUM_THREADS="1")

                def preexec():
                    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        began = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=env, preexec_fn=preexec)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout:.0f} s"}
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
        meta = json.loads((out / "metadata.json").read_text())
    epochs = [e["examples_per_sec"] for e in meta["epochs"][1:]]
    return {"images_per_sec": statistics.median(epochs), "epoch_images_per_sec": epochs,
            "wall_s": time.monotonic() - began, "xla": meta["xla"]["effective"],
            "global_batch": meta.get("distribution", {}).get("global_batch_size",
                                                             args.batch_size)}


def _merge(name: str, spec: dict, runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    row = {"config": name, "group": spec["group"], "policy": spec["policy"],
           "workers": spec["workers"], "loop": spec["loop"], "runs": len(ok)}
    if not ok:
        return {**row, "error": runs[-1]["error"]}
    per_epoch = [x for r in ok for x in r["epoch_images_per_sec"]]
    return {**row, "images_per_sec": statistics.median(r["images_per_sec"] for r in ok),
            "range": [min(per_epoch), max(per_epoch)], "xla": ok[0]["xla"],
            "global_batch": ok[0]["global_batch"]}


def _ratios(rows: dict[str, dict]) -> dict:
    def ips(name):
        return rows.get(name, {}).get("images_per_sec")

    out = {}
    one, two = ips("1 worker, 1 core"), ips("2 workers, 1 core each")
    if one and two:
        out["speedup_2_workers"] = two / one
        out["scaling_efficiency"] = two / (2 * one)
    loop, fit = ips("run_train loop, 1 process"), ips("keras fit path, 1 process")
    if loop and fit:
        out["loop_vs_fit"] = loop / fit
    return out


def _paired_ratios(runs: dict[str, list[dict]]) -> dict[str, list[float]]:
    """The same ratios within each sweep (configurations run back to back): less drift."""
    pairs = {"speedup_2_workers": ("2 workers, 1 core each", "1 worker, 1 core"),
             "loop_vs_fit": ("run_train loop, 1 process", "keras fit path, 1 process")}
    out: dict[str, list[float]] = {}
    for key, (a, b) in pairs.items():
        for x, y in zip(runs.get(a, []), runs.get(b, []), strict=False):
            if "images_per_sec" in x and "images_per_sec" in y:
                out.setdefault(key, []).append(x["images_per_sec"] / y["images_per_sec"])
    return out


def _telemetry_cost(args, data_dir: str) -> dict:
    """Telemetry every step vs never (only the per-epoch guard), alternating in one process.

    Epoch by epoch in ONE process: machine-load drift hits both sides alike, unlike separate
    processes.
    """
    cmd = [sys.executable, __file__, "--telemetry-worker", "--data-dir", data_dir,
           "--model", args.model, "--batch-size", str(args.batch_size),
           "--telemetry-epochs", str(args.telemetry_epochs)] \
        + (["--steps", str(args.steps)] if args.steps else []) \
        + (["--image-size", str(args.image_size)] if args.image_size else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    on, off = result["every_step"], result["never"]
    result["cost"] = 1 - statistics.median(on) / statistics.median(off)
    # paired: each "every step" epoch against the "never" epoch right after it
    result["paired_costs"] = [1 - a / b for a, b in zip(on, off, strict=False)]
    result["paired_median_cost"] = statistics.median(result["paired_costs"])
    print(f"telemetry every step vs never: {result['paired_median_cost']:+.1%} (paired median)",
          flush=True)
    return result


def _telemetry_epochs(args) -> dict:
    """mixed_float16 run_train pieces; odd epochs record every step, even epochs never."""
    import keras

    from ampflow.components.prepare_data import load_dataset_info
    from ampflow.components.train.build import build_compiled_model, training_data
    from ampflow.components.train.loop import LoopConfig, TrainLoop, distribute_datasets
    from ampflow.components.train.precision import configure_precision
    from ampflow.components.train.step import TrainConfig, make_runtime
    from ampflow.components.train.telemetry import EpochLog, GuardLimits, LossScaleTelemetry

    out = Path(tempfile.mkdtemp())
    epochs = 1 + 2 * args.telemetry_epochs  # epoch 1: warm-up
    config = TrainConfig(data_dir=Path(args.data_dir), output_dir=out, model=args.model,
                         image_size=args.image_size, precision="mixed_float16",
                         batch_size=args.batch_size, epochs=epochs,
                         steps_per_epoch=args.steps, seed=1)
    runtime = make_runtime(config)
    info = load_dataset_info(config.data_dir)
    setup = configure_precision(config.precision, None)
    keras.utils.set_random_seed(config.seed)
    train_ds, _, steps = training_data(config, info, config.batch_size)
    model = build_compiled_model(config, info, setup, runtime, config.learning_rate)
    loop = TrainLoop(runtime, model, LoopConfig(
        epochs=epochs, steps_per_epoch=steps, global_batch_size=config.batch_size,
        jit_compile=setup.jit_compile, loss_scaling=True, state_dir=str(out)))
    telemetry = LossScaleTelemetry(GuardLimits(warmup_steps=10**9), every_n=1)

    class Toggle(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            telemetry.every_n = 1 if epoch % 2 else 10**9

    epoch_log = EpochLog(out / "epochs.jsonl", config.batch_size)
    train, _ = distribute_datasets(runtime, train_ds, None)
    loop.fit(train, None, [Toggle(), telemetry, epoch_log])
    ips = [e["examples_per_sec"] for e in epoch_log._entries[1:]]
    # The host-side cost of one recorded step, timed alone (not buried in the epoch noise).
    import time as clock

    from ampflow.components.train.loop import TELEMETRY_KEY

    iterator = iter(train)
    packed = loop._train_step(iterator)
    began = clock.perf_counter()
    for _ in range(50):
        packed = loop._train_step(iterator)
    loop._sums.numpy()
    step_s = (clock.perf_counter() - began) / 50
    telemetry.every_n = 1
    began = clock.perf_counter()
    for batch in range(2000):
        telemetry.on_train_batch_end(batch, {TELEMETRY_KEY: packed})
    record_s = (clock.perf_counter() - began) / 2000
    return {"every_step": ips[0::2], "never": ips[1::2], "steps_per_epoch": steps,
            "records": len(telemetry.history), "xla": setup.jit_compile,
            "step_ms": 1000 * step_s, "record_us": 1e6 * record_s,
            "record_fraction_of_step": record_s / step_s}


def _fit_path(args) -> dict:
    """Train with the `model.fit` path that `run_train` used before the custom loop.

    Same model, optimizer, input pipeline and callbacks; throughput recorded by the same EpochLog.
    """
    import keras

    from ampflow.components.prepare_data import load_dataset_info
    from ampflow.components.train.build import make_optimizer, training_data
    from ampflow.components.train.precision import configure_precision
    from ampflow.components.train.step import TrainConfig
    from ampflow.components.train.telemetry import (
        EpochLog,
        GuardLimits,
        LossScaleTelemetry,
        read_epoch_log,
    )

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = TrainConfig(data_dir=Path(args.data_dir), output_dir=out, model=args.model,
                         image_size=args.image_size, precision=args.policy,
                         batch_size=args.batch_size, epochs=1 + args.epochs,
                         steps_per_epoch=args.steps, seed=1)
    info = load_dataset_info(config.data_dir)
    setup = configure_precision(config.precision, None)
    keras.utils.set_random_seed(config.seed)
    train_ds, test_ds, steps = training_data(config, info, config.batch_size)
    from ampflow.components.train.models import build_model

    model = build_model(config.model, tuple(info["image_shape"]), info["num_classes"],
                        image_size=config.image_size)
    model.compile(optimizer=make_optimizer(config, setup, config.learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=setup.jit_compile)
    telemetry = LossScaleTelemetry(GuardLimits(), every_n=1, tensorboard_dir=out / "tensorboard")
    epoch_log = EpochLog(out / "epochs.jsonl", config.batch_size)
    model.fit(train_ds, validation_data=test_ds, epochs=config.epochs, steps_per_epoch=steps,
              verbose=0, callbacks=[
                  keras.callbacks.BackupAndRestore(str(out / "backup"), save_freq="epoch",
                                                   double_checkpoint=True),
                  telemetry, epoch_log,
                  keras.callbacks.TensorBoard(str(out / "tensorboard"), update_freq="epoch",
                                              profile_batch=0, write_graph=False)])
    epochs = read_epoch_log(out / "epochs.jsonl")
    (out / "metadata.json").write_text(json.dumps({"epochs": epochs, "xla": {
        "effective": setup.jit_compile}}))
    return {"epochs": len(epochs)}


def _loop_vs_fit_paired(args, data_dir: str) -> dict:
    """Twin models, one trained by run_train's loop, one by `fit`, in alternating epochs."""
    import dataclasses

    import keras
    import tensorflow as tf

    from ampflow.components.prepare_data import load_dataset_info
    from ampflow.components.train.build import build_compiled_model, training_data
    from ampflow.components.train.loop import LoopConfig, Runtime, TrainLoop, distribute_datasets
    from ampflow.components.train.precision import configure_precision
    from ampflow.components.train.step import TrainConfig
    from ampflow.components.train.telemetry import EpochLog, GuardLimits, LossScaleTelemetry

    tmp = Path(tempfile.mkdtemp(prefix="ampflow-loop-vs-fit-"))
    config = TrainConfig(data_dir=Path(data_dir), output_dir=tmp, model=args.model,
                         image_size=args.image_size, precision=args.policy,
                         batch_size=args.batch_size, epochs=1, steps_per_epoch=args.steps,
                         seed=1)
    info = load_dataset_info(config.data_dir)
    setup = configure_precision(config.precision, None)
    runtime = Runtime(tf.distribute.get_strategy(), "default", "loop vs fit benchmark")
    train_ds, _, steps = training_data(config, info, config.batch_size)
    models = {}
    for name in ("loop", "fit"):
        keras.utils.set_random_seed(config.seed)
        models[name] = build_compiled_model(config, info, setup, runtime, config.learning_rate)
    loop_config = LoopConfig(epochs=1, steps_per_epoch=steps, global_batch_size=args.batch_size,
                             jit_compile=setup.jit_compile, loss_scaling=setup.loss_scaling,
                             state_dir=str(tmp / "loop"), progress=False)
    loop = TrainLoop(runtime, models["loop"], loop_config)
    train_dist, _ = distribute_datasets(runtime, train_ds, None)
    chunks = {"loop": 0, "fit": 0}

    def callbacks(name):
        log = EpochLog(tmp / f"{name}.jsonl", args.batch_size)
        return log, [LossScaleTelemetry(GuardLimits(), every_n=1), log]

    def run(name) -> float:
        chunks[name] += 1
        epoch_log, cbs = callbacks(name)
        if name == "loop":  # a fresh state dir: each chunk is one whole epoch from step 0
            loop.config = dataclasses.replace(loop_config,
                                              state_dir=str(tmp / f"loop{chunks[name]}"))
            loop._step_var.assign(0)  # restored from no checkpoint: the run starts at step 0
            loop.fit(train_dist, None, cbs)
        else:
            models["fit"].fit(train_ds, epochs=1, steps_per_epoch=steps, verbose=0,
                              callbacks=cbs)
        return epoch_log._entries[-1]["examples_per_sec"]

    warmup = {name: run(name) for name in ("loop", "fit")}
    samples: dict[str, list[float]] = {"loop": [], "fit": []}
    for pair in range(args.pairs):
        for name in (("loop", "fit") if pair % 2 == 0 else ("fit", "loop")):
            samples[name].append(run(name))
        print(f"pair {pair + 1}/{args.pairs}: loop {samples['loop'][-1]:.1f} img/s, fit "
              f"{samples['fit'][-1]:.1f} img/s", flush=True)
    ratios = [a / b for a, b in zip(samples["loop"], samples["fit"], strict=True)]
    return {"model": args.model, "image_size": args.image_size, "policy": setup.policy,
            "xla": setup.jit_compile, "batch": args.batch_size, "steps_per_chunk": steps,
            "pairs": args.pairs, "warmup_images_per_sec": warmup, "samples": samples,
            "ratios": ratios, **_ratio_interval(ratios), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "cpu_flags": _cpu_flags()}


def _ratio_interval(ratios: list[float]) -> dict:
    """Geometric mean of paired ratios and its 95 % t-interval (on the log scale)."""
    import math

    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"ratio": math.exp(mean), "ci95": [None, None]}
    try:
        from scipy.stats import t

        quantile = float(t.ppf(0.975, len(logs) - 1))
    except ImportError:  # scipy is optional: the normal quantile, a little narrow for few pairs
        quantile = 1.96
    half = quantile * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"ratio": math.exp(mean), "ci95": [math.exp(mean - half), math.exp(mean + half)]}


def _cpu_flags() -> list[str]:
    from train_memory import _cpu_flags as flags

    return flags()


def _write_ci(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    size = f"_{report['image_size']}" if report["image_size"] else ""
    stem = out / f"loop_vs_fit_ci_{report['model']}{size}_{report['policy']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    low, high = report["ci95"]
    med = {k: statistics.median(v) for k, v in report["samples"].items()}
    text = (
        f"# The loop vs Keras fit: {report['model']}"
        f"{' at ' + str(report['image_size']) + '²' if report['image_size'] else ''}, "
        f"{report['policy']}, XLA {'on' if report['xla'] else 'off'}, batch {report['batch']}\n\n"
        f"One process, twin models, {report['pairs']} alternating pairs (ABBA) of one epoch of "
        f"{report['steps_per_chunk']} steps each, after a warm-up epoch each; img/s from the "
        f"epoch log (training steps only). {report['cpus']} cores shared with other jobs "
        f"(load average {report['load_average'][0]:.1f}). CPU flags: "
        f"{' '.join(report['cpu_flags'])}.\n\n"
        f"- loop / fit: **{report['ratio']:.3f}×** (geometric mean of the pairs), 95 % interval "
        + (f"{low:.3f}–{high:.3f}" if low else "n/a") + "\n"
        f"- median img/s: loop {med['loop']:.1f}, fit {med['fit']:.1f}\n"
        f"- per pair: {', '.join(f'{r:.2f}' for r in report['ratios'])}\n")
    stem.with_suffix(".md").write_text(text)
    print(text)


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_scaling_{report['model']}" + (
        f"_{report['image_size']}" if report["image_size"] else "") + (
        "" if report["groups"] == list(ALL_GROUPS) else "_" + "_".join(report["groups"]))
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    size = f" at {report['image_size']}²" if report["image_size"] else ""
    lines = [f"# Training loop throughput: {report['model']}{size}, batch "
             f"{report['per_replica_batch']} per replica, {report['cpus']} CPUs", "",
             f"{report['timed_epochs']} timed epochs after a warm-up epoch, "
             f"{report['repeats']} interleaved sweep(s); images/s are global (all workers). "
             f"{report['note']}.", "",
             "| group | configuration | policy | XLA | global batch | img/s (median) | "
             "range over epochs |", "|---|---|---|---|---:|---:|---:|"]
    for r in report["rows"]:
        if "error" in r:
            lines.append(f"| {r['group']} | {r['config']} | {r['policy']} | | | {r['error']} | |")
            continue
        lo, hi = r["range"]
        lines.append(f"| {r['group']} | {r['config']} | {r['policy']} | "
                     f"{'on' if r['xla'] else 'off'} | {r['global_batch']} | "
                     f"{r['images_per_sec']:.1f} | {lo:.1f}–{hi:.1f} |")
    ratios = report["ratios"]
    lines.append("")
    sweeps = report.get("per_sweep", {})

    def spread(key):
        values = sweeps.get(key) or []
        return (f" (per sweep: {', '.join(f'{v:.2f}' for v in values)})" if values else "")

    if "speedup_2_workers" in ratios:
        lines.append(f"- 2 workers vs 1 (one core each): {ratios['speedup_2_workers']:.2f}×, "
                     f"scaling efficiency {ratios['scaling_efficiency']:.0%}"
                     f"{spread('speedup_2_workers')}.")
    if "loop_vs_fit" in ratios:
        lines.append(f"- run_train's loop vs the Keras fit path, one process: "
                     f"{ratios['loop_vs_fit']:.2f}×{spread('loop_vs_fit')}.")
    tel = report.get("telemetry") or {}
    if "paired_median_cost" in tel:
        costs = tel["paired_costs"]
        lines.append(
            f"- Loss-scale telemetry (mixed_float16, XLA {'on' if tel['xla'] else 'off'}, one "
            f"process, epochs alternating) recorded every step vs never: "
            f"{tel['paired_median_cost']:+.1%} of the throughput (paired median over "
            f"{len(costs)} epoch pairs of {tel['steps_per_epoch']} steps; range "
            f"{min(costs):+.1%} to {max(costs):+.1%}; every step: "
            f"{statistics.median(tel['every_step']):.0f} img/s, never: "
            f"{statistics.median(tel['never']):.0f} img/s). Timed alone, one recorded step "
            f"costs the host {tel['record_us']:.0f} µs = {tel['record_fraction_of_step']:.2%} "
            f"of a {tel['step_ms']:.1f} ms step.")
    elif "error" in tel:
        lines.append(f"- Telemetry measurement failed: {tel['error']}")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
