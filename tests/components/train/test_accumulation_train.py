"""`ampflow train --accumulation-steps K` end to end (issue 40 point 1): one process, the
launcher's workers, a killed run resumed, `--batch-size auto` answering with accumulation, the
metadata.

The model is `dense_digits` below (no batch statistics, no dropout), a user's builder, so the
local launcher's worker processes (`python -m ampflow.cli`) import it from this folder. Every
run is one epoch of one or two applied steps on the offline digits.
"""

from __future__ import annotations

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

    from ampflow.modeling.heads import float32_head

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


def test_zero_accumulation_steps_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="accumulation_steps must be > 0"):
        _config(tmp_path, tmp_path, accumulation_steps=0)


def test_effective_batch_needs_batch_size_auto(tmp_path):
    with pytest.raises(ConfigError, match="effective_batch_size is what --batch-size auto aims"):
        _config(tmp_path, tmp_path, effective_batch_size=64)
    with pytest.raises(ConfigError, match="leave --accumulation-steps out"):
        _config(tmp_path, tmp_path, batch_size="auto", effective_batch_size=64,
                accumulation_steps=2)


def test_accumulated_batch_larger_than_the_split_is_one_line(prepared_digits, tmp_path):
    with pytest.raises(ConfigError, match=r"divided by the replicas \(1\) x accumulation_steps "
                                          r"\(400\)"):
        run_train(_config(prepared_digits, tmp_path / "out", batch_size=8,
                          accumulation_steps=400))


def test_auto_batch_answers_with_accumulation_when_the_wanted_batch_does_not_fit():
    """The rule: K = ceil(wanted / fits), micro-batch wanted // K."""
    from ampflow.components.train.run.memory import BatchChoice, accumulation_for, with_accumulation

    assert accumulation_for(256, 100) == (85, 3)  # 255: the nearest below, by less than K
    assert accumulation_for(256, 64) == (64, 4)
    assert accumulation_for(64, 64) == (64, 1)
    assert accumulation_for(48, 1000) == (48, 1)
    choice = with_accumulation(BatchChoice(32, "kept 32 on a CPU"), 128)
    assert (choice.batch_size, choice.accumulation_steps) == (32, 4)
    assert choice.to_json()["effective_batch_size"] == 128
    assert "128 does not fit (kept 32 on a CPU): 4 accumulation steps" in choice.reason


@pytest.mark.slow  # three short trainings
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
    # --batch-size auto on a CPU keeps 32 per step: a wanted 64 is 2 steps of 32
    auto = run_train(_config(prepared_digits, tmp_path / "auto", batch_size="auto",
                             effective_batch_size=64))
    assert (auto.metadata["accumulation"]["micro_batch_size"],
            auto.metadata["accumulation"]["accumulation_steps"],
            auto.metadata["batch_size_auto"]["effective_batch_size"]) == (32, 2, 64)


def test_local_workers_are_started_with_the_accumulation_steps(tmp_path):
    """--workers N hands K to every worker (the 2-worker run: test_scaling_options.py)."""
    from ampflow.components.train.clusters.launcher import config_to_argv

    argv = config_to_argv(_config(tmp_path, tmp_path, batch_size=8, accumulation_steps=2,
                                  workers=2))
    assert argv[argv.index("--accumulation-steps") + 1] == "2"


@pytest.mark.slow  # trains in a child process that is killed, then twice more
def test_killed_accumulating_run_resumes_to_the_weights_of_an_unkilled_one(prepared_digits,
                                                                           tmp_path):
    """Checkpoints every applied step (K = 4); the first run is SIGKILLed once two are saved,
    the rerun resumes from the newest and ends on the weights of a run never killed: the
    checkpoint holds no half-accumulated step, and the input resumes past the batches used."""
    steps = 12
    args = ["--model", MODEL, "--model-path", str(HERE), "--precision", "float32", "--xla", "off",
            "--epochs", "1", "--steps-per-epoch", str(steps), "--batch-size", "8",
            "--accumulation-steps", "4", "--optimizer", "sgd", "--learning-rate", "0.05",
            "--seed", "5", "--checkpoint-every-n-steps", "1"]

    def cmd(out):
        return [sys.executable, "-m", "ampflow.cli", "train", "--data-dir",
                str(prepared_digits), "--output-dir", str(out), "--checkpoint-dir",
                str(durable), *args]

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    durable = tmp_path / "durable"
    first = subprocess.Popen(cmd(tmp_path / "pod1"), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
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
    resumed = run_train(_config(prepared_digits, tmp_path / "pod2", checkpoint_dir=str(durable),
                                steps_per_epoch=steps, batch_size=8, accumulation_steps=4,
                                checkpoint_every_n_steps=1))
    assert 0 < resumed.metadata["checkpoint"]["resumed_at_step"] < steps
    unkilled = run_train(_config(prepared_digits, tmp_path / "whole", steps_per_epoch=steps,
                                 batch_size=8, accumulation_steps=4, checkpoint_every_n_steps=1))
    assert unkilled.metadata["checkpoint"]["resumed_at_step"] is None
    for mine, reference in zip(_weights(resumed.output_dir), _weights(unkilled.output_dir),
                               strict=True):
        np.testing.assert_allclose(mine, reference, rtol=0, atol=1e-6)


def test_the_pipeline_and_run_local_pass_the_accumulation_steps(tmp_path):
    """One default (TrainConfig's) for the pipeline parameter, run-local's flag and the KFP
    component; both train tasks (AMP and the float32 baseline) take the run's value."""
    import dataclasses
    import inspect

    import yaml

    from ampflow.components.train.component import train
    from ampflow.pipeline.parameters import PIPELINE_PARAMETERS, check_arguments
    from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline
    from ampflow.pipeline.run_local import LocalRunConfig

    default = TrainConfig.__dataclass_fields__["accumulation_steps"].default
    local = {f.name: f.default for f in dataclasses.fields(LocalRunConfig)}
    assert (PIPELINE_PARAMETERS["accumulation_steps"][:2], local["accumulation_steps"],
            inspect.signature(train).parameters["accumulation_steps"].default) == (
        (int, default), default, default)
    assert LocalRunConfig(workdir=tmp_path, accumulation_steps=4).arguments()[
        "accumulation_steps"] == 4
    with pytest.raises(ConfigError, match="accumulation_steps must be > 0"):
        LocalRunConfig(workdir=tmp_path, accumulation_steps=0)
    with pytest.raises(ConfigError, match="accumulation_steps must be an integer >= 1"):
        check_arguments({"accumulation_steps": 0})
    path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(gpu=False))
    spec = next(yaml.safe_load_all(Path(path).read_text()))
    tasks = spec["root"]["dag"]["tasks"]
    for task in ("train", "train-2"):
        assert tasks[task]["inputs"]["parameters"]["accumulation_steps"] == {
            "componentInputParameter": "accumulation_steps"}, task
