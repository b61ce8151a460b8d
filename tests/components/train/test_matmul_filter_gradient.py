"""MatmulGradientConv2D: a bf16 filter gradient as one matmul on small maps, Conv2D's elsewhere.

oneDNN's AMX weight-gradient kernel is slower in bf16 than in float32 on small feature maps
(benchmarks/results/train_bf16_gap_amx.md); the layer computes the same sum as a matmul there.
These tests pin what it computes and which ops it runs, never how fast.
"""

import numpy as np
import pytest

from ampflow.modeling.layers import (
    MATMUL_FILTER_GRADIENT_MAX_AREA,
    MatmulGradientConv2D,
    matmul_filter_gradient,
)


@pytest.fixture
def amx(monkeypatch):
    """This host as a CPU with AMX-BF16 (or without: `amx(False)`), whatever it really has."""
    import tensorflow as tf

    from ampflow.modeling import layers

    if tf.config.list_logical_devices("GPU"):
        pytest.skip("the matmul filter gradient is a CPU path; this host has a GPU")

    def set_amx(present=True):
        monkeypatch.setattr(layers, "cpu_has_amx", lambda: present)

    set_amx()
    return set_amx


@pytest.mark.parametrize(("size", "kernel", "stride", "padding"), [
    (3, 3, 1, "SAME"), (6, 1, 2, "SAME"), (6, 3, 2, "SAME"), (7, 3, 2, "VALID"),
    (5, 2, 1, "SAME"), (6, 1, 1, "VALID"), (8, 7, 2, "VALID")])
def test_filter_gradient_equals_tensorflows(size, kernel, stride, padding):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(2, size, size, 4)).astype("float32"))
    w = tf.constant(rng.normal(size=(kernel, kernel, 4, 3)).astype("float32"))
    dy = tf.constant(rng.normal(size=tf.nn.conv2d(x, w, stride, padding).shape).astype("float32"))
    expected = tf.raw_ops.Conv2DBackpropFilter(
        input=x, filter_sizes=w.shape, out_backprop=dy, strides=[1, stride, stride, 1],
        padding=padding)
    actual = matmul_filter_gradient(x, dy, w.shape, (stride, stride), padding)
    np.testing.assert_allclose(actual.numpy(), expected.numpy(), atol=1e-5, rtol=1e-5)


def _layer_pair(policy, **options):
    import keras

    keras.mixed_precision.set_global_policy(policy)
    try:
        reference, layer = keras.layers.Conv2D(**options), MatmulGradientConv2D(**options)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return reference, layer


def _gradients_and_ops(layer, x):
    """The layer's output, its gradients (input, kernel, bias) and the op types of that step."""
    import tensorflow as tf

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.range(y.shape[-1], dtype=tf.float32))
        return y, tape.gradient(loss, [x, layer.kernel, layer.bias])

    graph = step.get_concrete_function(tf.TensorSpec(x.shape, tf.float32)).graph
    return (*step(x), {(op.type, _dtype(op)) for op in _all_ops(graph)})


def _dtype(op):
    """The op's element type `T`, where it has one (a single type, not a list)."""
    import tensorflow as tf

    attr = op.node_def.attr.get("T")
    return tf.dtypes.as_dtype(attr.type).name if attr is not None and attr.type else None


def _all_ops(graph):
    yield from graph.get_operations()
    for function in graph._functions.values():  # the custom gradient's and the loss's bodies
        yield from function.graph.get_operations()


def _inputs(size):
    return np.random.default_rng(1).normal(size=(4, size, size, 16)).astype("float32")


def test_bf16_small_map_runs_the_matmul_and_matches_conv2d(amx):
    import tensorflow as tf

    options = {"filters": 8, "kernel_size": 3, "padding": "same"}
    reference, layer = _layer_pair("mixed_bfloat16", **options)
    x = _inputs(3)  # a 3×3 map: ResNet-50's last stage at 96²
    reference.build(x.shape)
    layer.build(x.shape)
    layer.set_weights(reference.get_weights())
    y_ref, grads_ref, ops_ref = _gradients_and_ops(reference, tf.constant(x))
    y, grads, ops = _gradients_and_ops(layer, tf.constant(x))
    assert ("MatMul", "bfloat16") in ops
    assert not any(op == "Conv2DBackpropFilter" for op, _ in ops)
    assert ("Conv2DBackpropFilter", "bfloat16") in ops_ref  # what it replaces
    assert y.dtype == tf.bfloat16
    np.testing.assert_array_equal(tf.cast(y, tf.float32), tf.cast(y_ref, tf.float32))
    for actual, expected in zip(grads, grads_ref, strict=True):
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(np.asarray(tf.cast(actual, tf.float32)),
                                   np.asarray(tf.cast(expected, tf.float32)), atol=0.02 * scale)


@pytest.mark.parametrize(("policy", "size", "has_amx"), [
    ("float32", 3, True),  # float32's own kernel is not the slow one
    ("mixed_bfloat16", 12, True),  # a 12×12 output: above the area, oneDNN's kernel is faster
    ("mixed_bfloat16", 3, False)])  # without AMX oneDNN runs another kernel: not measured slow
def test_elsewhere_the_layer_is_conv2d(amx, policy, size, has_amx):
    import tensorflow as tf

    amx(has_amx)
    assert size * size > MATMUL_FILTER_GRADIENT_MAX_AREA or policy == "float32" or not has_amx
    _, layer = _layer_pair(policy, filters=8, kernel_size=3, padding="same")
    _, _, ops = _gradients_and_ops(layer, tf.constant(_inputs(size)))
    assert any(op == "Conv2DBackpropFilter" for op, _ in ops)
    assert not any(op == "MatMul" for op, _ in ops)


def test_layer_round_trips_and_its_float32_twin_shares_its_weights(tmp_path):
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        inputs = keras.Input((3, 3, 16))
        model = keras.Model(inputs, MatmulGradientConv2D(8, 3, padding="same", name="c")(inputs))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", compile=False)
    assert type(loaded.get_layer("c")) is MatmulGradientConv2D
    x = _inputs(3)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
