"""A user's own model: a builder outside the repository, a .keras file to fine-tune, bad input.

The builder module is written by the test into a scratch dir (never on sys.path until
`--model-path` puts it there), with a custom layer that holds its own weights and is not
registered with Keras, LayerNormalization and Dropout, ending in a softmax Dense that the
global mixed policy makes float16: ampflow must make the head float32 and say so.
"""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ampflow.artifacts.model_dir import load_trained_model
from ampflow.components.train import TrainConfig, run_train
from ampflow.errors import ConfigError
from ampflow.modeling.models import make_model

BUILDER = textwrap.dedent('''
    import keras
    from keras import layers, ops


    class ChannelScale(layers.Layer):
        """Holds its own weights; deliberately NOT registered with Keras."""

        def build(self, input_shape):
            self.gamma = self.add_weight(shape=(input_shape[-1],), initializer="ones",
                                         name="gamma")

        def call(self, x):
            return x * ops.cast(self.gamma, x.dtype)


    def build(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        x = layers.Rescaling(1 / 255.0)(inputs)
        x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
        x = ChannelScale()(x)
        x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
        x = layers.GlobalAveragePooling2D()(x)
        x = layers.LayerNormalization()(x)
        x = layers.Dropout(0.1)(x)
        x = layers.Dense(64, activation="relu")(x)
        return keras.Model(inputs, layers.Dense(num_classes, activation="softmax")(x))


    def wrong_signature(input_shape):
        return None


    def wrong_input(input_shape, num_classes):
        inputs = keras.Input(shape=(16, 16, 1))
        x = layers.Flatten()(inputs)
        return keras.Model(inputs, layers.Dense(num_classes)(x))


    def wrong_output(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        return keras.Model(inputs, layers.Conv2D(num_classes, 1)(inputs))


    def not_a_model(input_shape, num_classes):
        return "a string"


    def sequential(input_shape, num_classes):
        """A Sequential without keras.Input: built by ampflow on the data's shape."""
        return keras.Sequential([layers.Rescaling(1 / 255.0), layers.Flatten(),
                                 layers.Dense(num_classes, activation="softmax")])


    class Block(layers.Layer):
        """A custom layer that owns a sublayer (created in __init__)."""

        def __init__(self, units=8, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.inner = layers.Dense(units, activation="relu")

        def call(self, x):
            return self.inner(x)

        def get_config(self):
            return {**super().get_config(), "units": self.units}


    def nested(input_shape, num_classes):
        """A nested Sequential head ending in a softmax, after a custom block."""
        inputs = keras.Input(shape=input_shape)
        x = Block(name="block")(layers.Flatten()(layers.Rescaling(1 / 255.0)(inputs)))
        head = keras.Sequential([layers.Dense(num_classes, activation="softmax")], name="head")
        return keras.Model(inputs, head(x))
''')


@pytest.fixture(scope="module")
def user_code(tmp_path_factory):
    """A package `usermodels` in a scratch dir: importable only through --model-path."""
    root = tmp_path_factory.mktemp("user-code")
    package = root / "usermodels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "net.py").write_text(BUILDER)
    (package / "broken.py").write_text("import keras\ndef build(:\n")
    assert "usermodels" not in sys.modules
    return root


def _conv_and_head_dtypes(model):
    import keras

    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    return ({layer.dtype_policy.compute_dtype for layer in convs},
            model.get_layer("logits").dtype_policy.compute_dtype,
            model.get_layer("probabilities").dtype_policy.compute_dtype)


@pytest.mark.slow
def test_user_builder_outside_repo_trains_under_mixed_float16_and_passes_the_gate(
        tmp_path, user_code, prepared_digits):
    """The walk a user's builder takes: trained to a model the parity gate passes, reloaded.

    mixed_bfloat16 takes the same path to the same head (`..._under_mixed_bfloat16_...`
    below, on one training step); the gate on a bfloat16 model is test_evaluate_parity's.
    """
    from ampflow.components.evaluate_parity import EvaluateConfig, run_evaluate

    result = run_train(TrainConfig(
        data_dir=prepared_digits, output_dir=tmp_path / "model", model="usermodels.net:build",
        model_path=str(user_code), precision="mixed_float16", epochs=6))
    _assert_user_model_in_half_precision(result, "float16")
    evaluation = run_evaluate(EvaluateConfig(model_dir=result.output_dir,
                                             data_dir=prepared_digits,
                                             output_dir=tmp_path / "eval"))
    assert evaluation.verdict["passed"], evaluation.verdict
    assert evaluation.metrics["amp_accuracy"] > 0.5  # chance is 0.1
    report = (evaluation.output_dir / "report.md").read_text()
    assert "## AMP check" in report and "half_precision_output" in report


