"""The trainer says, per epoch, whether its input pipeline held it back (issue 22, part 4).

Each step times its wait for the batch inside its graph; the epoch's share of waiting goes to
the logs (`input_wait_fraction`) and a warning names the bottleneck when it reaches
INPUT_BOUND_FRACTION. No timing is asserted here: the slow input is made *much* slower than the
step (a py_function that sleeps 0.25 s per batch, against a step of milliseconds) and the fast
input much faster (one batch in memory, against a step of heavy matrix products), and the tests
assert on the verdict only.
"""

from __future__ import annotations

import logging
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from ampflow.components.train.run.loop import (
    INPUT_BOUND_FRACTION,
    LoopConfig,
    Runtime,
    TrainLoop,
    input_wait_fraction,
    is_input_bound,
)

BATCH = 8
FEATURES = 64


class _EpochLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs: list[dict] = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs or {}))


def _model(width: int, depth: int):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((FEATURES,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    layers += [keras.layers.Dense(2, activation="softmax")]
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="sparse_categorical_crossentropy")
    return model


def _batches(batch: int) -> tf.data.Dataset:
    x = np.random.default_rng(0).normal(size=(batch, FEATURES)).astype("float32")
    y = np.zeros(batch, "int64")
    return tf.data.Dataset.from_tensors((x, y)).repeat()


def _slowed(ds: tf.data.Dataset, seconds: float) -> tf.data.Dataset:
    """Every batch waits `seconds` in a py_function: far slower than any step here."""
    def sleep(x):
        time.sleep(seconds)
        return x

    def slow(x, y):
        x = tf.py_function(sleep, [x], tf.float32)
        return tf.ensure_shape(x, (None, FEATURES)), y

    return ds.map(slow)


def _fit(model, dataset, steps: int, tmp_path, batch: int):
    runtime = Runtime(tf.distribute.get_strategy(), "default", "test")
    loop = TrainLoop(runtime, model, LoopConfig(
        epochs=1, steps_per_epoch=steps, global_batch_size=batch, jit_compile=False,
        loss_scaling=False, state_dir=str(tmp_path), progress=False))
    recorder = _EpochLogs()
    loop.fit(dataset, None, [recorder])
    return loop, recorder.logs[0]


def test_a_much_slower_input_is_reported_as_input_bound(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ampflow.components.train.run.loop")
    loop, logs = _fit(_model(8, 1), _slowed(_batches(BATCH), 0.25), 5, tmp_path, BATCH)

    assert is_input_bound(logs["input_wait_fraction"])
    assert loop.input_wait_seconds > 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("epoch 1/1 was input-bound" in m and "performance.md" in m for m in warnings)


def test_an_input_already_in_memory_is_not_input_bound(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ampflow.components.train.run.loop")
    batch = 512  # heavy steps (4 layers of 1024x1024 products) against a batch in memory
    _, logs = _fit(_model(1024, 4), _batches(batch).prefetch(2), 6, tmp_path, batch)

    assert not is_input_bound(logs["input_wait_fraction"])
    messages = [r.getMessage() for r in caplog.records]
    assert any("epoch 1/1: not input-bound" in m for m in messages)
    assert not any("input-bound:" in m for m in messages)


@pytest.mark.parametrize(("waited", "seconds", "fraction"), [
    (0.0, 10.0, 0.0), (5.0, 10.0, 0.5), (12.0, 10.0, 1.0), (1.0, 0.0, 0.0), (-1.0, 1.0, 0.0)])
def test_input_wait_fraction_is_a_share_of_the_epoch(waited, seconds, fraction):
    assert input_wait_fraction(waited, seconds) == fraction


def test_the_threshold_is_the_documented_one():
    assert is_input_bound(INPUT_BOUND_FRACTION)
    assert not is_input_bound(INPUT_BOUND_FRACTION / 2)


def test_the_epoch_log_records_the_input_wait(tmp_path):
    from ampflow.components.train.run.telemetry import EpochLog, read_epoch_log

    runtime = Runtime(tf.distribute.get_strategy(), "default", "test")
    loop = TrainLoop(runtime, _model(8, 1), LoopConfig(
        epochs=2, steps_per_epoch=3, global_batch_size=BATCH, jit_compile=False,
        loss_scaling=False, state_dir=str(tmp_path), progress=False))
    loop.fit(_slowed(_batches(BATCH), 0.2), None, [EpochLog(tmp_path / "epochs.jsonl", BATCH)])
    entries = read_epoch_log(tmp_path / "epochs.jsonl")
    assert [e["epoch"] for e in entries] == [1, 2]
    assert all(is_input_bound(e["input_wait_fraction"]) for e in entries)
