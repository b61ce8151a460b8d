"""The multi-worker all-reduce options: packed, compute-dtype, the skip verdict they share, and
gradient accumulation's one all-reduce per applied step.

One launch of two real workers on loopback (MultiWorkerMirroredStrategy, the launcher's own
`run_workers`/`tf_configs`) runs every case below in each worker and writes what it saw; the
tests read those files. A worker costs a TensorFlow start (~9 CPU-s), more than all its cases:
so test_accumulation.py's two-worker cases run here too, after the all-reduce ones. The worker
is this module run as a script (`python test_scaling_options.py <data dir> <out dir>`), like
worker_driver.py, so that it knows its test models. Every all-reduce case starts from the same
seed and the same first batch, and takes ONE train step with SGD: SGD's first update is
-lr × gradient, linear in the gradient, so a gradient summed twice (the double reduction the
packed path must avoid) doubles the update, where Adam's normalized update would hide it.

The tolerance of the compute-dtype all-reduce is derived, not tuned: each worker's gradient
G_i is rounded to the wire dtype (relative error <= u, the dtype's unit roundoff: 2**-11 for
float16, 2**-8 for bfloat16), the sum is rounded once more (<= u of |G_a + G_b| <= u
(|G_a| + |G_b|)), and the cast back to float32 is exact. So per element the reduced gradient is
off by at most 2u (|G_a| + |G_b|) (+ float16's subnormal spacing, 2**-24, for tiny values),
and the update by lr / loss scale times that; float32's own rounding of w + update adds at most
two ulps of the weight. The workers write their local gradients so the test can compute
|G_a| + |G_b| element by element.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from test_accumulation import BATCH, RELATIVE_TOLERANCE, _data, _loop, _model

from ampflow.components.train import TrainConfig
from ampflow.errors import ConfigError

LEARNING_RATE = 0.05
BATCH_PER_REPLICA = 16
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
FLOAT16_SUBNORMAL = 2.0**-24
# (policy, wire dtype) cases of the equal-updates test, and the cases with an inf on worker 1.
POLICIES = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
MODES = ("keras", "packed_float32", "packed_split", "packed_compute")
# Packs of SPLIT_BYTES_PER_PACK: float32 gradients on the wire whatever the policy, so one policy
# (mixed_float16's, loss-scaled) proves the split; not crossed with both.
SPLIT_POLICY = "mixed_float16"
# test_accumulation.py's tiny model, accumulating on the same two workers: every policy
ACCUMULATION_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
SPLIT_BYTES_PER_PACK = 256  # the dense model's kernel (64×16 floats) alone is 4 KiB: 3+ packs
WORKER_TIMEOUT_S = 300


# ---- the worker (this file run as a script under TF_CONFIG) --------------------------------------

def _dense_model(input_shape, num_classes, image_size):
    """Tiny and deterministic: no dropout, so every case sees the same forward pass."""
    import keras

    from ampflow.modeling.models import float32_head

    inputs = keras.Input(shape=input_shape, name="images")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(inputs, float32_head(x, num_classes))


def _config(data_dir: Path, out: Path, model: str = "test_scaling_dense",
            policy: str = "float32") -> TrainConfig:
    return TrainConfig(data_dir=data_dir, output_dir=out, model=model, precision=policy,
                       optimizer="sgd", learning_rate=LEARNING_RATE,
                       batch_size=BATCH_PER_REPLICA, epochs=1, steps_per_epoch=1, seed=7)


def _first_batch(runtime, data_dir: Path, out: Path):
    """The run's seeded input pipeline's first global batch, read once: every case's batch (a
    pipeline built per case cost more CPU than the case's model and step)."""
    import tensorflow as tf

    from ampflow.components.train.run.build import training_data
    from ampflow.data import load_dataset_info

    global_batch = BATCH_PER_REPLICA * runtime.num_replicas
    train_ds, _, _ = training_data(_config(data_dir, out), load_dataset_info(data_dir),
                                   global_batch)
    return tf.data.Dataset.from_tensors(next(iter(train_ds))).repeat()


