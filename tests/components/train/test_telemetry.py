"""Loss-scale telemetry reads the device only on the steps it records (issue 13, item 3)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from ampflow.components.train.run import telemetry as telemetry_module
from ampflow.components.train.run.telemetry import GuardLimits, LossScaleTelemetry
from ampflow.errors import TrainingDivergedError


class CountedLoss:
    """A loss value that counts how often it is read back (each read is a host sync)."""

    reads = 0

    def __float__(self):
        CountedLoss.reads += 1
        return 0.5


class _Model:
    def __init__(self):
        self.optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
        self.optimizer.build([keras.Variable(np.zeros(2, "float32"))])


@pytest.fixture
def conversions(monkeypatch):
    """Count every device-to-host conversion telemetry makes."""
    count = {"n": 0}
    real = keras.ops.convert_to_numpy

    def counted(x):
        count["n"] += 1
        return real(x)

    monkeypatch.setattr(telemetry_module.keras.ops, "convert_to_numpy", counted)
    return count


def _callback(every_n):
    # the stand-in optimizer never steps: every step reads as skipped, which is not judged here
    callback = LossScaleTelemetry(GuardLimits(warmup_steps=1000, max_consecutive_skipped=1000),
                                  every_n=every_n)
    callback.set_model(_Model())
    callback.set_params({"steps": 100, "epochs": 1})
    callback.on_epoch_begin(0)
    return callback


def test_fit_logs_are_read_only_on_recorded_steps(conversions):
    CountedLoss.reads = 0
    callback = _callback(every_n=10)
    for batch in range(25):
        callback.on_train_batch_end(batch, {"loss": CountedLoss()})
    assert [h["step"] for h in callback.history] == [10, 20]
    assert CountedLoss.reads == 2  # was 25: one sync per step whatever every_n said
    assert conversions["n"] == 4  # scale + iterations on the two recorded steps (was 50)


def test_packed_loop_logs_cost_one_transfer_per_recorded_step(conversions):
    callback = _callback(every_n=5)
    packed = keras.ops.convert_to_tensor(np.array([0.25, 1024.0, 8.0]))
    for batch in range(10):
        callback.on_train_batch_end(batch, {telemetry_module.TELEMETRY_KEY: packed})
    assert conversions["n"] == 2
    assert callback.history[0]["loss_scale"] == 1024.0
    assert callback.history[0]["skipped_steps"] == 5 - 8
    assert callback.history[0]["loss"] == 0.25


def test_guard_still_sees_a_nan_loss_at_the_epoch_end_between_records():
    callback = _callback(every_n=1000)
    callback.on_train_batch_end(0, {"loss": float("nan")})  # not a recorded step: not read
    with pytest.raises(TrainingDivergedError, match="non-finite"):
        callback.on_epoch_end(0, {"loss": float("nan")})
