"""The training recipe: optimizer and weight decay, warm-up + cosine schedule, label smoothing."""

import numpy as np
import pytest

from ampflow.components.train import TrainConfig
from ampflow.components.train.precision.policy import PrecisionSetup
from ampflow.components.train.run.build import learning_schedule, make_optimizer
from ampflow.errors import ConfigError

FLOAT16 = PrecisionSetup("mixed_float16", "test", True, "test", "cpu")
FLOAT32 = PrecisionSetup("float32", "test", False, "test", "cpu")


def _config(**overrides):
    return TrainConfig(data_dir="d", output_dir="o", **overrides)


def test_cosine_schedule_warms_up_linearly_then_decays_to_zero():
    config = _config(lr_schedule="cosine", warmup_epochs=1, epochs=4)
    schedule = learning_schedule(config, 0.1, total_steps=400)  # 100 steps an epoch
    rates = [float(schedule(step)) for step in (0, 50, 100, 250, 400)]
    np.testing.assert_allclose(rates[:3], [0.0, 0.05, 0.1], atol=1e-7)
    np.testing.assert_allclose(rates[3], 0.1 * 0.5 * (1 + np.cos(np.pi * 150 / 300)), rtol=1e-5)
    assert rates[4] == pytest.approx(0.0, abs=1e-7)


def test_constant_schedule_is_the_plain_rate():
    assert learning_schedule(_config(), 0.1, total_steps=400) == 0.1


@pytest.mark.parametrize("name, cls", [("adam", "Adam"), ("adamw", "AdamW"), ("sgd", "SGD")])
def test_optimizer_carries_weight_decay_and_loss_scaling(name, cls):
    optimizer = make_optimizer(_config(optimizer=name, weight_decay=0.01), FLOAT16, 0.1)
    assert type(optimizer).__name__ == "LossScaleOptimizer"
    assert type(optimizer.inner_optimizer).__name__ == cls
    assert optimizer.inner_optimizer.weight_decay == pytest.approx(0.01)
    plain = make_optimizer(_config(optimizer=name), FLOAT32, 0.1)
    assert type(plain).__name__ == cls


def test_label_smoothing_raises_the_loss_of_a_confident_right_answer():
    from ampflow.components.train.run.loop import _train_loss

    labels = np.array([0, 1])
    probabilities = np.array([[0.98, 0.01, 0.01], [0.01, 0.98, 0.01]], "float32")
    plain = np.asarray(_train_loss(labels, probabilities, 0.0))
    smoothed = np.asarray(_train_loss(labels, probabilities, 0.1))
    assert np.all(smoothed > plain)
    # smoothed targets: 1 - 0.1 + 0.1/3 on the label, 0.1/3 elsewhere
    expected = -(0.9 + 0.1 / 3) * np.log(0.98) - 2 * (0.1 / 3) * np.log(0.01)
    np.testing.assert_allclose(smoothed, expected, rtol=1e-4)


@pytest.mark.parametrize("overrides, message", [
    ({"optimizer": "adagrad"}, "optimizer must be one of"),
    ({"lr_schedule": "step"}, "lr_schedule must be one of"),
    ({"label_smoothing": 1.0}, "label_smoothing must be in"),
    ({"weight_decay": -1.0}, "weight_decay must be >= 0"),
    ({"lr_schedule": "cosine", "warmup_epochs": 8, "epochs": 8}, "warmup_epochs must be <"),
])
def test_recipe_bad_values_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(**overrides)


def test_augment_auto_is_on_for_imagenet_architectures_only():
    from ampflow.components.train.config import AUGMENTED_BY_DEFAULT
    from ampflow.modeling.models import model_names

    assert len(AUGMENTED_BY_DEFAULT) == 2 and set(AUGMENTED_BY_DEFAULT) < set(model_names())
    for name in AUGMENTED_BY_DEFAULT:  # (a config only: no model is built here)
        assert _config(model=name).effective_augment
        assert not _config(model=name, augment=False).effective_augment
    assert not _config(model="small_cnn").effective_augment
    assert _config(model="small_cnn", augment=True).effective_augment