def _one_step(runtime, data_dir: Path, out: Path, model: str, policy: str, mode: str,
              first_batch) -> dict:
    """Build the seeded model, take one train step under `mode` on `first_batch` (a dataset of
    that one global batch); weights before and after."""
    import keras

    from ampflow.components.train.precision.policy import configure_precision
    from ampflow.components.train.run.build import build_compiled_model
    from ampflow.components.train.run.loop import LoopConfig, TrainLoop, distribute_datasets
    from ampflow.data import load_dataset_info

    config = _config(data_dir, out, model, policy)
    info = load_dataset_info(data_dir)
    setup = configure_precision(policy, False)  # no XLA: the same kernels in every case
    global_batch = BATCH_PER_REPLICA * runtime.num_replicas
    keras.utils.set_random_seed(7)
    net = build_compiled_model(config, info, setup, runtime, LEARNING_RATE)
    loop = TrainLoop(runtime, net, LoopConfig(
        epochs=1, steps_per_epoch=1, global_batch_size=global_batch, jit_compile=False,
        loss_scaling=setup.loss_scaling, state_dir=str(out / f"{policy}-{mode}"), progress=False,
        packed_allreduce=mode != "keras",
        allreduce_bytes_per_pack=SPLIT_BYTES_PER_PACK if mode == "packed_split" else 0,
        allreduce_dtype="compute" if mode == "packed_compute" else "float32"))
    train, _ = distribute_datasets(runtime, first_batch, None)
    before = [w.copy() for w in net.get_weights()]
    iterator = iter(train)
    local_grads = None
    if mode == "packed_float32":  # this worker's own (scaled) gradients of that first batch
        batch = next(iter(distribute_datasets(runtime, first_batch, None)[0]))
        per_replica = runtime.strategy.run(loop._forward_backward, args=batch)
        grads = runtime.strategy.experimental_local_results(per_replica)[0][1]
        local_grads = [np.asarray(g, np.float64).tolist() for g in grads]
    loop._train_step(iterator)
    optimizer = net.optimizer
    return {"before": [w.tolist() for w in before], "after": [w.tolist() for w in
                                                                 net.get_weights()],
            "iterations": int(optimizer.iterations.numpy()),
            "loss_scale": (float(optimizer.dynamic_scale.numpy()) if setup.loss_scaling
                           else None),
            "local_grads": local_grads}


def _worker(data_dir: str, out_dir: str) -> None:
    from ampflow.components.train.run.strategy import make_runtime
    from ampflow.modeling.models import register_model

    register_model("test_scaling_dense", _dense_model)
    # worker_driver.py (this file's folder: the script's sys.path[0]) has the model whose
    # gradients are infinite on replica 1 (here worker 1) only
    from worker_driver import _inf_gradient_on_replica_1

    register_model("test_scaling_inf_on_worker_1", _inf_gradient_on_replica_1)
    out = Path(out_dir)
    runtime = make_runtime(TrainConfig(data_dir=Path(data_dir), output_dir=out))
    first_batch = _first_batch(runtime, Path(data_dir), out)
    results: dict = {}
    for policy in POLICIES:
        for mode in MODES:
            if mode == "packed_split" and policy != SPLIT_POLICY:
                continue
            results[f"{policy}/{mode}"] = _one_step(runtime, Path(data_dir), out,
                                                    "test_scaling_dense", policy, mode,
                                                    first_batch)
    for mode in ("packed_float32", "packed_compute"):
        results[f"inf/{mode}"] = _one_step(runtime, Path(data_dir), out,
                                           "test_scaling_inf_on_worker_1", "mixed_float16", mode,
                                           first_batch)
    for policy in ACCUMULATION_POLICIES:
        results[f"accumulation/{policy}"] = _accumulated_steps(runtime, policy)
    (out / f"worker{runtime.worker_id}.json").write_text(json.dumps(results))