@pytest.mark.slow  # trains under bfloat16 (emulated on most CPUs)
def test_user_builder_under_mixed_bfloat16_gets_the_float32_head_and_records_its_spec(
        tmp_path, user_code, prepared_digits):
    """One training step is all the model block needs (it was also a 6-epoch run)."""
    result = run_train(TrainConfig(
        data_dir=prepared_digits, output_dir=tmp_path / "model", model="usermodels.net:build",
        model_path=str(user_code), precision="mixed_bfloat16", epochs=1, steps_per_epoch=1))
    _assert_user_model_in_half_precision(result, "bfloat16")
    saved = json.loads((result.output_dir / "metadata.json").read_text())
    assert saved["model"]["spec"] == "usermodels.net:build"
    assert saved["model"]["model_path"] == str(user_code)
    assert saved["recipe"]["optimizer"] == "adam"


def _assert_user_model_in_half_precision(result, half: str) -> None:
    """The builder's model computes in `half`, but for the head ampflow made float32 and said
    so, in the metadata, in the archive reloaded here and in amp_report.json."""
    meta = result.metadata
    assert meta["model"]["kind"] == "builder"
    # the softmax Dense computed in half precision: ampflow says it recomputed it in float32
    assert any("softmax" in fix and half in fix for fix in meta["model"]["fixes"])
    dtypes = {row["class"]: row["compute_dtype"] for row in meta["model"]["layer_dtypes"]}
    assert dtypes["ChannelScale"] == dtypes["Conv2D"] == half
    # reloaded in this process from the published archive (its custom layer imported by module)
    model, _ = load_trained_model(result.output_dir)
    convs, logits, probabilities = _conv_and_head_dtypes(model)
    assert convs == {half} and logits == probabilities == "float32"
    assert model.output.dtype == "float32"
    # the AMP check before training, in amp_report.json
    amp = json.loads((result.output_dir / "amp_report.json").read_text())
    assert "half_precision_output" in {f["kind"] for f in amp["findings"]}


@pytest.mark.slow
def test_keras_file_fine_tunes_under_mixed_float16_from_where_float32_left_off(
        tmp_path, trained_model):
    float32_dir = trained_model("float32")
    _, float32_meta = load_trained_model(float32_dir)
    result = run_train(TrainConfig(
        data_dir=float32_meta["config"]["data_dir"], output_dir=tmp_path / "tuned",
        model=str(float32_dir / "model.keras"), precision="mixed_float16", epochs=1,
        steps_per_epoch=2, learning_rate=1e-4))
    meta = result.metadata
    assert meta["model"]["kind"] == "file"
    computes = {(row["class"], row["compute_dtype"]) for row in meta["model"]["layer_dtypes"]}
    assert ("Conv2D", "float16") in computes and ("Dense", "float16") in computes
    assert ("Conv2D", "float32") not in computes
    head = {row["name"]: row["compute_dtype"] for row in meta["model"]["layer_dtypes"]
            if row["name"] in ("logits", "probabilities")}
    assert head == {"logits": "float32", "probabilities": "float32"}
    # fine-tuning continues from the float32 weights: after two steps at 1e-4 the model is
    # where the float32 model ended (chance is 0.1), which no fresh start reaches in two steps
    before = float32_meta["final_metrics"]["val_accuracy"]
    first = meta["epochs"][0]["val_accuracy"]
    assert first > 0.5 and first >= before - 0.1, (before, first)
    model, _ = load_trained_model(result.output_dir)
    convs, logits, _ = _conv_and_head_dtypes(model)
    assert convs == {"float16"} and logits == "float32"


