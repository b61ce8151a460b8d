import json
import math
import time

import numpy as np
import pytest

from ampflow.artifacts.model_dir import load_trained_model
from ampflow.components.train import TrainConfig, run_train
from ampflow.errors import ConfigError, DatasetError, ModelLoadError, TrainingDivergedError
from ampflow.modeling.models import build_model, register_model


@pytest.mark.slow
def test_train_mixed_float16_on_cpu_has_loss_scaling_and_float32_output(trained_model):
    import keras

    model_dir = trained_model("mixed_float16")
    model, meta = load_trained_model(model_dir)
    assert meta["precision"]["policy"] == "mixed_float16"
    assert meta["precision"]["loss_scaling"] == "dynamic"
    # the first conv layer, whatever Keras's process-wide name counter called it
    conv = next(layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D))
    assert conv.dtype_policy.name == "mixed_float16"
    assert model.get_layer("logits").dtype_policy.name == "float32"
    assert model.output.dtype == "float32"
    assert all(math.isfinite(e["loss"]) for e in meta["epochs"])
    history = json.loads((model_dir / "loss_scale_history.json").read_text())
    assert len(history) == meta["loss_scale"]["steps"] > 0
    assert all(h["loss_scale"] >= 1.0 for h in history)
    assert meta["loss_scale"]["skipped_fraction"] < 0.05
    assert meta["throughput_examples_per_sec"] > 0
    assert (model_dir / "tensorboard").is_dir()
    assert not (model_dir / "backup").exists()  # removed after a successful run
    # the resolved config next to the model, as every step writes it (README)
    assert json.loads((model_dir / "config.json").read_text()) == meta["config"]
    recompiled = keras.saving.load_model(model_dir / "model.keras")
    assert isinstance(recompiled.optimizer, keras.optimizers.LossScaleOptimizer)


@pytest.mark.slow
def test_train_default_model_learns_the_offline_digits(trained_model, prepared_digits):
    """Chance is 10 %; 6 epochs of the small CNN reach ~95 %, so 90 % leaves room for noise."""
    from ampflow.data import load_arrays

    model, meta = load_trained_model(trained_model("mixed_float16"))
    images, labels = load_arrays(prepared_digits, "test")
    accuracy = float(np.mean(np.argmax(model.predict(images.astype("float32"), verbose=0), 1)
                             == labels))
    assert accuracy > 0.90
    np.testing.assert_allclose(meta["final_metrics"]["val_accuracy"], accuracy, atol=0.02)


@pytest.mark.slow
def test_train_mixed_bfloat16_records_no_loss_scaling(trained_model):
    _, meta = load_trained_model(trained_model("mixed_bfloat16"))
    assert meta["precision"]["compute_dtype"] == "bfloat16"
    assert meta["precision"]["loss_scaling"] == "none"
    assert meta["loss_scale"] == {"enabled": False}


def _inf_gradient_cnn(input_shape, num_classes, image_size):
    """A model whose backward pass always overflows: every step is skipped by the optimizer.

    The inf comes from 1/0 at run time, not from an inf constant, which the AMP check refuses
    under mixed_float16 before any step runs (an overflowing constant that is multiplied).
    """
    import keras
    import tensorflow as tf

    from ampflow.modeling.models import float32_head

    class InfGradient(keras.layers.Layer):
        def call(self, x):
            @tf.custom_gradient
            def identity_with_inf_grad(t):
                return tf.identity(t), lambda dy: dy + tf.math.reciprocal(tf.zeros_like(dy))

            return identity_with_inf_grad(x)

    inputs = keras.Input(shape=input_shape, name="images")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    x = InfGradient()(keras.layers.Dense(16, activation="relu")(x))
    return keras.Model(inputs, float32_head(x, num_classes))


register_model("test_inf_gradient", _inf_gradient_cnn)