def _accumulated_steps(runtime, policy: str) -> dict:
    """test_accumulation.py's tiny model, 2 applied steps of 2 micro-batches on each worker."""
    import tensorflow as tf

    from ampflow.components.train.run.loop import LoopConfig, TrainLoop, distribute_datasets

    data = tf.data.Dataset.from_tensor_slices(_data()).batch(BATCH, drop_remainder=True).repeat()
    with runtime.strategy.scope():
        model = _model(policy)
    loop = TrainLoop(runtime, model, LoopConfig(
        epochs=1, steps_per_epoch=1, global_batch_size=BATCH, jit_compile=False,
        loss_scaling=policy == "mixed_float16", state_dir="", progress=False,
        accumulation_steps=2))
    loop.run_steps(iter(distribute_datasets(runtime, data, None)[0]), 2)
    return {"weights": [w.tolist() for w in model.get_weights()],
            "allreduce_calls_per_step": loop.allreduce_calls_per_step(),
            "iterations": int(model.optimizer.iterations.numpy())}


# ---- the tests --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_workers(prepared_digits, tmp_path_factory) -> list[dict]:
    """Run every case on two real workers over loopback, once; what each worker saw."""
    from ampflow.components.train.clusters.launcher import local_ports, run_workers, tf_configs

    out = tmp_path_factory.mktemp("scaling_options")
    log = io.StringIO()
    env_before = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    try:
        run_workers([sys.executable, __file__, str(prepared_digits), str(out)],
                    tf_configs(local_ports(2)), stream=log)
    except Exception as e:
        raise AssertionError(f"the workers failed: {e}\n{log.getvalue()[-4000:]}") from e
    finally:
        if env_before is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
        else:
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = env_before
    return [json.loads((out / f"worker{i}.json").read_text()) for i in range(2)]


def _weights(case: dict, key: str) -> list[np.ndarray]:
    return [np.asarray(w, np.float64) for w in case[key]]


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "mode"), [
    *((policy, "packed_float32") for policy in POLICIES), (SPLIT_POLICY, "packed_split")])
def test_packed_float32_all_reduce_updates_equal_keras_all_reduce_exactly(two_workers, policy,
                                                                          mode):
    """The packed all-reduce (one pack, or several of SPLIT_BYTES_PER_PACK) sums the same
    numbers as Keras's own: the same bits. A gradient summed twice (the packed sum, then
    Keras's) would double SGD's first update."""
    for worker in two_workers:
        keras_after = _weights(worker[f"{policy}/keras"], "after")
        packed_after = _weights(worker[f"{policy}/{mode}"], "after")
        before = _weights(worker[f"{policy}/keras"], "before")
        assert any(np.any(a != b) for a, b in zip(keras_after, before, strict=True))
        for keras_w, packed_w in zip(keras_after, packed_after, strict=True):
            np.testing.assert_array_equal(packed_w, keras_w)
    for a, b in zip(_weights(two_workers[0][f"{policy}/packed_float32"], "after"),
                    _weights(two_workers[1][f"{policy}/packed_float32"], "after"), strict=True):
        np.testing.assert_array_equal(a, b)  # every worker holds the same model


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "wire"), list(POLICIES.items()))
def test_compute_dtype_all_reduce_updates_equal_float32_within_rounding(two_workers, policy,
                                                                        wire):
    """Each element of the update within lr/scale × 2u(|G_a| + |G_b|) of the float32 one."""
    u = UNIT_ROUNDOFF[wire]
    reference = two_workers[0][f"{policy}/packed_float32"]
    scale = reference["loss_scale"] or 1.0
    local = [[np.abs(np.asarray(g, np.float64)) for g in w[f"{policy}/packed_float32"]
              ["local_grads"]] for w in two_workers]
    f32_after = _weights(reference, "after")
    before = _weights(reference, "before")
    for worker in two_workers:
        compute_after = _weights(worker[f"{policy}/packed_compute"], "after")
        assert worker[f"{policy}/packed_compute"]["iterations"] == 1  # applied, not skipped
        differs = False
        for i, (c, f, w0) in enumerate(zip(compute_after, f32_after, before, strict=True)):
            magnitude = local[0][i] + local[1][i]
            tiny = 3 * FLOAT16_SUBNORMAL if wire == "float16" else 0.0
            bound = (LEARNING_RATE / scale * (2 * u * magnitude + tiny) * (1 + 2.0**-10)
                     + 2 * np.spacing(np.maximum(np.abs(w0), np.abs(f)).astype(np.float32)))
            excess = np.abs(c - f) - bound
            assert np.all(excess <= 0), (
                f"{policy} variable {i}: update off by up to {np.max(np.abs(c - f)):.3g} "
                f"beyond the {wire} rounding bound by {np.max(excess):.3g}")
            differs |= bool(np.any(c != f))
        assert differs, f"the {wire} all-reduce gave float32's exact bits: was it used?"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["packed_float32", "packed_compute"])
