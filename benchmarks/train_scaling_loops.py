"""The training loops that train_scaling.py times inside one process.

The telemetry on/off epochs (a worker), the `model.fit` path run_train replaced (a worker),
and the loop vs `fit` in alternating chunks with its 95 % interval (`--loop-vs-fit-ci`).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

from train_scaling_runs import cpu_flags


def telemetry_epochs(args) -> dict:
    """mixed_float16 run_train pieces; odd epochs record every step, even epochs never."""
    import keras

    from ampflow.components.train.config import TrainConfig
    from ampflow.components.train.precision.policy import configure_precision
    from ampflow.components.train.run.build import build_compiled_model, training_data
    from ampflow.components.train.run.loop import LoopConfig, TrainLoop, distribute_datasets
    from ampflow.components.train.run.strategy import make_runtime
    from ampflow.components.train.run.telemetry import EpochLog, GuardLimits, LossScaleTelemetry
    from ampflow.data import load_dataset_info

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

    from ampflow.components.train.run.loop import TELEMETRY_KEY

    iterator = iter(train)
    packed = loop._train_step(iterator)
    began = clock.perf_counter()
    for _ in range(50):
        packed = loop._train_step(iterator)
    loop._sums.numpy()
    step_s = (clock.perf_counter() - began) / 50
    # The same packed values read 2000 times: the optimizer's iterations stand still while the
    # callback's step count runs on, which the guard rightly reads as 2000 skipped steps in a
    # row. The timing callback's guard is off (its rules are not what this times).
    timed = LossScaleTelemetry(GuardLimits(warmup_steps=10**9, max_consecutive_skipped=10**9),
                               every_n=1)
    timed.set_model(model)
    timed.set_params(telemetry.params)
    began = clock.perf_counter()
    for batch in range(2000):
        timed.on_train_batch_end(batch, {TELEMETRY_KEY: packed})
    record_s = (clock.perf_counter() - began) / 2000
    return {"every_step": ips[0::2], "never": ips[1::2], "steps_per_epoch": steps,
            "records": len(telemetry.history), "xla": setup.jit_compile,
            "step_ms": 1000 * step_s, "record_us": 1e6 * record_s,
            "record_fraction_of_step": record_s / step_s}


def fit_path(args) -> dict:
    """Train with the `model.fit` path that `run_train` used before the custom loop.

    Same model, optimizer, input pipeline and callbacks; throughput recorded by the same EpochLog.
    """
    import keras

    from ampflow.components.train.config import TrainConfig
    from ampflow.components.train.precision.policy import configure_precision
    from ampflow.components.train.run.build import make_optimizer, training_data
    from ampflow.components.train.run.telemetry import (
        EpochLog,
        GuardLimits,
        LossScaleTelemetry,
        read_epoch_log,
    )
    from ampflow.data import load_dataset_info

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
    from ampflow.modeling.models import build_model

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


def loop_vs_fit_paired(args, data_dir: str) -> dict:
    """Twin models, one trained by run_train's loop, one by `fit`, in alternating epochs."""
    import dataclasses

    import keras
    import tensorflow as tf

    from ampflow.components.train.config import TrainConfig
    from ampflow.components.train.precision.policy import configure_precision
    from ampflow.components.train.run.build import build_compiled_model, training_data
    from ampflow.components.train.run.loop import (
        LoopConfig,
        Runtime,
        TrainLoop,
        distribute_datasets,
    )
    from ampflow.components.train.run.telemetry import EpochLog, GuardLimits, LossScaleTelemetry
    from ampflow.data import load_dataset_info

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
            "ratios": ratios, **ratio_interval(ratios), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "cpu_flags": cpu_flags()}


def ratio_interval(ratios: list[float]) -> dict:
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
