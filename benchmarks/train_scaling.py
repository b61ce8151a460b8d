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

5. `--profile-step`: where a 2-worker step's time goes. Two workers (one core each, loopback)
   build the model twice, once with the former all-reduce (`--no-packed-allreduce`: Keras's
   gradient all-reduce + the statistics' reduce + under loss scaling the skip agreement) and
   once packed (one collective), and time, in alternating rounds: the whole step of each, the
   input (`next`), the forward/backward pass alone (a fixed batch, no collective), one
   gradient-sized all-reduce (float32, and in the compute dtype under a mixed policy), a
   3-float reduce, a scalar all-reduce, and 4 packed steps per tf.function call (fewer host
   round-trips). The same in one process pinned to one core is the 1-worker reference.

    python benchmarks/train_scaling.py --profile-step                       # small_cnn
    python benchmarks/train_scaling.py --profile-step --model resnet50 --image-size 32 \
        --profile-steps 3

The scaling group runs the 2-worker configuration with the former all-reduce (before) and
with the packed one (after, the default), and with `--allreduce-dtype compute` under a mixed
`--policy`, all interleaved in each sweep.

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
    if args.profile_worker:
        print(PROFILE_PREFIX + json.dumps(_profile_pieces(args)), flush=True)
        return 0
    data_dir = _prepare(args)
    if args.profile_step:
        _write_profile(_profile_step(args, data_dir), Path(args.out))
        return 0
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
        "cpu_flags": _cpu_flags(), "load_average": os.getloadavg(),
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
    p.add_argument("--profile-step", action="store_true",
                   help="time the parts of one 2-worker step (and of a 1-worker one)")
    p.add_argument("--profile-steps", type=int, default=30,
                   help="steps per timed round of --profile-step")
    p.add_argument("--profile-rounds", type=int, default=5,
                   help="alternating rounds of --profile-step")
    p.add_argument("--profile-no-multi-step", action="store_true",
                   help="leave out the 4-steps-per-call piece (slow for big models)")
    p.add_argument("--pack-bytes", type=int, default=None,
                   help="also run 2 workers with --allreduce-bytes-per-pack N (scaling group)")
    p.add_argument("--profile-worker", action="store_true", help=argparse.SUPPRESS)
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


BEFORE = "2 workers, 1 core each, former all-reduce"
AFTER = "2 workers, 1 core each"
COMPUTE = "2 workers, 1 core each, compute-dtype all-reduce"
INDEPENDENT = "2 independent 1-core processes (no communication)"


def _configs(args) -> dict[str, dict]:
    """Configuration name -> how to run it (run_train via the CLI, or the rebuilt fit path)."""
    p = args.policy
    two = {"loop": "run_train", "policy": p, "workers": 2, "pin": 1, "group": "scaling"}
    scaling = {
        "1 worker, 1 core": {"loop": "run_train", "policy": p, "workers": 1, "pin": 1,
                             "group": "scaling"},
        INDEPENDENT: {"loop": "run_train", "policy": p, "workers": 1, "pin": 1,
                      "independent": True, "group": "scaling"},
        BEFORE: {**two, "flags": ["--no-packed-allreduce"]},
        AFTER: two,
    }
    if p.startswith("mixed"):
        scaling[COMPUTE] = {**two, "flags": ["--allreduce-dtype", "compute"]}
    if args.pack_bytes:
        scaling[f"2 workers, 1 core each, packs of {args.pack_bytes} B"] = {
            **two, "flags": ["--allreduce-bytes-per-pack", str(args.pack_bytes)]}
    return {
        **scaling,
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
    return flags + spec.get("flags", [])


def _run(args, data_dir: str, name: str, spec: dict) -> dict:
    if spec.get("independent"):
        return _run_independent(args, data_dir, spec)
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


def _run_independent(args, data_dir: str, spec: dict) -> dict:
    """Two 1-worker runs at once, each pinned to its own core, with no collectives.

    The sum of their img/s is what two cores of this (shared) host deliver with no
    communication at all: the ceiling of two single-core workers here.
    """
    cores = sorted(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1")
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for i in range(2):
            out = Path(tmp) / f"model{i}"
            outs.append(out)
            core = {cores[i % len(cores)]}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "ampflow.cli", "train",
                 *_train_flags(args, data_dir, out, spec)], env=env, text=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                preexec_fn=lambda core=core: os.sched_setaffinity(0, core)))
        errors = [p.communicate(timeout=args.timeout)[1] for p in procs]
        if any(p.returncode for p in procs):
            return {"error": next(e for p, e in zip(procs, errors, strict=True)
                                  if p.returncode).strip().splitlines()[-1][:300]}
        metas = [json.loads((out / "metadata.json").read_text()) for out in outs]
    per_process = [[e["examples_per_sec"] for e in m["epochs"][1:]] for m in metas]
    epochs = [a + b for a, b in zip(*per_process, strict=False)]
    return {"images_per_sec": statistics.median(epochs), "epoch_images_per_sec": epochs,
            "wall_s": time.monotonic() - began, "xla": metas[0]["xla"]["effective"],
            "global_batch": args.batch_size}


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
    one = ips("1 worker, 1 core")
    for key, name in (("", AFTER), ("_former_allreduce", BEFORE),
                      ("_compute_dtype_allreduce", COMPUTE)):
        two = ips(name)
        if one and two:
            out["speedup_2_workers" + key] = two / one
            out["scaling_efficiency" + key] = two / (2 * one)
        ceiling = ips(INDEPENDENT)
        if ceiling and two:
            out["vs_independent" + key] = two / ceiling
    if ceiling and one:
        out["independent_vs_2x_one"] = ceiling / (2 * one)
    loop, fit = ips("run_train loop, 1 process"), ips("keras fit path, 1 process")
    if loop and fit:
        out["loop_vs_fit"] = loop / fit
    return out