@pytest.mark.slow
def test_train_infinite_gradients_trip_the_scale_floor_and_publish_nothing(prepared_digits,
                                                                           tmp_path):
    config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path, model="test_inf_gradient",
                         precision="mixed_float16", epochs=10, steps_per_epoch=4,
                         guard_warmup_steps=1000)
    with pytest.raises(TrainingDivergedError, match=r"loss scale fell to 0.5.*below the floor 1"):
        run_train(config)
    assert not (tmp_path / "metadata.json").exists()
    assert not (tmp_path / "model.keras").exists()
    assert any((tmp_path / "backup").iterdir())  # the checkpoint is kept for a post-mortem
    history = json.loads((tmp_path / "loss_scale_history.json").read_text())
    assert [h["loss_scale"] for h in history[:3]] == [16384.0, 8192.0, 4096.0]
    assert history[-1]["skipped_steps"] == history[-1]["step"]


@pytest.mark.slow
def test_train_every_step_skipped_with_a_lowered_floor_stops_the_run(prepared_digits, tmp_path):
    """The floor out of the way, the run of skipped steps stops it (guard.py, rule 3)."""
    config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path, model="test_inf_gradient",
                         precision="mixed_float16", epochs=4, steps_per_epoch=10,
                         loss_scale_floor=1e-30)
    with pytest.raises(TrainingDivergedError,
                       match=r"16 steps in a row were skipped.*up to step 16 \(limit 15.*"
                             r"likely causes"):
        run_train(config)
    assert not (tmp_path / "metadata.json").exists()
    history = json.loads((tmp_path / "loss_scale_history.json").read_text())
    assert history[-1]["step"] == history[-1]["skipped_steps"] == 16


@pytest.mark.slow
def test_train_absurd_learning_rate_gives_non_finite_loss_error(prepared_digits, tmp_path,
                                                                 caplog):
    config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path, precision="float32",
                         learning_rate=1e30, optimizer="sgd", epochs=2, steps_per_epoch=4)
    with caplog.at_level("WARNING"), pytest.raises(TrainingDivergedError, match="non-finite"):
        run_train(config)
    assert not (tmp_path / "model.keras").exists()
    # 4 steps an epoch because --steps-per-epoch says so, not the data (1,438 digits): no
    # "too few to learn from" warning blaming the examples
    assert "an epoch is" not in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": "resnet5"}, "model must be a built-in name"),
        ({"precision": "fp16"}, "precision must be one of"),
        ({"batch_size": 0}, "batch_size must be > 0. Received: batch_size=0"),
        ({"epochs": -1}, "epochs must be > 0"),
        ({"learning_rate": 0.0}, "learning_rate must be > 0"),
    ],
)
def test_train_config_bad_values_are_rejected_before_compute(overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(data_dir=tmp_path, output_dir=tmp_path / "out", **overrides)


@pytest.mark.slow
def test_train_batch_larger_than_the_split_fails_and_keeps_the_published_model(
        trained_model, tmp_path):
    import shutil

    shutil.copytree(trained_model("mixed_float16"), tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "metadata.json").read_text())
    data_dir = meta["config"]["data_dir"]
    with pytest.raises(ConfigError, match="batch_size must be <= the training split size"):
        run_train(TrainConfig(data_dir=data_dir, output_dir=tmp_path / "m", batch_size=5000))
    load_trained_model(tmp_path / "m")  # still published


