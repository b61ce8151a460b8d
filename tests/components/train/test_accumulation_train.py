"""`ampflow train --accumulation-steps K` end to end (issue 40 point 1): one process, 2 local
workers, a killed run resumed, `--batch-size auto` answering with accumulation, the metadata.

The model is `dense_digits` below (no batch statistics, no dropout), a user's builder, so the
local launcher's worker processes (`python -m ampflow.cli`) import it from this folder. Every
run is one epoch of one or two applied steps on the offline digits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ampflow.components.train import TrainConfig, run_train
from ampflow.errors import ConfigError

HERE = Path(__file__).parent
MODEL = "test_accumulation_train:dense_digits"
# Final weights, K micro-batches vs the K-times-larger batch, relative to what training changed:
# float32 differs by summation order only; bfloat16/float16 round each micro-batch's matmuls.
RELATIVE_TOLERANCE = {"float32": 1e-4, "mixed_bfloat16": 3e-2, "mixed_float16": 4e-3}


def dense_digits(input_shape, num_classes, image_size=None):
    """Flatten -> Dense(16, relu) -> the float32 head: nothing that depends on the batch."""
    import keras

    from ampflow.components.train.heads import float32_head

    inputs = keras.Input(shape=input_shape, name="images")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(inputs, float32_head(x, num_classes))


def _config(data_dir, out, **overrides) -> TrainConfig:
    settings = dict(data_dir=data_dir, output_dir=out, model=MODEL, model_path=str(HERE),
                    precision="float32", jit_compile=False, epochs=1, steps_per_epoch=1,
                    optimizer="sgd", learning_rate=0.05, seed=5)
    settings.update(overrides)
    return TrainConfig(**settings)


def _weights(out: Path) -> list[np.ndarray]:
    import keras

    return [w.copy() for w in keras.models.load_model(out / "model.keras",
                                                      compile=False).get_weights()]


def _assert_same_step(accumulated: Path, whole: Path, initial: list[np.ndarray], policy: str):
    for before, one, many in zip(initial, _weights(whole), _weights(accumulated), strict=True):
        change = np.abs(one - before).max()
        assert change > 0
        assert np.abs(many - one).max() <= RELATIVE_TOLERANCE[policy] * change


def _initial_weights(policy: str) -> list[np.ndarray]:
    """The weights run_train starts from (it seeds with the config's seed, then builds)."""
    import keras

    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(5)
        return dense_digits((8, 8, 1), 10).get_weights()
    finally:
        keras.mixed_precision.set_global_policy(previous)


def test_zero_accumulation_steps_is_one_line(prepared_digits, tmp_path):
    with pytest.raises(ConfigError, match="accumulation_steps must be > 0"):
        _config(prepared_digits, tmp_path, accumulation_steps=0)


def test_effective_batch_needs_batch_size_auto(prepared_digits, tmp_path):
    with pytest.raises(ConfigError, match="effective_batch_size is what --batch-size auto aims"):
        _config(prepared_digits, tmp_path, effective_batch_size=64)
    with pytest.raises(ConfigError, match="leave --accumulation-steps out"):
        _config(prepared_digits, tmp_path, batch_size="auto", effective_batch_size=64,
                accumulation_steps=2)


def test_accumulated_batch_larger_than_the_split_is_one_line(prepared_digits, tmp_path):
    with pytest.raises(ConfigError, match=r"divided by the replicas \(1\) x accumulation_steps "
                                          r"\(400\)"):
        run_train(_config(prepared_digits, tmp_path / "out", batch_size=8,
                          accumulation_steps=400))


@pytest.mark.slow  # two short trainings
def test_one_process_accumulating_equals_the_larger_batch_and_says_so(prepared_digits,
                                                                      tmp_path):
    whole = run_train(_config(prepared_digits, tmp_path / "whole", batch_size=32))
    accumulated = run_train(_config(prepared_digits, tmp_path / "acc", batch_size=8,
                                    accumulation_steps=4))
    _assert_same_step(accumulated.output_dir, whole.output_dir, _initial_weights("float32"),
                      "float32")
    block = accumulated.metadata["accumulation"]
    assert (block["accumulation_steps"], block["micro_batch_size"],
            block["effective_batch_size"], block["accumulator_dtype"]) == (4, 8, 32, "float32")
    assert accumulated.metadata["distribution"]["global_batch_size"] == 32
    assert accumulated.metadata["steps_per_epoch"] == 1  # applied steps
    assert whole.metadata["accumulation"]["accumulation_steps"] == 1


@pytest.mark.slow  # starts 2 worker processes
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_two_workers_accumulating_equal_one_process_on_the_larger_batch(policy, prepared_digits,
                                                                        tmp_path):
    """2 workers x K=2 x micro-batch 8 = one process at batch 32, after one applied step; each
    worker all-reduced once per applied step (counted as the step ran), not per micro-batch."""
    whole = run_train(_config(prepared_digits, tmp_path / "whole", batch_size=32,
                              precision=policy))
    workers = run_train(_config(prepared_digits, tmp_path / "workers", batch_size=8,
                                accumulation_steps=2, workers=2, precision=policy))
    meta = workers.metadata
    assert meta["distribution"]["num_workers"] == 2
    assert meta["distribution"]["weights_identical_on_all_workers"] is True
    assert meta["accumulation"]["effective_batch_size"] == 32
    assert meta["accumulation"]["allreduce_calls_per_applied_step"] == 1.0
    _assert_same_step(workers.output_dir, whole.output_dir, _initial_weights(policy), policy)


@pytest.mark.slow  # trains through the ampflow CLI in child processes, one of them killed
def test_killed_accumulating_run_resumes_to_the_weights_of_an_unkilled_one(prepared_digits,
                                                                           tmp_path):
    """Checkpoints every applied step (K = 4); the first run is SIGKILLed once two are saved,
    the rerun resumes from the newest and ends on the weights of a run never killed."""
    steps = 30

    def cmd(out, durable):
        return [sys.executable, "-m", "ampflow.cli", "train", "--data-dir",
                str(prepared_digits), "--output-dir", str(out), "--checkpoint-dir",
                str(durable), "--model", MODEL, "--model-path", str(HERE), "--precision",
                "float32", "--xla", "off", "--epochs", "1", "--steps-per-epoch", str(steps),
                "--batch-size", "8", "--accumulation-steps", "4", "--optimizer", "sgd",
                "--learning-rate", "0.05", "--seed", "5", "--checkpoint-every-n-steps", "1"]

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    durable = tmp_path / "durable"
    first = subprocess.Popen(cmd(tmp_path / "pod1", durable), env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and first.poll() is None:
            if len(list((durable / "backup").glob("*.index"))) >= 2:
                break
            time.sleep(0.01)
        assert first.poll() is None, "the first run ended before it could be killed"
        first.kill()
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    resumed = subprocess.run(cmd(tmp_path / "pod2", durable), env=env, capture_output=True,
                             text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    unkilled = subprocess.run(cmd(tmp_path / "whole", tmp_path / "durable-whole"), env=env,
                              capture_output=True, text=True, timeout=240)
    assert unkilled.returncode == 0, unkilled.stderr[-3000:]
    meta = json.loads((tmp_path / "pod2" / "metadata.json").read_text())
    assert 0 < meta["checkpoint"]["resumed_at_step"] < steps
    for mine, reference in zip(_weights(tmp_path / "pod2"), _weights(tmp_path / "whole"),
                               strict=True):
        np.testing.assert_allclose(mine, reference, rtol=0, atol=1e-6)
