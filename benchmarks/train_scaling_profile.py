"""`--profile-step`: where a 2-worker step's time goes, piece by piece.

train_scaling.py's docstring (point 5) says what is timed: the workers' own timing is
`profile_pieces`, and `profile_step` runs one pinned process and two workers and collects it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train_scaling_runs import SCRIPT, cpu_flags

PROFILE_PREFIX = "AMPFLOW_PROFILE "


def profile_step(args, data_dir: str) -> dict:
    """--profile-step: the pieces timed in 2 workers (one core each), then in 1 process."""
    import io

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ampflow.components.train.clusters.launcher import local_ports, run_workers, tf_configs

    argv = [sys.executable, SCRIPT, "--profile-worker", "--data-dir", data_dir,
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
    one = profile_lines(single.stdout + single.stderr)
    if not one:
        raise SystemExit(f"the 1-worker profile failed: {single.stderr[-2000:]}")
    log = io.StringIO()
    try:
        run_workers(argv, tf_configs(local_ports(2)), cpus_per_worker=1, stream=log)
    except Exception as e:
        raise SystemExit(f"the 2-worker profile failed: {e}\n{log.getvalue()[-3000:]}") from e
    two = profile_lines(log.getvalue())
    return {"model": args.model, "image_size": args.image_size, "policy": args.policy,
            "per_replica_batch": args.batch_size, "steps_per_round": args.profile_steps,
            "rounds": args.profile_rounds, "one_worker": one[0],
            "two_workers": sorted(two, key=lambda r: r["worker"]), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "cpu_flags": cpu_flags()}


def profile_lines(text: str) -> list[dict]:
    return [json.loads(line.split(PROFILE_PREFIX, 1)[1]) for line in text.splitlines()
            if PROFILE_PREFIX in line]


def profile_pieces(args) -> dict:
    """One worker's pieces (TF_CONFIG set by the launcher, or none: the 1-worker reference).

    Two loops in this process, former and packed all-reduce, on twin models; every piece is
    timed `--profile-rounds` times, in alternating order, each round `--profile-steps` calls;
    the report keeps each piece's median round (ms per call).
    """
    import tensorflow as tf

    from ampflow.components.train.config import TrainConfig
    from ampflow.components.train.precision.policy import configure_precision
    from ampflow.components.train.run.build import build_compiled_model, training_data
    from ampflow.components.train.run.loop import LoopConfig, TrainLoop, distribute_datasets
    from ampflow.components.train.run.strategy import make_runtime
    from ampflow.data import load_dataset_info

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
