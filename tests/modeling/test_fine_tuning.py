"""BERT's fine-tuning optimizer: the warm-up/decay learning rate by value, AdamW's decay rules."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from ampflow.errors import ConfigError
from ampflow.modeling.fine_tuning import (
    FineTuneOptimizerConfig,
    WarmupLinearDecay,
    fine_tune_optimizer,
)


def _values(schedule, steps):
    return [float(schedule(step)) for step in steps]


def test_the_rate_rises_linearly_to_the_peak_then_falls_linearly_to_zero():
    schedule = WarmupLinearDecay(4e-5, warmup_steps=10, total_steps=110)
    got = _values(schedule, [0, 1, 5, 10, 11, 60, 109, 110, 150])
    want = [0.0, 4e-6, 2e-5, 4e-5, 4e-5 * 99 / 100, 2e-5, 4e-7, 0.0, 0.0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_without_warmup_the_first_step_takes_the_peak():
    schedule = WarmupLinearDecay(1e-3, warmup_steps=0, total_steps=4)
    np.testing.assert_allclose(_values(schedule, range(5)), [1e-3, 7.5e-4, 5e-4, 2.5e-4, 0.0],
                               rtol=1e-6)


def test_the_schedule_runs_on_the_optimizers_int64_iterations_in_a_graph():
    import tensorflow as tf

    schedule = WarmupLinearDecay(2e-5, warmup_steps=3, total_steps=9)
    traced = tf.function(lambda step: schedule(step))
    np.testing.assert_allclose(float(traced(tf.constant(6, tf.int64))), 1e-5, rtol=1e-6)


def test_the_config_takes_ten_percent_warmup_rounded_up():
    schedule = FineTuneOptimizerConfig(learning_rate=5e-5).schedule(total_steps=95)
    assert (schedule.warmup_steps, schedule.total_steps, schedule.peak_learning_rate) == (
        10, 95, 5e-5)


def test_the_optimizer_follows_the_schedule_step_by_step():
    optimizer = fine_tune_optimizer(FineTuneOptimizerConfig(learning_rate=1e-3,
                                                            warmup_fraction=0.5), 4)
    variable = keras.Variable(np.ones(3, np.float32), name="kernel")
    seen = []
    for _ in range(5):
        seen.append(float(optimizer.learning_rate))
        optimizer.apply_gradients([(np.ones(3, np.float32), variable)])
    np.testing.assert_allclose(seen, [0.0, 5e-4, 1e-3, 5e-4, 0.0], rtol=1e-6, atol=1e-12)


def test_weight_decay_skips_layer_norm_and_biases():
    """With zero gradients only the decoupled decay moves a variable: kernels shrink, not these."""
    optimizer = fine_tune_optimizer(FineTuneOptimizerConfig(
        learning_rate=0.1, warmup_fraction=0.0, weight_decay=0.5), 10)
    layer_norm = keras.layers.LayerNormalization()
    dense = keras.layers.Dense(2)
    layer_norm.build((None, 2))
    dense.build((None, 2))
    variables = [dense.kernel, dense.bias, layer_norm.gamma, layer_norm.beta]
    for v in variables[1:]:
        v.assign(np.ones(v.shape, np.float32))
    before = [v.numpy().copy() for v in variables]
    optimizer.apply_gradients([(np.zeros(v.shape, np.float32), v) for v in variables])
    np.testing.assert_allclose(dense.kernel.numpy(), before[0] * (1 - 0.1 * 0.5), rtol=1e-6)
    for v, was in zip(variables[1:], before[1:], strict=True):
        np.testing.assert_array_equal(v.numpy(), was, err_msg=v.path)


def test_the_optimizer_is_adamw_with_berts_settings():
    optimizer = fine_tune_optimizer(FineTuneOptimizerConfig(), 100)
    assert isinstance(optimizer, keras.optimizers.AdamW)
    assert (optimizer.weight_decay, optimizer.epsilon, optimizer.global_clipnorm) == (
        0.01, 1e-6, 1.0)
    restored = WarmupLinearDecay.from_config(optimizer.get_config()["learning_rate"]["config"])
    assert restored.get_config() == {"peak_learning_rate": 3e-5, "warmup_steps": 10,
                                     "total_steps": 100}


@pytest.mark.parametrize("arguments,expected", [
    ((0.0, 1, 10), "peak_learning_rate must be > 0. Received: peak_learning_rate=0.0"),
    ((1e-5, 11, 10), "warmup_steps must be an integer in \\[0, total_steps=10\\]"),
    ((1e-5, 0, 0), "total_steps must be an integer >= 1. Received: total_steps=0")])
def test_a_bad_schedule_is_one_line(arguments, expected):
    with pytest.raises(ConfigError, match=expected):
        WarmupLinearDecay(*arguments)


@pytest.mark.parametrize("field,value", [("learning_rate", -1.0), ("warmup_fraction", 1.5),
                                         ("weight_decay", -0.1), ("epsilon", 0),
                                         ("global_clipnorm", 0)])
def test_a_bad_optimizer_setting_is_one_line(field, value):
    with pytest.raises(ConfigError, match=f"{field} must be .*Received: {field}={value!r}"):
        FineTuneOptimizerConfig(**{field: value})