def _paired_ratios(runs: dict[str, list[dict]]) -> dict[str, list[float]]:
    """The same ratios within each sweep (configurations run back to back): less drift."""
    pairs = {"speedup_2_workers": (AFTER, "1 worker, 1 core"),
             "speedup_2_workers_former_allreduce": (BEFORE, "1 worker, 1 core"),
             "speedup_2_workers_compute_dtype_allreduce": (COMPUTE, "1 worker, 1 core"),
             "packed_vs_former_allreduce": (AFTER, BEFORE),
             "independent_vs_one": (INDEPENDENT, "1 worker, 1 core"),
             "packed_vs_independent": (AFTER, INDEPENDENT),
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

    for key, what in (("", "packed all-reduce (now the default)"),
                      ("_former_allreduce", "former all-reduce (--no-packed-allreduce)"),
                      ("_compute_dtype_allreduce", "packed, --allreduce-dtype compute")):
        if "speedup_2_workers" + key in ratios:
            lines.append(f"- 2 workers vs 1 (one core each), {what}: "
                         f"{ratios['speedup_2_workers' + key]:.2f}×, scaling efficiency "
                         f"{ratios['scaling_efficiency' + key]:.0%}"
                         f"{spread('speedup_2_workers' + key)}.")
    if "independent_vs_2x_one" in ratios:
        lines.append(
            f"- The host's own ceiling: two independent 1-core processes at once (no "
            f"communication) deliver {ratios['independent_vs_2x_one']:.0%} of 2 × one process "
            f"alone (per sweep, their sum / one alone: "
            f"{', '.join(f'{v:.2f}' for v in sweeps.get('independent_vs_one', []))}); "
            "against that ceiling the 2 workers reach: " + ", ".join(
                f"{what} {ratios['vs_independent' + key]:.0%}" for key, what in (
                    ("", "packed"), ("_former_allreduce", "former"),
                    ("_compute_dtype_allreduce", "compute-dtype"))
                if "vs_independent" + key in ratios) + ".")
    if sweeps.get("packed_vs_former_allreduce"):
        lines.append(f"- packed vs former all-reduce, 2 workers, same sweep: per sweep "
                     f"{', '.join(f'{v:.2f}' for v in sweeps['packed_vs_former_allreduce'])}×.")
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
    if report.get("cpu_flags"):
        lines.append(f"- Host: {report['cpus']} cores, load average "
                     f"{report['load_average'][0]:.1f} at the end; CPU flags: "
                     f"{' '.join(report['cpu_flags'])}.")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

PROFILE_PREFIX = "AMPFLOW_PROFILE "


def _profile_step(args, data_dir: str) -> dict:
    """--profile-step: the pieces timed in 2 workers (one core each), then in 1 process."""
    import io

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ampflow.components.train.launcher import local_ports, run_workers, tf_configs

    argv = [sys.executable, __file__, "--profile-worker", "--data-dir", data_dir,
            "--model", args.model, "--batch-size", str(args.batch_size), "--policy",
            args.policy, "--profile-steps", str(args.profile_steps), "--profile-rounds",
            str(args.profile_rounds)] + (
        ["--image-size", str(args.image_size)] if args.image_size else []) + (
        ["--profile-no-multi-step"] if args.profile_no_multi_step else [])
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    single = subprocess.run(
        argv, capture_output=True, text=True, timeout=args.timeout,
        env={**env, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
             "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}))
    one = _profile_lines(single.stdout + single.stderr)
    if not one:
        raise SystemExit(f"the 1-worker profile failed: {single.stderr[-2000:]}")
    log = io.StringIO()
    try:
        run_workers(argv, tf_configs(local_ports(2)), cpus_per_worker=1, stream=log)
    except Exception as e:
        raise SystemExit(f"the 2-worker profile failed: {e}\n{log.getvalue()[-3000:]}") from e
    two = _profile_lines(log.getvalue())
    return {"model": args.model, "image_size": args.image_size, "policy": args.policy,
            "per_replica_batch": args.batch_size, "steps_per_round": args.profile_steps,
            "rounds": args.profile_rounds, "one_worker": one[0],
            "two_workers": sorted(two, key=lambda r: r["worker"]), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "cpu_flags": _cpu_flags()}


def _profile_lines(text: str) -> list[dict]:
    return [json.loads(line.split(PROFILE_PREFIX, 1)[1]) for line in text.splitlines()
            if PROFILE_PREFIX in line]


def _profile_pieces(args) -> dict:
    """One worker's pieces (TF_CONFIG set by the launcher, or none: the 1-worker reference).

    Two loops in this process, former and packed all-reduce, on twin models; every piece is
    timed `--profile-rounds` times, in alternating order, each round `--profile-steps` calls;
    the report keeps each piece's median round (ms per call).
    """
    import tensorflow as tf

    from ampflow.components.prepare_data import load_dataset_info
    from ampflow.components.train.build import build_compiled_model, training_data
    from ampflow.components.train.loop import LoopConfig, TrainLoop, distribute_datasets
    from ampflow.components.train.precision import configure_precision
    from ampflow.components.train.step import TrainConfig, make_runtime

    out = Path(tempfile.mkdtemp(prefix="ampflow-profile-"))
    config = TrainConfig(data_dir=Path(args.data_dir), output_dir=out, model=args.model,
                         image_size=args.image_size, precision=args.policy,
                         batch_size=args.batch_size, epochs=1, seed=1)
    runtime = make_runtime(config)
    strategy = runtime.strategy
    info = load_dataset_info(config.data_dir)
    setup = configure_precision(config.precision, None)
    global_batch = args.batch_size * runtime.num_replicas
    loops, iterators = {}, {}
    variants = [("packed", True, "float32")]
    if runtime.num_workers > 1:  # one process has nothing to all-reduce: one variant is enough
        variants.insert(0, ("former", False, "float32"))
        if setup.policy != "float32":
            variants.append(("packed_compute", True, "compute"))
    for name, packed, wire in variants:
        import keras

        keras.utils.set_random_seed(1)
        train_ds, _, steps = training_data(config, info, global_batch)
        model = build_compiled_model(config, info, setup, runtime, config.learning_rate)
        loops[name] = TrainLoop(runtime, model, LoopConfig(
            epochs=1, steps_per_epoch=steps, global_batch_size=global_batch,
            jit_compile=setup.jit_compile, loss_scaling=setup.loss_scaling,
            state_dir=str(out / name), progress=False, packed_allreduce=packed,
            allreduce_dtype=wire))
        iterators[name] = iter(distribute_datasets(runtime, train_ds, None)[0])
    loop, iterator = loops["packed"], iterators["packed"]
    first = strategy.experimental_local_results
    fixed = next(iterator)
    forward_backward = (tf.function(loop._forward_backward, jit_compile=True)
                        if setup.jit_compile else loop._forward_backward)
    variables = loop.model.trainable_variables
    compute_dtype = loop.model.dtype_policy.compute_dtype

    @tf.function
    def compute(images, labels):
        def replica(x, y):
            stats, grads = forward_backward(x, y)
            return stats[0] + tf.add_n([tf.cast(tf.reshape(g, [-1])[0], stats.dtype)
                                        for g in grads])
        return first(strategy.run(replica, args=(images, labels)))[0]

    @tf.function
    def compute_4_per_call(images, labels):
        def replica(x, y):
            total = tf.zeros([])
            for _ in range(4):
                stats, grads = forward_backward(x, y)
                total += stats[0] + tf.add_n([tf.cast(tf.reshape(g, [-1])[0], stats.dtype)
                                              for g in grads])
            return total
        return first(strategy.run(replica, args=(images, labels)))[0]

    @tf.function
    def empty_call():
        return tf.constant(1.0)

    @tf.function
    def input_only():
        _, labels = next(iterator)
        return tf.reduce_sum(tf.cast(first(labels)[0], tf.float32))

    def all_reduce_of(dtype, extra_stats=False):
        @tf.function
        def reduce():
            def replica():
                tensors = [tf.ones(v.shape, dtype) for v in variables]
                tensors += [tf.ones([3], dtype)] if extra_stats else []
                return tf.distribute.get_replica_context().all_reduce("SUM", tensors)[0]
            return first(strategy.run(replica))[0]
        return reduce

    @tf.function
    def stats_reduce():
        return strategy.reduce("SUM", strategy.run(lambda: tf.ones([3])), axis=None)

    @tf.function
    def scalar_all_reduce():
        return first(strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.ones([]))))[0]

    @tf.function
    def four_packed_steps():
        for _ in range(4):
            result = loop._distributed_train_step(iterator)
        return result

    pieces = {"step_packed": (lambda: loop._train_step(iterator), 1)}
    if "former" in loops:
        pieces = {"step_former": (lambda: loops["former"]._train_step(iterators["former"]), 1),
                  **pieces}
    if "packed_compute" in loops:
        pieces["step_packed_compute"] = (
            lambda: loops["packed_compute"]._train_step(iterators["packed_compute"]), 1)
    if not args.profile_no_multi_step:
        pieces["step_packed_4_per_call"] = (four_packed_steps, 4)
        pieces["forward_backward_4_per_call"] = (lambda: compute_4_per_call(*fixed), 4)
    pieces |= {
        "input": (input_only, 1),
        "forward_backward": (lambda: compute(*fixed), 1),
        "empty_function_call": (empty_call, 1),
        "grad_all_reduce_float32": (all_reduce_of(tf.float32), 1),
        "grad_and_stats_all_reduce_float32": (all_reduce_of(tf.float32, True), 1),
        "stats_reduce": (stats_reduce, 1),
        "scalar_all_reduce": (scalar_all_reduce, 1),
    }
    if compute_dtype != "float32":
        pieces[f"grad_all_reduce_{compute_dtype}"] = (all_reduce_of(compute_dtype), 1)
    rounds: dict[str, list[float]] = {name: [] for name in pieces}
    for fn, _ in pieces.values():  # trace and warm up, in the same order on every worker
        fn()
        fn()
    for r in range(args.profile_rounds):
        for name in (list(pieces) if r % 2 == 0 else list(reversed(pieces))):
            fn, per_call = pieces[name]
            began = time.perf_counter()
            for _ in range(args.profile_steps):
                result = fn()
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)
            rounds[name].append(1000 * (time.perf_counter() - began)
                                / (args.profile_steps * per_call))
    return {"worker": runtime.worker_id, "workers": runtime.num_workers,
            "policy": setup.policy, "xla": setup.jit_compile,
            "params": int(sum(v.shape.num_elements() for v in variables)),
            "ms": {name: statistics.median(v) for name, v in rounds.items()},
            "rounds_ms": rounds}


