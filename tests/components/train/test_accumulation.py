"""Gradient accumulation under AMP (issue 40 point 1), in one process: the training loop itself.

A tiny Dense model (no batch statistics, no dropout), 32 examples, one applied step: the step
that K = 4 micro-batches of 8 make must equal one step on the batch of 32, per policy; a
micro-batch whose gradients overflow must skip the whole step; the accumulators are float32.
The same model on 2 local workers (MultiWorkerMirroredStrategy, TF_CONFIG) is run by
test_scaling_options.py, in the launch of two workers its all-reduce cases use.
"""

from __future__ import annotations

import numpy as np
import pytest

from ampflow.components.train.run.loop import LoopConfig, TrainLoop
from ampflow.errors import ConfigError

BATCH, FEATURES, CLASSES = 32, 4, 3
# One applied step's weight change, K micro-batches vs one batch, relative to the change
# itself: float32 differs only by summation order; the half-precision policies round each
# micro-batch's matmuls to their format (bfloat16 keeps 8 significant bits, float16 11), so
# their sums differ by a few units of that last bit. A wrong accumulation (a micro-batch lost,
# the mean over K taken twice, K separate steps) is off by 25 % or more.
RELATIVE_TOLERANCE = {"float32": 1e-5, "mixed_bfloat16": 3e-2, "mixed_float16": 4e-3}


def _data(poison_micro_batch: int | None = None, accumulation_steps: int = 4):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(BATCH, FEATURES)).astype("float32")
    labels = rng.integers(0, CLASSES, size=(BATCH,)).astype("int64")
    if poison_micro_batch is not None:  # finite loss, float16 gradients that overflow
        micro = BATCH // accumulation_steps
        images[poison_micro_batch * micro:(poison_micro_batch + 1) * micro] *= 3000.0
    return images, labels


