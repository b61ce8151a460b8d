"""FusedBatchNormalization must compute exactly what keras.layers.BatchNormalization does."""

import functools

import numpy as np
import pytest

from ampflow.modeling.layers import FusedBatchNormalization, MatmulGradientConv2D
from ampflow.modeling.models import build_model

SHAPE = (4, 5, 6, 8)  # NHWC, tiny
# float32 differs by summation order only; half precision outputs by one rounding of the
# (identical float32) result at most: one ULP, relative to the output's magnitude.
OUTPUT_ATOL = {"float32": 1e-5, "mixed_bfloat16": 2e-2, "mixed_float16": 2e-3}
OUTPUT_RTOL = {"float32": 0.0, "mixed_bfloat16": 2.0**-7, "mixed_float16": 2.0**-10}


def _pair(policy, **kwargs):
    """A Keras BN and a fused BN with the same random weights, built under `policy`."""
    import keras

    keras.mixed_precision.set_global_policy(policy)
    reference = keras.layers.BatchNormalization(**kwargs)
    fused = FusedBatchNormalization(**kwargs)
    rng = np.random.default_rng(1)
    for layer in (reference, fused):
        layer.build(SHAPE)
    weights = [rng.uniform(0.5, 1.5, w.shape).astype("float32") for w in reference.weights]
    reference.set_weights(weights)
    fused.set_weights(weights)
    return reference, fused


def _inputs(shape=SHAPE):
    return np.random.default_rng(0).normal(2.0, 3.0, shape).astype("float32")


def _close(actual, expected, atol, rtol=0.0):
    np.testing.assert_allclose(np.asarray(actual, "float32"), np.asarray(expected, "float32"),
                               atol=atol, rtol=rtol)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_training_matches_keras_outputs_and_moving_statistics(policy):
    reference, fused = _pair(policy, momentum=0.9, epsilon=1.001e-5)
    x = _inputs()
    for _ in range(2):  # the second step starts from updated moving statistics
        expected, actual = reference(x, training=True), fused(x, training=True)
        _close(actual, expected, OUTPUT_ATOL[policy], OUTPUT_RTOL[policy])
    assert actual.dtype.name == fused.compute_dtype  # half precision stays half precision
    _close(fused.moving_mean, reference.moving_mean, 1e-6)
    _close(fused.moving_variance, reference.moving_variance, 1e-5)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_training_gradients_match_keras(policy):
    import tensorflow as tf

    reference, fused = _pair(policy, momentum=0.9, epsilon=1e-3)
    x = tf.constant(_inputs())
    weights = tf.range(SHAPE[-1], dtype=tf.float32)  # a loss that is not invariant to BN
    grads = []
    for layer in (reference, fused):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.cast(layer(x, training=True), tf.float32) * weights)
        grads.append(tape.gradient(loss, [x, *layer.trainable_weights]))
    for expected, actual in zip(*grads, strict=True):
        _close(actual, expected, 1e-3 * max(1.0, float(np.abs(expected).max())))


def test_bf16_training_step_runs_the_fused_kernels_in_bfloat16():
    """The point of the layer: forward and backward are the fused ops on bf16 activations, with
    float32 scale/offset and statistics, not an upcast to float32 and separate element-wise ops."""
    import tensorflow as tf

    _, fused = _pair("mixed_bfloat16", momentum=0.9)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fused(tf.cast(x, tf.bfloat16), training=True)
            loss = tf.reduce_sum(tf.cast(y, tf.float32))
        return tape.gradient(loss, [x, *fused.trainable_weights])

    graph = step.get_concrete_function(tf.TensorSpec(SHAPE, tf.float32)).graph
    ops = [op for op in graph.get_operations()
           if op.type in ("FusedBatchNormV3", "FusedBatchNormGradV3")]
    assert sorted(op.type for op in ops) == ["FusedBatchNormGradV3", "FusedBatchNormV3"]
    for op in ops:
        assert op.get_attr("T") == tf.bfloat16  # activations and their gradient in bf16
        assert op.get_attr("U") == tf.float32  # scale, offset, statistics in float32
    assert all(v.dtype == "float32" for v in fused.weights)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("options", [{}, {"center": False}, {"scale": False}])
def test_inference_matches_keras(policy, options):
    reference, fused = _pair(policy, **options)
    x = _inputs()
    tolerance = OUTPUT_ATOL[policy], OUTPUT_RTOL[policy]
    _close(fused(x, training=False), reference(x, training=False), *tolerance)
    _close(fused(x), reference(x), *tolerance)


def test_frozen_layer_runs_in_inference_mode_like_keras():
    reference, fused = _pair("float32")
    reference.trainable = fused.trainable = False
    x = _inputs()
    _close(fused(x, training=True), reference(x, training=True), 1e-5)
    _close(fused.moving_mean, reference.moving_mean, 0)