def _write_profile(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    size = f"_{report['image_size']}" if report["image_size"] else ""
    stem = out / f"train_scaling_profile_{report['model']}{size}_{report['policy']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    one, twos = report["one_worker"]["ms"], [w["ms"] for w in report["two_workers"]]
    def cell(values: dict, name: str) -> str:
        return f"{values[name]:.2f}" if name in values else "—"

    rows = [f"| {name} | {cell(one, name)} | " + " | ".join(cell(w, name) for w in twos) + " |"
            for name in twos[0]]
    two = {k: statistics.fmean(w[k] for w in twos) for k in twos[0]}
    # The 1-worker step is the same loop; with 4 steps per call, its own 4-steps-per-call time.
    efficiency = {k: one.get(k if k.endswith("4_per_call") else "step_packed",
                             one["step_packed"]) / two[k]
                  for k in ("step_former", "step_packed", "step_packed_compute",
                            "step_packed_4_per_call") if k in two}
    lines = [
        f"# Where a 2-worker step goes: {report['model']}"
        f"{' at ' + str(report['image_size']) + '²' if report['image_size'] else ''}, "
        f"{report['policy']}, batch {report['per_replica_batch']} per replica", "",
        f"ms per call, the median of {report['rounds']} alternating rounds of "
        f"{report['steps_per_round']} calls (benchmarks/train_scaling.py --profile-step). "
        "The 1-worker column is one process pinned to one core (no TF_CONFIG: its "
        "collectives are no-ops, and its one step is the step_packed row); workers 0 and 1 "
        "are two processes pinned to one core each, "
        f"MultiWorkerMirroredStrategy over loopback. {report['cpus']} cores shared with other "
        f"jobs (load average {report['load_average'][0]:.1f}); CPU flags: "
        f"{' '.join(report['cpu_flags'])}.", "",
        "| piece | 1 worker | " + " | ".join(f"worker {i}" for i in range(len(twos))) + " |",
        "|---|---:|" + "---:|" * len(twos), *rows, "",
        f"- 2-worker step, former all-reduce: {two['step_former']:.2f} ms; packed: "
        f"{two['step_packed']:.2f} ms ({two['step_former'] / two['step_packed']:.2f}× faster)"
        + (f"; packed in the compute dtype: {two['step_packed_compute']:.2f} ms"
           if "step_packed_compute" in two else "")
        + (f"; 4 packed steps per call: {two['step_packed_4_per_call']:.2f} ms a step"
           if "step_packed_4_per_call" in two else "") + ".",
        "- Scaling efficiency these imply (1-worker step / 2-worker step, the same "
        "per-replica batch): " + ", ".join(f"{k.removeprefix('step_')} {v:.0%}"
                                           for k, v in efficiency.items()) + ".",
        f"- Of the packed 2-worker step: forward/backward {two['forward_backward']:.2f} ms "
        f"(1 worker: {one['forward_backward']:.2f}), input {two['input']:.2f} ms "
        f"(1 worker: {one['input']:.2f}: each worker makes the whole global batch and keeps "
        f"its share), one gradient + statistics all-reduce "
        f"{two['grad_and_stats_all_reduce_float32']:.2f} ms; a scalar all-reduce alone costs "
        f"{two['scalar_all_reduce']:.2f} ms (the per-collective latency).",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
