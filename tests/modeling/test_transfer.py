"""The frozen-then-unfrozen recipe on a tiny pretrained-style model, under the three policies.

Phase 1: no backbone weight moves, BatchNormalization's moving statistics included (a frozen
BN normalizes with them, in inference mode), while the head's do. Phase 2: the backbone's
kernels and statistics move too.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from ampflow.errors import ConfigError
from ampflow.modeling.transfer import TransferRecipe, run_transfer_recipe, set_frozen

SLOW = pytest.mark.slow


def _model():
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    backbone = keras.Model(inputs, x, name="backbone")
    images = keras.Input((6, 6, 3))
    outputs = keras.layers.Dense(2, dtype="float32", name="logits")(backbone(images))
    return keras.Model(images, outputs), backbone


class Snapshots(keras.callbacks.Callback):
    """Every weight's value at the end of each phase (each `fit`)."""

    def __init__(self):
        super().__init__()
        self.taken = []

    def on_train_end(self, logs=None):
        self.taken.append({v.path: v.numpy().copy() for v in self.model.weights})


# two fits each: 7-8 s per policy at load average 10 on the 2-core host; the mixed ones slow
@pytest.mark.parametrize("policy", ("float32", pytest.param("mixed_bfloat16", marks=SLOW),
                                    pytest.param("mixed_float16", marks=SLOW)))
def test_frozen_weights_hold_in_phase_one_and_move_in_phase_two(policy):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model, backbone = _model()
    rng = np.random.default_rng(0)
    images = (3.0 + 2.0 * rng.standard_normal((16, 6, 6, 3))).astype(np.float32)
    labels = (images.mean(axis=(1, 2, 3)) > 3.0).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    start = {v.path: v.numpy().copy() for v in model.weights}
    snapshots = Snapshots()
    recipe = TransferRecipe(head_epochs=1, head_learning_rate=1e-2, fine_tune_epochs=1,
                            fine_tune_learning_rate=1e-2)
    histories = run_transfer_recipe(
        model, backbone, data, recipe, loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True), callbacks=[snapshots], shuffle=False, verbose=0)
    assert [h.epoch for h in histories] == [[0], [1]]
    phase1, phase2 = snapshots.taken
    backbone_paths = {v.path for v in backbone.weights}
    assert backbone_paths == {"conv/kernel", "conv/bias", "bn/gamma", "bn/beta",
                              "bn/moving_mean", "bn/moving_variance"}
    for path in backbone_paths:
        np.testing.assert_array_equal(phase1[path], start[path], err_msg=path)
        assert not np.array_equal(phase2[path], phase1[path]), path
    assert not np.array_equal(phase1["logits/kernel"], start["logits/kernel"])
    assert all(v.trainable for v in model.weights[:4]) and backbone.trainable


def test_a_frozen_batch_norm_normalizes_with_its_moving_statistics():
    keras.mixed_precision.set_global_policy("float32")
    _, backbone = _model()
    images = np.random.default_rng(1).standard_normal((4, 6, 6, 3)).astype(np.float32) + 5
    set_frozen(backbone, True)
    np.testing.assert_array_equal(backbone(images, training=True),
                                  backbone(images, training=False))
    set_frozen(backbone, False)
    assert not np.allclose(backbone(images, training=True), backbone(images, training=False))


@pytest.mark.parametrize("field,value", [("head_epochs", -1), ("fine_tune_epochs", 1.5),
                                         ("head_learning_rate", 0),
                                         ("fine_tune_learning_rate", -1e-5)])
def test_a_bad_recipe_is_one_line(field, value):
    with pytest.raises(ConfigError, match=f"{field} must be .*Received: {field}={value!r}"):
        TransferRecipe(**{field: value})
