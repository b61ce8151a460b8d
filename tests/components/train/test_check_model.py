"""`ampflow check-model` on a user's builder made to break every AMP rule it checks."""

import json
import subprocess
import sys
import textwrap

import pytest

BROKEN = textwrap.dedent('''
    import keras
    from keras import layers, ops


    class Float32Math(layers.Layer):
        """Holds its own weights and computes in float32 whatever the policy."""

        def build(self, input_shape):
            self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones",
                                         name="scale")

        def call(self, x):
            return ops.cast(x, "float32") * self.scale


    def build(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        x = layers.Rescaling(1 / 255.0)(inputs)
        x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
        x = Float32Math(name="float32_math")(x)
        x = layers.Conv2D(8, 3, padding="same")(x)
        x = layers.Softmax(name="inner_softmax")(x)  # a softmax inside the float16 block
        x = layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, layers.Dense(num_classes, activation="softmax",
                                                name="half_out")(x))
''')


@pytest.fixture(scope="module")
def broken_code(tmp_path_factory):
    root = tmp_path_factory.mktemp("broken-amp")
    (root / "ampbroken.py").write_text(BROKEN)
    return root


def _check_model(prepared_digits, broken_code, tmp_path, precision):
    return subprocess.run(
        [sys.executable, "-m", "ampflow.cli", "check-model", "--data-dir", str(prepared_digits),
         "--model", "ampbroken:build", "--model-path", str(broken_code),
         "--precision", precision, "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=180)


@pytest.mark.slow  # `ampflow check-model` in a fresh TensorFlow process
def test_check_model_names_the_half_output_the_hard_coded_layer_and_the_inner_softmax(
        prepared_digits, broken_code, tmp_path):
    proc = _check_model(prepared_digits, broken_code, tmp_path, "mixed_float16")
    assert proc.returncode == 0, proc.stderr  # all three are fixed or warned, none refused
    report = json.loads((tmp_path / "amp_report.json").read_text())
    by_kind = {}
    for finding in report["findings"]:
        by_kind.setdefault(finding["kind"], set()).add(finding["layer"])
    assert "half_out" in by_kind["half_precision_output"]
    assert "float32_math" in by_kind["hard_coded_dtype"]
    assert "inner_softmax" in by_kind["float16_unsafe_op"]
    row = next(r for r in report["layers"] if r["name"] == "float32_math")
    casts = row["casts"]
    assert sum(c["forward"] + c["backward"] for c in casts.values()
               if isinstance(c, dict)) > 0, row
    # the table in the output names each of them too
    for name in ("half_out", "float32_math", "inner_softmax"):
        assert name in proc.stdout, proc.stdout
    assert any("recomputed in float32" in fix for fix in report["fixes"])


def _check_model_in_process(*argv: str) -> int:
    """`ampflow check-model` through the CLI's own main, in this process: the subprocess (a
    TensorFlow start-up each) is the test above's; the CLI restores the global policy."""
    from ampflow.cli import main

    return main(["check-model", *argv])


def test_check_model_under_bfloat16_does_not_warn_of_float16_overflow(
        prepared_digits, broken_code, tmp_path, capsys):
    code = _check_model_in_process(
        "--data-dir", str(prepared_digits), "--model", "ampbroken:build",
        "--model-path", str(broken_code), "--precision", "mixed_bfloat16",
        "--output-dir", str(tmp_path))
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "amp_report.json").read_text())
    kinds = {f["kind"] for f in report["findings"]}
    assert "float16_unsafe_op" not in kinds and "hard_coded_dtype" in kinds


def test_check_model_refuses_a_model_for_other_data_with_exit_2(
        prepared_mnist, broken_code, tmp_path, capsys):
    # builds fine for 28x28 data; a builder ignoring input_shape is what gets refused
    (broken_code / "fixedshape.py").write_text(textwrap.dedent('''
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=(8, 8, 1))
            return keras.Model(inputs, keras.layers.Dense(num_classes)(
                keras.layers.Flatten()(inputs)))
    '''))
    code = _check_model_in_process("--data-dir", str(prepared_mnist), "--model",
                                   "fixedshape:build", "--model-path", str(broken_code))
    assert code == 2
    assert "must take the data's images [None, 28, 28, 1]" in capsys.readouterr().err