def _model(policy: str, l2: float = 0.0):
    """The tiny model; `l2` > 0 puts an L2 kernel regularizer on its hidden Dense."""
    import keras

    from ampflow.modeling.heads import float32_head

    class BatchSizes(keras.layers.Layer):
        """The identity, noting the batch size of every forward pass traced through it."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.seen = []

        def call(self, x, training=None):
            if training:
                self.seen.append(x.shape[0])
            return x

    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(3)
    inputs = keras.Input((FEATURES,))
    regularizer = keras.regularizers.L2(l2) if l2 else None
    hidden = keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer,
                                name="hidden")(BatchSizes(name="batch_sizes")(inputs))
    model = keras.Model(inputs, float32_head(hidden, CLASSES))
    optimizer = keras.optimizers.SGD(0.5)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def _loop(policy: str, accumulation_steps: int, jit_compile: bool = False, l2: float = 0.0):
    import tensorflow as tf

    from ampflow.components.train.run.strategy import Runtime

    model = _model(policy, l2)
    runtime = Runtime(tf.distribute.get_strategy(), "default", "test")
    return TrainLoop(runtime, model, LoopConfig(
        epochs=1, steps_per_epoch=1, global_batch_size=BATCH, jit_compile=jit_compile,
        loss_scaling=policy == "mixed_float16", state_dir="", progress=False,
        accumulation_steps=accumulation_steps))


def _one_step(loop, data) -> list[np.ndarray]:
    import tensorflow as tf

    loop.run_steps(iter(tf.data.Dataset.from_tensors(data).repeat()), 1)
    return [w.copy() for w in loop.model.get_weights()]


@pytest.mark.parametrize(("policy", "jit_compile"), [
    ("float32", False), ("mixed_bfloat16", False), ("mixed_float16", False),
    pytest.param("mixed_float16", True, marks=pytest.mark.slow)])  # XLA: train's fp16 CPU default
def test_k_micro_batches_make_the_step_of_the_k_times_larger_batch(policy, jit_compile):
    data = _data()
    initial = _model(policy).get_weights()
    whole = _one_step(_loop(policy, 1, jit_compile), data)
    accumulated_loop = _loop(policy, 4, jit_compile)
    accumulated = _one_step(accumulated_loop, data)
    assert int(accumulated_loop.optimizer.iterations.numpy()) == 1  # one applied step, not 4
    # the forward passes ran on micro-batches of 8, not on the whole batch
    assert set(accumulated_loop.model.get_layer("batch_sizes").seen) == {BATCH // 4}
    for before, one, four in zip(initial, whole, accumulated, strict=True):
        change = np.abs(one - before).max()
        assert change > 0  # the step moved every weight tensor
        assert np.abs(four - one).max() <= RELATIVE_TOLERANCE[policy] * change


def test_a_regularization_loss_is_applied_once_per_step_not_once_per_micro_batch():
    """An L2 kernel regularizer (float32, SGD, one step): K = 4 micro-batches make the step of
    the batch of 32, so each micro-batch adds a K-th of the regularization loss.

    The regularizer's part of the step is what the math says, -lr * 2 * l2 * w0 (the step with
    it minus the step without it, same start, same data), and it is large: counted once per
    micro-batch, the accumulated step would move the kernel by (K - 1) times that part too
    much, thousands of times the float32 tolerance. That tolerance (RELATIVE_TOLERANCE) is
    summation order only: each gradient element sums 32 examples' terms in another grouping,
    off by at most ~32 float32 units (2**-24) of their magnitudes, ~2e-6 of the step; 1e-5.
    """
    l2, lr, k = 0.1, 0.5, 4  # lr: _model's SGD
    data = _data()
    initial = _model("float32", l2).get_weights()
    plain = _one_step(_loop("float32", 1), data)
    whole = _one_step(_loop("float32", 1, l2=l2), data)
    accumulated = _one_step(_loop("float32", k, l2=l2), data)
    kernel = 0  # the hidden Dense's kernel: the regularized weight
    assert initial[kernel].shape == (FEATURES, 16)
    own_part = -lr * 2 * l2 * initial[kernel]
    np.testing.assert_allclose(whole[kernel] - plain[kernel], own_part, rtol=1e-4, atol=1e-6)
    tolerance = RELATIVE_TOLERANCE["float32"] * np.abs(whole[kernel] - initial[kernel]).max()
    assert (k - 1) * np.abs(own_part).max() > 1000 * tolerance  # the test can see the bug
    for position, (before, one, four) in enumerate(zip(initial, whole, accumulated,
                                                       strict=True)):
        change = np.abs(one - before).max()
        off = np.abs(four - one).max()
        assert off <= RELATIVE_TOLERANCE["float32"] * change, (position, off, change)


def test_a_micro_batch_that_overflows_skips_the_whole_accumulated_step():
    """mixed_float16: micro-batch 2 of 4 overflows float16 in its backward pass (its loss is
    finite). The whole step is skipped (weights and iterations unchanged), the scale halves
    ONCE, and the next step starts from empty accumulators: it equals a clean first step."""
    poisoned, clean = _data(poison_micro_batch=2), _data()
    loop = _loop("mixed_float16", 4)
    initial = [w.copy() for w in loop.model.get_weights()]
    after_skip = _one_step(loop, poisoned)
    assert int(loop.optimizer.iterations.numpy()) == 0
    assert float(loop.optimizer.dynamic_scale.numpy()) == 2.0**14  # from 2**15, halved once
    for before, now in zip(initial, after_skip, strict=True):
        np.testing.assert_array_equal(now, before)
    after_clean = _one_step(loop, clean)
    assert int(loop.optimizer.iterations.numpy()) == 1
    reference = _one_step(_loop("mixed_float16", 1), clean)
    for before, one, four in zip(initial, reference, after_clean, strict=True):
        change = np.abs(one - before).max()
        assert np.abs(four - one).max() <= RELATIVE_TOLERANCE["mixed_float16"] * change


def test_accumulators_are_float32_under_a_bfloat16_policy():
    import tensorflow as tf

    loop = _loop("mixed_bfloat16", 4)
    images, labels = (tf.constant(t) for t in _data())
    _stats, grads = tf.function(loop._gradients)(images, labels)
    assert [g.dtype for g in grads] == [tf.float32] * len(loop.model.trainable_variables)
    assert loop.model.layers[1].compute_dtype == "bfloat16"  # the model does compute in bf16


def test_a_batch_that_k_does_not_divide_is_a_clear_error():
    from ampflow.components.train.run.accumulation import split_micro_batches

    with pytest.raises(ConfigError, match="cannot be split into accumulation_steps=3"):
        split_micro_batches(np.zeros((32, 2), "float32"), 3)


def test_telemetry_and_the_guard_count_applied_steps(tmp_path):
    """2 epochs x 2 applied steps of 4 micro-batches, every other step overflowing: telemetry
    records 4 steps (not 16 micro-batches), each skip halves the scale once, and the guard sees
    one skipped step at a time."""
    import tensorflow as tf

    from ampflow.components.train.run.guard import GuardLimits
    from ampflow.components.train.run.strategy import Runtime
    from ampflow.components.train.run.telemetry import LossScaleTelemetry

    batches = [_data(poison_micro_batch=1), _data()]
    dataset = tf.data.Dataset.from_tensor_slices(
        tuple(np.stack([b[i] for b in batches]) for i in (0, 1))).repeat()
    runtime = Runtime(tf.distribute.get_strategy(), "default", "test")
    loop = TrainLoop(runtime, _model("mixed_float16"), LoopConfig(
        epochs=2, steps_per_epoch=2, global_batch_size=BATCH, jit_compile=False,
        loss_scaling=True, state_dir=str(tmp_path), progress=False, accumulation_steps=4))
    telemetry = LossScaleTelemetry(GuardLimits(max_consecutive_skipped=1))
    loop.fit(dataset, None, [telemetry])
    assert [(h["step"], h["skipped_steps"], h["loss_scale"]) for h in telemetry.history] == [
        (1, 1, 2.0**14), (2, 1, 2.0**14), (3, 2, 2.0**13), (4, 2, 2.0**13)]
    assert telemetry.guard.longest_run == 1
    assert int(loop.optimizer.iterations.numpy()) == 2


def test_batch_normalization_uses_each_micro_batchs_statistics():
    """As the how-to says: with K = 2, the moving mean moves twice per applied step, once
    towards each micro-batch's own mean (momentum 0.5: 0.25 m1 + 0.5 m2 from a zero start)."""
    import keras
    import tensorflow as tf

    from ampflow.components.train.run.strategy import Runtime
    from ampflow.modeling.heads import float32_head

    keras.utils.set_random_seed(3)
    inputs = keras.Input((FEATURES,))
    normalized = keras.layers.BatchNormalization(momentum=0.5, name="bn")(inputs)
    model = keras.Model(inputs, float32_head(normalized, CLASSES))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    loop = TrainLoop(Runtime(tf.distribute.get_strategy(), "default", "test"), model, LoopConfig(
        epochs=1, steps_per_epoch=1, global_batch_size=BATCH, jit_compile=False,
        loss_scaling=False, state_dir="", progress=False, accumulation_steps=2))
    images, labels = _data()
    loop.run_steps(iter(tf.data.Dataset.from_tensors((images, labels)).repeat()), 1)
    first, second = images[:BATCH // 2].mean(0), images[BATCH // 2:].mean(0)
    np.testing.assert_allclose(model.get_layer("bn").moving_mean.numpy(),
                               0.25 * first + 0.5 * second, rtol=1e-5, atol=1e-6)