@pytest.mark.parametrize(("shape", "axis"), [((6, 8), -1), ((4, 3, 8), -1), ((4, 8, 5, 6), 1)])
def test_uncovered_inputs_fall_back_to_keras(shape, axis):
    import keras

    reference = keras.layers.BatchNormalization(axis=axis)
    fused = FusedBatchNormalization(axis=axis)
    x = _inputs(shape)
    _close(fused(x, training=True), reference(x, training=True), 1e-5)
    _close(fused.moving_variance, reference.moving_variance, 1e-6)


def test_model_with_fused_layer_round_trips_through_model_keras(tmp_path):
    import keras

    inputs = keras.Input(SHAPE[1:])
    model = keras.Model(inputs, FusedBatchNormalization(name="bn")(inputs))
    x = _inputs()
    model(x, training=True)  # move the statistics off their initial values
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", compile=False)
    assert type(loaded.get_layer("bn")) is FusedBatchNormalization
    _close(loaded.predict(x, verbose=0), model.predict(x, verbose=0), 0)


@functools.cache
def _application(name: str, policy: str):
    """A keras.applications net as ampflow builds it, built once per file: MobileNetV2's
    float32 build serves both tests below (neither changes its layers; one sets its weights
    to the mixed build's, which the other does not read)."""
    return build_model(name, (8, 8, 1), 3, image_size=32, policy=policy)


@pytest.fixture(scope="module", autouse=True)
def release_built_applications():
    """Frees the built nets after this file, so a worker's later files do not hold them."""
    yield
    _application.cache_clear()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_applications_use_only_fused_batch_norm_and_share_weights_with_float32_twin(name):
    import keras

    mixed = _application(name, "mixed_bfloat16")
    layers = [layer for layer in mixed.layers if isinstance(layer, keras.Model)][0].layers
    kinds = [type(layer) for layer in layers]
    assert keras.layers.BatchNormalization not in kinds
    assert FusedBatchNormalization in kinds
    assert keras.layers.Conv2D not in kinds  # each one's bf16 filter gradient: the faster way
    assert MatmulGradientConv2D in kinds
    twin = _application(name, "float32")
    twin.set_weights(mixed.get_weights())  # what evaluate_parity/export do
    x = np.random.default_rng(0).uniform(0, 16, (2, 8, 8, 1)).astype("float32")
    # Called eagerly, as `predict` runs them (inference mode) without tracing a predict
    # function for each net: two traces of ResNet-50 cost more than the whole comparison.
    _close(twin(x, training=False), mixed(x, training=False), 0.05)


@pytest.mark.slow
def test_mobilenet_v2_batch_norm_averages_fast_enough_for_a_from_scratch_run():
    """keras.applications builds MobileNetV2's BN with momentum 0.999 (ImageNet-sized epochs):
    at this project's scale its moving statistics stay near 0/1 and inference predicts one class.
    """
    import keras

    from ampflow.modeling.models import BATCH_NORM_MAX_MOMENTUM

    model = _application("mobilenet_v2", "float32")
    backbone = next(layer for layer in model.layers if isinstance(layer, keras.Model))
    norms = [layer for layer in backbone.layers if isinstance(layer, FusedBatchNormalization)]
    assert len(norms) == 52
    assert {layer.momentum for layer in norms} == {BATCH_NORM_MAX_MOMENTUM} == {0.99}


@pytest.mark.slow  # fresh TensorFlow processes
def test_fresh_process_loads_the_model_with_the_train_loader_or_the_layers_module(tmp_path):
    # The train package no longer imports Keras when it is imported (the CLI's --help reads
    # its config), so the layer registers where Keras says: when its module is imported, which
    # `load_trained_model` (the documented loader) does itself.
    import json
    import subprocess
    import sys

    import keras

    inputs = keras.Input(SHAPE[1:])
    keras.Model(inputs, FusedBatchNormalization()(inputs)).save(tmp_path / "model.keras")
    (tmp_path / "metadata.json").write_text(json.dumps(
        {"model_name": "x", "input_shape": list(SHAPE[1:]), "num_classes": 3,
         "precision": {"policy": "float32"}}))
    for code in (
        f"from ampflow.artifacts.model_dir import load_trained_model; "
        f"load_trained_model({str(tmp_path)!r})",
        # (ampflow first: its fast start keeps Keras's optional imports out, ~2 CPU-s here)
        f"import ampflow.modeling.layers, keras; "
        f"keras.saving.load_model({str(tmp_path / 'model.keras')!r}, compile=False)",
    ):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, (code, result.stderr[-2000:])


@pytest.mark.parametrize("attribute", ["renorm", "synchronized"])
def test_layer_works_on_keras_versions_without_the_attribute(attribute):
    # Keras < 3.14 has no `renorm` on BatchNormalization (issue 10): the layer must not read it.
    reference, fused = _pair("float32")
    fused.__dict__.pop(attribute, None)
    assert not hasattr(fused, attribute)
    x = _inputs()
    _close(fused(x, training=True), reference(x, training=True), 1e-5)