def test_inf_gradient_on_one_worker_skips_the_step_on_every_worker(two_workers, mode):
    """Worker 1's gradients are infinite, worker 0's finite: both skip (no update, the
    optimizer's iterations stay 0) and both halve the loss scale, with no extra collective."""
    for worker in two_workers:
        case = worker[f"inf/{mode}"]
        assert case["iterations"] == 0
        assert case["loss_scale"] == 2.0**14  # Keras's initial 2**15, halved once
        for a, b in zip(_weights(case, "after"), _weights(case, "before"), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_two_workers_accumulating_make_the_step_of_one_process_on_the_larger_batch(two_workers):
    """2 workers x 2 micro-batches of 8 = one process's step on the batch of 32, after two
    applied steps, per policy; each worker all-reduced once per applied step, counted as the
    steps ran (the sum of its micro-batches, not each one). (Issue 40 point 1; the
    one-process accumulation tests: test_accumulation.py.)"""
    import tensorflow as tf

    for policy in ACCUMULATION_POLICIES:
        initial = _model(policy).get_weights()
        reference_loop = _loop(policy, 1)
        reference_loop.run_steps(iter(tf.data.Dataset.from_tensors(_data()).repeat()), 2)
        reference = reference_loop.model.get_weights()
        cases = [worker[f"accumulation/{policy}"] for worker in two_workers]
        for position, (before, one) in enumerate(zip(initial, reference, strict=True)):
            change = np.abs(one - before).max()
            chief, other = (np.asarray(case["weights"][position], np.float32) for case in cases)
            np.testing.assert_array_equal(chief, other)  # the workers agree bit for bit
            assert np.abs(chief - one).max() <= RELATIVE_TOLERANCE[policy] * change
        for case in cases:
            assert (case["allreduce_calls_per_step"], case["iterations"]) == (1.0, 2), policy


# ---- the flags' bad values ----------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "message"), [
    ({"allreduce_dtype": "float8"}, "allreduce_dtype must be one of"),
    ({"allreduce_bytes_per_pack": -1}, "allreduce_bytes_per_pack must be >= 0"),
    ({"packed_allreduce": False, "allreduce_dtype": "compute"}, "they need packed_allreduce"),
    ({"packed_allreduce": False, "allreduce_bytes_per_pack": 4096},
     "they need packed_allreduce"),
])
def test_bad_allreduce_options_are_one_clear_config_error(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(data_dir=tmp_path, output_dir=tmp_path / "out", **overrides)


@pytest.mark.parametrize(("flags", "message", "code"), [
    (["--allreduce-dtype", "float8"], "--allreduce-dtype must be one of", 2),
    (["--allreduce-bytes-per-pack", "-5"], "--allreduce-bytes-per-pack must be >= 0", 2),
    (["--allreduce-bytes-per-pack", "lots"], "--allreduce-bytes-per-pack", 2),
    (["--no-packed-allreduce", "--allreduce-dtype", "compute"], "need --packed-allreduce", 2),
])
def test_bad_allreduce_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, message, code):
    from ampflow.cli import main

    try:
        result = main(["train", "--data-dir", str(tmp_path), "--output-dir",
                       str(tmp_path / "out"), *flags])
    except SystemExit as e:
        result = e.code
    err = capsys.readouterr().err.strip()
    assert result == code, err
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


if __name__ == "__main__":
    from ampflow.task_exit import exit_command

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _worker(sys.argv[1], sys.argv[2])
    # as `ampflow train`'s workers end: TensorFlow's teardown in a worker stops the
    # coordination service, seconds of waiting on the other worker for nothing
    exit_command(0)
