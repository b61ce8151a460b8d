"""The AMP check on real Keras models made to have (or not have) each finding.

Each model is built under the policy it is checked against (tests/conftest.py restores the
global policy after every test). Asserts are on finding kinds and the layers they name, found
by structure; exact Cast counts are asserted only where our own layer code fixes them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ampflow.components.train.preflight.rules import (
    AMP_REPORT_FILE,
    check_amp,
    ensure_float32_output,
    write_amp_report,
)

SHAPE = (8, 8, 1)
CLASSES = 4


def _keras(policy: str):
    import keras

    keras.mixed_precision.set_global_policy(policy)
    return keras


def _custom_layers():
    import keras
    from keras import ops

    class HardFloat32(keras.layers.Layer):
        """Holds its own weights and does its math in float32 whatever the policy."""

        def build(self, input_shape):
            self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones",
                                         name="scale")

        def call(self, x):
            x32 = ops.cast(x, "float32")  # the hard-coded dtype the check must find
            return ops.cast(x32 * ops.cast(self.scale, "float32"), self.compute_dtype)

    class HalfWeights(keras.layers.Layer):
        """Creates its trainable weight in float16: the optimizer cannot update it well."""

        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones",
                                     dtype="float16", name="w")

        def call(self, x):
            return x * ops.cast(self.w, x.dtype)

    class BigSum(keras.layers.Layer):
        """Sums a 64×64 map in the compute dtype (ops.sum, unlike ops.mean, does not upcast)."""

        def call(self, x):
            return ops.sum(x, axis=(1, 2))

    return HardFloat32, HalfWeights, BigSum


def _conv_net(keras, head_dtype: str | None = "float32", middle=None, name="net"):
    """A small conv net; `middle(x)` adds layers before the head; the head is Dense+softmax."""
    from keras import layers

    inputs = keras.Input(SHAPE, name="images")
    x = layers.Rescaling(1 / 255.0, name="rescale")(inputs)
    x = layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(x)
    if middle is not None:
        x = middle(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    if head_dtype is None:  # the head under the policy: a half-precision output layer
        out = layers.Dense(CLASSES, activation="softmax", name="out")(x)
    else:
        logits = layers.Dense(CLASSES, dtype=head_dtype, name="logits")(x)
        out = layers.Activation("softmax", dtype=head_dtype, name="probabilities")(logits)
    return keras.Model(inputs, out, name=name)


def _check(model, policy):
    return check_amp(model, policy, input_shape=SHAPE, num_classes=CLASSES)


def _named(report, kind):
    return {f.layer for f in report.findings if f.kind == kind}


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "float32"])
def test_check_amp_clean_net_has_casts_only_at_the_boundaries(policy, tmp_path):
    keras = _keras(policy)
    report = _check(_conv_net(keras), policy)

    assert report.ok and report.errors == [] and report.warnings == []
    assert report.output_dtype == "float32"
    assert {f.kind for f in report.findings} <= {"float32_by_design"}
    rows = {r.name: r for r in report.layers}
    # the head: the output layer and, under a mixed policy, the float32 chain that feeds it
    assert rows["probabilities"].head and rows["logits"].head == (policy != "float32")
    assert rows["conv"].compute_dtype == {"float32": "float32", "mixed_float16": "float16",
                                          "mixed_bfloat16": "bfloat16"}[policy]
    assert all(r.variable_dtype == "float32" for r in rows.values())
    if policy == "float32":
        # Nothing changes dtype anywhere under float32: no Cast at all is fully determined.
        assert report.casts["forward"] == report.casts["backward"] == 0
    else:
        # Boundaries only: the model input into the first layer, the float32 head, variable
        # autocasts, and what Keras keeps in float32 (the pooling mean).
        assert set(report.casts["by_category"]) <= {"variable", "constant", "input",
                                                    "internal"}
        inputs = {r.name for r in report.layers if r.casts.get("input")}
        assert inputs == {"rescale", "logits"}
        internal = {r.name for r in report.layers if r.casts.get("internal")}
        assert internal <= {"pool"}
        assert _named(report, "float32_by_design") <= {"pool"}
    write_amp_report(report, tmp_path)
    written = json.loads((tmp_path / AMP_REPORT_FILE).read_text())
    assert written["ok"] is True and written["policy"] == policy
    assert {row["name"] for row in written["layers"]} == {r.name for r in report.layers}
    assert "AMP check ok" in report.table().splitlines()[0]


def test_check_amp_names_a_float16_output_layer_and_ensure_float32_output_fixes_it():
    keras = _keras("mixed_float16")
    model = _conv_net(keras, head_dtype=None)
    report = _check(model, "mixed_float16")

    assert _named(report, "half_precision_output") == {"out"}
    assert report.output_dtype == "float16"
    assert "out" in report.table()

    fixed, fixes = ensure_float32_output(model)
    assert "recomputed in float32" in fixes[0]  # the softmax Dense, as ampflow's one head rule
    assert fixed.get_layer("logits").dtype_policy.compute_dtype == "float32"
    assert keras.backend.standardize_dtype(fixed.outputs[0].dtype) == "float32"
    images = np.random.default_rng(0).uniform(0, 255, (4, *SHAPE)).astype("float32")
    before, after = model.predict(images, verbose=0), fixed.predict(images, verbose=0)
    assert after.dtype == np.float32
    np.testing.assert_allclose(after, before.astype(np.float32), atol=2e-3)  # float16 rounding
    assert _check(fixed, "mixed_float16").kinds().isdisjoint({"half_precision_output"})
    assert ensure_float32_output(fixed) == (fixed, [])

    refixed = check_amp(model, "mixed_float16", input_shape=SHAPE, num_classes=CLASSES,
                        fix_output=True)
    assert refixed.output_dtype == "float32" and refixed.fixes
    assert [f.severity for f in refixed.findings if f.kind == "half_precision_output"] == [
        "fixed"]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_check_amp_names_a_custom_layer_with_hard_coded_float32_math(policy):
    keras = _keras(policy)
    hard_float32, _, _ = _custom_layers()
    model = _conv_net(keras, middle=lambda x: hard_float32(name="hard32")(x))
    report = _check(model, policy)

    assert report.ok
    assert _named(report, "hard_coded_dtype") == {"hard32"}
    finding = next(f for f in report.findings if f.kind == "hard_coded_dtype")
    # Fully determined by the layer's code: call() makes 3 activation/weight casts (input up,
    # weight up, result down) and TF's gradient of each Cast is one Cast back.
    assert (finding.detail["forward"], finding.detail["backward"]) == (3, 3)
    assert "hard32" in report.table() and "hard_coded_dtype" in report.table()
    row = next(r for r in report.layers if r.name == "hard32")
    assert row.origin == "custom" and row.cast_count > 0
    json.dumps(report.to_json())  # JSON-clean
    # the Keras model's own name, under a key that says so (not the served or --model name)
    assert report.to_json()["keras_model_name"] == model.name
    assert "model_name" not in report.to_json()


def test_check_amp_flags_a_softmax_inside_a_float16_block_but_not_under_bfloat16():
    def middle(x):
        from keras import layers

        x = layers.Conv2D(4, 1, name="attn_scores")(x)
        return layers.Activation("softmax", name="attn_softmax")(x)

    keras = _keras("mixed_float16")
    report16 = _check(_conv_net(keras, middle=middle), "mixed_float16")
    keras = _keras("mixed_bfloat16")
    report_bf16 = _check(_conv_net(keras, middle=middle), "mixed_bfloat16")

    assert _named(report16, "float16_unsafe_op") == {"attn_softmax"}
    assert report16.ok and any("attn_softmax" in w for w in report16.warnings)
    assert "float16_unsafe_op" not in report_bf16.kinds()
    assert any("bfloat16" in n and "attn_softmax" in n for n in report_bf16.notes)


def test_check_amp_flags_a_large_float16_reduction():
    keras = _keras("mixed_float16")
    from keras import layers

    _, _, big_sum = _custom_layers()
    inputs = keras.Input((64, 64, 1))
    x = layers.Conv2D(2, 1, name="conv")(inputs)
    x = big_sum(name="big_sum")(x)  # 64×64 = 4,096 float16 terms per output
    out = layers.Dense(CLASSES, dtype="float32", name="logits")(x)
    report = check_amp(keras.Model(inputs, out), "mixed_float16", input_shape=(64, 64, 1),
                       num_classes=CLASSES)

    finding = next(f for f in report.findings if f.kind == "float16_unsafe_op")
    assert finding.layer == "big_sum" and finding.detail["reduced_elements"] == 64 * 64


def test_check_amp_names_a_hand_set_float32_layer_inside_the_chain():
    def middle(x):
        from keras import layers

        return layers.Conv2D(4, 3, padding="same", dtype="float32", name="conv32")(x)

    keras = _keras("mixed_bfloat16")
    report = _check(_conv_net(keras, middle=middle), "mixed_bfloat16")

    assert _named(report, "hand_set_dtype") == {"conv32"}
    finding = next(f for f in report.findings if f.kind == "hand_set_dtype")
    assert finding.detail["input_casts"] > 0


def test_check_amp_refuses_a_rank_3_output():
    keras = _keras("mixed_float16")
    from keras import layers

    inputs = keras.Input(SHAPE)
    x = layers.Reshape((8, 8))(inputs)
    out = layers.Dense(CLASSES, dtype="float32", name="per_row")(x)  # [batch, 8, classes]
    report = _check(keras.Model(inputs, out), "mixed_float16")

    assert not report.ok and "output_shape" in report.kinds()
    assert any("[batch, 4]" in e and "[None, 8, 4]" in e for e in report.errors)
    assert "REFUSED" in report.table()


def test_check_amp_refuses_an_input_shape_mismatch_and_half_precision_weights():
    keras = _keras("mixed_float16")
    _, half_weights, _ = _custom_layers()
    model = _conv_net(keras, middle=lambda x: half_weights(name="half_w")(x))

    wrong = check_amp(model, "mixed_float16", input_shape=(16, 16, 1), num_classes=CLASSES)
    assert "input_shape" in wrong.kinds() and wrong.casts == {}  # refused before tracing
    report = _check(model, "mixed_float16")
    assert not report.ok and _named(report, "half_precision_variables") == {"half_w"}


def test_check_amp_refuses_a_step_that_does_not_trace_and_a_model_without_weights():
    keras = _keras("mixed_float16")
    import tensorflow as tf
    from keras import layers

    class AddsFloat32(layers.Layer):
        def call(self, x, training=None):
            if training:  # (the model builds: only the train step takes this branch)
                return x + tf.ones([], tf.float32)  # float16 + float32: TF refuses to trace it
            return x

    broken = _conv_net(keras, middle=lambda x: AddsFloat32(name="adds32")(x))
    report = _check(broken, "mixed_float16")
    assert not report.ok and "trace_failed" in report.kinds()
    assert any("AddV2" in e for e in report.errors)

    inputs = keras.Input(SHAPE)
    frozen = keras.Model(inputs, layers.Activation("softmax", dtype="float32")(
        layers.Flatten()(inputs)[:, :CLASSES]))
    assert "no_trainable_variables" in _check(frozen, "mixed_float16").kinds()


def test_check_amp_says_when_the_policy_was_not_applied():
    keras = _keras("float32")
    model = _conv_net(keras)  # built under float32, checked as if mixed
    report = _check(model, "mixed_float16")

    assert "policy_not_applied" in report.kinds() and "hand_set_dtype" not in report.kinds()


def test_check_amp_names_all_three_in_one_model_and_leaves_the_model_as_it_was():
    # The "done when": a float16 output layer, a custom layer with float32 hard-coded
    # math (with its casts) and a softmax inside a float16 block, all named in one table.
    keras = _keras("mixed_float16")
    from keras import layers

    hard_float32, _, _ = _custom_layers()

    def middle(x):
        x = hard_float32(name="hard32")(x)
        return layers.Activation("softmax", name="block_softmax")(x)

    model = _conv_net(keras, head_dtype=None, middle=middle)
    report = _check(model, "mixed_float16")
    table = report.table()

    assert _named(report, "half_precision_output") == {"out"}
    assert _named(report, "hard_coded_dtype") == {"hard32"}
    assert _named(report, "float16_unsafe_op") == {"block_softmax"}
    for name in ("out", "hard32", "block_softmax"):
        assert name in table
    assert "6 Cast op(s)" in table  # hard32's 3 forward + 3 backward (see the test above)
    assert len(table.splitlines()) < 20
    assert all("call" not in vars(layer) for layer in model._flatten_layers())
    images = np.zeros((2, *SHAPE), "float32")
    assert model.predict(images, verbose=0).shape == (2, CLASSES)


def test_check_amp_names_variables_that_a_cast_to_int_cuts_off_from_the_loss():
    keras = _keras("mixed_bfloat16")
    from keras import layers, ops

    class Quantize(layers.Layer):
        def call(self, x):
            return ops.cast(ops.cast(x, "int32"), self.compute_dtype)  # no gradient through int

    report = _check(_conv_net(keras, middle=lambda x: Quantize(name="quantize")(x)),
                    "mixed_bfloat16")

    finding = next(f for f in report.findings if f.kind == "no_gradient")
    assert finding.severity == "warning"  # the head still learns
    assert sorted(v.rsplit("/", 1)[0] for v in finding.detail["variables"]) == ["conv", "conv"]