def test_rebuild_with_policy_keeps_weights_and_float32_head():
    import keras

    from ampflow.modeling.user_model import rebuild_with_policy

    model = make_model("small_cnn", (8, 8, 1), 10, policy="float32").model
    rebuilt = rebuild_with_policy(model, "mixed_bfloat16")
    for a, b in zip(model.get_weights(), rebuilt.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    convs = [layer for layer in rebuilt.layers if isinstance(layer, keras.layers.Conv2D)]
    assert {layer.dtype_policy.name for layer in convs} == {"mixed_bfloat16"}
    assert rebuilt.get_layer("logits").dtype_policy.name == "float32"
    images = np.random.default_rng(0).uniform(0, 255, (4, 8, 8, 1)).astype("float32")
    # bfloat16 keeps 8 bits of mantissa: the probabilities agree to about 1e-2
    np.testing.assert_allclose(rebuilt.predict(images, verbose=0),
                               model.predict(images, verbose=0), atol=3e-2)


@pytest.mark.parametrize("last", ["dense_softmax", "activation_softmax", "logits"])
def test_standard_head_gives_float32_logits_and_same_probabilities(last):
    import keras

    from ampflow.modeling.user_model import standard_head

    inputs = keras.Input((6,))
    x = keras.layers.Dense(8, activation="relu")(inputs)
    if last == "dense_softmax":
        out = keras.layers.Dense(3, activation="softmax")(x)
    else:
        out = keras.layers.Dense(3)(x)
        if last == "activation_softmax":
            out = keras.layers.Activation("softmax")(out)
    model = keras.Model(inputs, out)
    standard, fixes = standard_head(model)
    assert fixes and standard.get_layer("logits").dtype_policy.compute_dtype == "float32"
    data = np.random.default_rng(1).normal(size=(5, 6)).astype("float32")
    expected = model.predict(data, verbose=0)
    if last == "logits":
        expected = keras.ops.convert_to_numpy(keras.ops.softmax(expected))
    np.testing.assert_allclose(standard.predict(data, verbose=0), expected, atol=1e-6)
    # a model already in the standard form is returned unchanged
    assert standard_head(standard) == (standard, [])


@pytest.mark.parametrize("model, message", [
    ("usermodels.missing:build", "does not import"),
    ("usermodels.broken:build", "SyntaxError"),
    ("usermodels.net:nothing_here", "has no function 'nothing_here'"),
    ("usermodels.net:wrong_signature", "must accept (input_shape, num_classes)"),
    ("usermodels.net:wrong_input", "must take the data's images [None, 8, 8, 1]"),
    ("usermodels.net:wrong_output", "must return [batch, 10]"),
    ("usermodels.net:not_a_model", "must return a keras.Model"),
])
def test_bad_builder_is_one_config_error_before_anything_is_written(
        tmp_path, user_code, prepared_digits, model, message):
    out = tmp_path / "model"
    with pytest.raises(ConfigError, match=None) as info:
        run_train(TrainConfig(data_dir=prepared_digits, output_dir=out, model=model,
                              model_path=str(user_code), precision="float32", epochs=1))
    assert message in str(info.value)
    assert not (out / "model.keras").exists() and not (out / "metadata.json").exists()


def test_bad_model_file_is_one_config_error(tmp_path, prepared_digits):
    import zipfile

    not_zip = tmp_path / "text.keras"
    not_zip.write_text("not a model")
    foreign = tmp_path / "foreign.keras"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("weights.bin", b"\0" * 10)
    cases = {tmp_path / "missing.keras": "no such file", not_zip: "not a zip archive",
             foreign: "no config.json"}
    for path, message in cases.items():
        with pytest.raises(ConfigError) as info:
            run_train(TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "out",
                                  model=str(path), precision="float32", epochs=1))
        assert message in str(info.value), (path, info.value)


def test_model_spec_that_is_no_form_suggests_the_closest_builtin():
    with pytest.raises(ConfigError, match="Did you mean 'small_cnn'"):
        TrainConfig(data_dir="d", output_dir="o", model="smal_cnn")
    with pytest.raises(ConfigError, match="package.module:function"):
        TrainConfig(data_dir="d", output_dir="o", model="my module:build")