def test_train_unprepared_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="not a prepared dataset"):
        run_train(TrainConfig(data_dir=tmp_path / "nothing", output_dir=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_train_unwritable_output_dir_is_a_clear_error(prepared_digits, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="output_dir must be a writable directory"):
        run_train(TrainConfig(data_dir=prepared_digits, output_dir=blocker / "out"))


def test_load_trained_model_incomplete_or_corrupt_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="not a published model"):
        load_trained_model(tmp_path)
    (tmp_path / "model.keras").write_bytes(b"not a zip")
    (tmp_path / "metadata.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="metadata.json is corrupt"):
        load_trained_model(tmp_path)
    (tmp_path / "metadata.json").write_text('{"model_name": "small_cnn"}')
    with pytest.raises(ModelLoadError, match=r"Received: missing \['input_shape'"):
        load_trained_model(tmp_path)


@pytest.mark.slow
def test_load_trained_model_corrupt_keras_file_is_a_clear_error(trained_model, tmp_path):
    import shutil

    shutil.copytree(trained_model("mixed_float16"), tmp_path / "m")
    model_file = tmp_path / "m" / "model.keras"
    whole = model_file.read_bytes()
    model_file.write_bytes(whole[: len(whole) // 2])  # a truncated copy
    with pytest.raises(ModelLoadError) as info:
        load_trained_model(tmp_path / "m")
    assert "not a readable .keras archive (truncated or corrupt" in str(info.value)
    assert "File not found" not in str(info.value)
    model_file.write_bytes(b"not a zip")
    with pytest.raises(ModelLoadError, match="truncated or corrupt, 9 bytes"):
        load_trained_model(tmp_path / "m")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_build_application_models_take_raw_8x8_images_and_output_float32(name):
    import keras

    model = build_model(name, (8, 8, 1), 10, policy="mixed_bfloat16")
    assert keras.mixed_precision.global_policy().name == "float32"  # restored
    out = model(np.zeros((2, 8, 8, 1), "float32"))
    assert tuple(out.shape) == (2, 10) and keras.backend.standardize_dtype(out.dtype) == "float32"
    assert model.get_layer("logits").dtype_policy.name == "float32"


# A SIGKILLed run resumed from its durable --checkpoint-dir in a fresh output dir (a KFP retry):
# tests/components/train/test_checkpoint_faults.py, whose kill/resume run also tears the newest
# checkpoint (one kill/resume pair for both checks).


def test_epoch_log_throughput_counts_training_steps_not_validation(tmp_path):
    from ampflow.components.train.run.telemetry import EpochLog, read_epoch_log

    epoch_log = EpochLog(tmp_path / "epochs.jsonl", batch_size=8)
    epoch_log.set_params({"steps": 4})
    epoch_log.on_epoch_begin(0)
    for batch in range(4):
        epoch_log.on_train_batch_end(batch)
    time.sleep(0.2)  # validation: part of the epoch, not of training throughput
    epoch_log.on_epoch_end(0, {"loss": 1.0})
    (entry,) = read_epoch_log(tmp_path / "epochs.jsonl")
    assert entry["seconds"] >= entry["train_seconds"] + 0.2
    assert entry["examples_per_sec"] == pytest.approx(4 * 8 / entry["train_seconds"])


def test_train_unwritable_checkpoint_dir_is_a_clear_error(prepared_digits, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="checkpoint_dir must be a writable directory"):
        run_train(TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "out",
                              checkpoint_dir=str(blocker / "ckpt")))
    assert not (tmp_path / "out" / "metadata.json").exists()


_REFUSED_BEFORE_TF = {  # env, --model, the start of the one error line
    "bad-tf-config": ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": 3}'}, "small_cnn",
                      "TF_CONFIG must name this process's task"),
    "unknown-model": ({}, "small_cnm", "model must be a built-in name"),
    "builder-module-missing": ({}, "no_such_pkg.models:build",
                               "model module 'no_such_pkg.models' does not import"),
}


@pytest.mark.parametrize("case", list(_REFUSED_BEFORE_TF))
def test_what_needs_no_tensorflow_is_refused_before_it_starts(case, prepared_digits, tmp_path):
    # a bad TF_CONFIG or --model used to wait for TensorFlow's start-up (3-4 CPU-s; on a
    # cluster, at every restart of a bad worker) before its one-line error
    import os
    import subprocess
    import sys

    env, model, message = _REFUSED_BEFORE_TF[case]
    script = ("import sys\n"
              "from ampflow.components.train import TrainConfig, run_train\n"
              "from ampflow.errors import ConfigError\n"
              "try:\n"
              f"    run_train(TrainConfig(data_dir={str(prepared_digits)!r}, "
              f"output_dir={str(tmp_path / 'out')!r}, model={model!r}))\n"
              "except ConfigError as e:\n"
              "    print('refused:', e)\n"
              "print('tensorflow imported:', 'tensorflow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    refused, imported = done.stdout.splitlines()
    assert refused.startswith(f"refused: {message}"), done.stdout
    assert imported == "tensorflow imported: False"
    assert not (tmp_path / "out").exists()