def test_cli_bad_builder_exits_2_with_one_line(tmp_path, user_code, prepared_digits):
    out = tmp_path / "model"
    proc = subprocess.run(
        [sys.executable, "-m", "ampflow.cli", "train", "--data-dir", str(prepared_digits),
         "--output-dir", str(out), "--model", "usermodels.broken:build",
         "--model-path", str(user_code), "--epochs", "1"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "SyntaxError" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "metadata.json").exists()


@pytest.mark.parametrize("last", ["nested_softmax", "ops_softmax", "named_logits"])
def test_standard_head_reads_the_softmax_wherever_it_is(last):
    import keras

    from ampflow.modeling.user_model import standard_head

    inputs = keras.Input((6,))
    x = keras.layers.Dense(8, activation="relu")(inputs)
    if last == "nested_softmax":
        out = keras.Sequential([keras.layers.Dense(3, activation="softmax")], name="head")(x)
    elif last == "ops_softmax":
        out = keras.ops.softmax(keras.layers.Dense(3)(x))
    else:  # a user's own layer named like ampflow's head: renamed, not refused
        out = keras.layers.Activation("softmax")(keras.layers.Dense(3, name="logits")(x))
    model = keras.Model(inputs, out)
    standard, fixes = standard_head(model)
    assert any("recomputed in float32" in fix for fix in fixes), fixes  # never softmax twice
    data = np.random.default_rng(2).normal(size=(5, 6)).astype("float32")
    np.testing.assert_allclose(standard.predict(data, verbose=0), model.predict(data, verbose=0),
                               atol=1e-6)


def test_sequential_builder_without_input_is_built_on_the_data_shape(user_code):
    built = make_model("usermodels.net:sequential", (8, 8, 1), 10, policy="mixed_float16",
                       model_path=str(user_code))
    assert tuple(built.model.input_shape) == (None, 8, 8, 1)
    assert built.model.output.dtype == "float32"


def test_rebuild_under_a_policy_reaches_nested_models_and_custom_sublayers(user_code):
    import keras

    from ampflow.components.train.preflight.rules import walk_layers
    from ampflow.modeling.user_model import rebuild_with_policy

    model = make_model("usermodels.net:nested", (8, 8, 1), 10, policy="float32",
                       model_path=str(user_code)).model
    assert keras.mixed_precision.global_policy().name == "float32"
    rebuilt = rebuild_with_policy(model, "mixed_bfloat16")
    computes = {path: layer.dtype_policy.compute_dtype for layer, path in walk_layers(rebuilt)
                if layer.weights and not isinstance(layer, keras.Model)}
    head = {path for path in computes if path.split("/")[0] in ("logits", "probabilities")}
    assert any(p.startswith("block/") for p in computes), computes  # the custom sublayer
    assert {v for p, v in computes.items() if p not in head} == {"bfloat16"}, computes
    for a, b in zip(model.get_weights(), rebuilt.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_user_keras_file_with_an_unregistered_custom_layer_loads_and_keeps_its_answers(
        tmp_path, user_code):
    model = make_model("usermodels.net:build", (8, 8, 1), 10, policy="float32",
                       model_path=str(user_code)).model
    path = tmp_path / "user.keras"
    model.save(path)
    tuned = make_model(str(path), (8, 8, 1), 10, policy="mixed_float16",
                       model_path=str(user_code)).model
    images = np.random.default_rng(3).uniform(0, 255, (16, 8, 8, 1)).astype("float32")
    before, after = model.predict(images, verbose=0), tuned.predict(images, verbose=0)
    np.testing.assert_allclose(after, before, atol=1e-2)  # float16 rounding only
    assert np.mean(after.argmax(-1) == before.argmax(-1)) >= 0.9


def test_batch_size_auto_on_a_cpu_never_exceeds_the_training_split():
    from ampflow.components.train.run.memory import auto_batch_size

    choice = auto_batch_size(lambda batch: None, limit=10, gpu=False)
    assert choice.batch_size == 10



def test_image_and_text_models_are_refused_a_wrong_output_by_the_one_output_check():
    """check_io and check_text_io share their output rule (user_model.check_output)."""
    import keras

    from ampflow.modeling.user_model import check_io, check_text_io

    pixels = keras.Input((8, 8, 1))
    image = keras.Model(pixels, keras.layers.Dense(2)(keras.layers.Flatten()(pixels)))
    ids = keras.Input((16,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 4)(ids))
    text = keras.Model(ids, keras.layers.Dense(2)(pooled))
    messages = []
    for check, model, shape in ((check_io, image, (8, 8, 1)), (check_text_io, text, 16)):
        with pytest.raises(ConfigError) as caught:
            check(model, shape, 3, "model 'mine'")
        messages.append(str(caught.value))
    assert messages[0] == messages[1] == (
        "model 'mine' must return [batch, 3] (logits or softmax probabilities, one per class). "
        "Received: output shape [None, 2]")
