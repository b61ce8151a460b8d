"""Bad inputs to evaluate give clear errors; the gate and parity arithmetic; the CLI."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil

import numpy as np
import pytest

from ampflow.artifacts.verdict import Check, load_verdict
from ampflow.components.evaluate_parity import EvaluateConfig, run_evaluate
from ampflow.components.evaluate_parity.gate import Verdict
from ampflow.components.evaluate_parity.parity import ModelScores, logit_parity
from ampflow.errors import ConfigError, DatasetError, GateFailedError, ModelLoadError

# --- model and data inputs ------------------------------------------------------------------

def test_run_evaluate_missing_model_dir_raises_model_load_error(prepared_digits, tmp_path):
    with pytest.raises(ModelLoadError, match=r"is not a published model: expected model.keras"):
        run_evaluate(EvaluateConfig(model_dir=tmp_path / "nope", data_dir=prepared_digits,
                                    output_dir=tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()


@pytest.mark.slow
def test_run_evaluate_corrupt_model_file_raises_model_load_error(
        trained_model, prepared_digits, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(trained_model("mixed_float16") / "metadata.json", model_dir)
    (model_dir / "model.keras").write_bytes(b"PK\x03\x04 truncated zip, not a model")
    with pytest.raises(ModelLoadError, match=r"model\.keras .*corrupt"):
        run_evaluate(EvaluateConfig(model_dir=model_dir, data_dir=prepared_digits,
                                    output_dir=tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()


def test_run_evaluate_model_without_ampflow_head_raises_model_load_error(
        prepared_digits, tmp_path):
    """A model.keras that train did not publish (no float32 logits head) is named, not run.

    (The float32 twin is rebuilt from the model's own layers, so metadata naming another
    architecture no longer matters; the head that parity is measured on does.)
    """
    import keras

    inputs = keras.Input((8, 8, 1), name="images")
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(
        keras.layers.Flatten()(inputs))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    keras.Model(inputs, outputs).save(model_dir / "model.keras")
    (model_dir / "metadata.json").write_text(json.dumps({
        "model_name": "small_cnn", "input_shape": [8, 8, 1], "num_classes": 10,
        "precision": {"policy": "float32", "compute_dtype": "float32"}}))
    with pytest.raises(ModelLoadError, match=r"must have a layer named 'logits'.*'head'"):
        run_evaluate(EvaluateConfig(model_dir=model_dir, data_dir=prepared_digits,
                                    output_dir=tmp_path / "eval"))


def test_logits_model_without_logits_layer_names_the_expected_layer():
    import keras

    from ampflow.modeling.twin import logits_model

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(inputs), name="odd")
    with pytest.raises(ModelLoadError, match=r"must have a layer named 'logits'.*'head'"):
        logits_model(model)


@pytest.mark.slow
def test_run_evaluate_model_for_other_dataset_raises_config_error(
        trained_model, prepared_digits, tmp_path):
    model_dir = shutil.copytree(trained_model("mixed_float16"), tmp_path / "model")
    meta = json.loads((model_dir / "metadata.json").read_text())
    (model_dir / "metadata.json").write_text(json.dumps({**meta, "input_shape": [28, 28, 1]}))
    with pytest.raises(ConfigError, match=r"model_dir must hold a model for the dataset in "
                                          r"data_dir \(input_shape \[8, 8, 1\], 10 classes\). "
                                          r"Received: input_shape \[28, 28, 1\], 10 classes"):
        run_evaluate(EvaluateConfig(model_dir=model_dir, data_dir=prepared_digits,
                                    output_dir=tmp_path / "eval"))


def test_run_evaluate_missing_data_dir_raises_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match=r"is not a prepared dataset"):
        run_evaluate(EvaluateConfig(model_dir=tmp_path, data_dir=tmp_path / "no-data",
                                    output_dir=tmp_path / "eval"))


# --- load_verdict ---------------------------------------------------------------------------

def test_load_verdict_missing_file_raises_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match=r"expected verdict.json in it"):
        load_verdict(tmp_path)


@pytest.mark.parametrize("content, message", [
    ('{"passed": true, "failed_', r"verdict.json is corrupt"),
    ('{"passed": "yes", "failed_checks": []}', r"must hold an object with a bool 'passed'"),
    ('{"passed": true}', r"and a list 'failed_checks'"),
    ("[1, 2]", r"must hold an object"),
])
def test_load_verdict_corrupt_file_raises_model_load_error(tmp_path, content, message):
    (tmp_path / "verdict.json").write_text(content)
    with pytest.raises(ModelLoadError, match=message):
        load_verdict(tmp_path)


# --- config ---------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("batch_size", 0, "batch_size must be > 0. Received: batch_size=0"),
    ("limit", 0, "limit must be > 0. Received: limit=0"),
    ("min_agreement", 1.5, "min_agreement must be in [0, 1]. Received: min_agreement=1.5"),
    ("min_agreement", math.nan, "min_agreement must be in [0, 1]. Received: min_agreement=nan"),
    ("max_accuracy_drop", -1.0, "max_accuracy_drop must be in [0, 100]. Received: "
                                "max_accuracy_drop=-1.0"),
    ("max_baseline_accuracy_drop", 101.0, "max_baseline_accuracy_drop must be in [0, 100]"),
    ("max_relative_logit_diff", -1e-3, "max_relative_logit_diff must be >= 0. Received: "
                                       "max_relative_logit_diff=-0.001"),
    ("min_training_speedup", 0.0, "min_training_speedup must be > 0. Received: "
                                  "min_training_speedup=0.0"),
    ("split", "", "split must be a non-empty name. Received: split=''"),
])
def test_evaluate_config_bad_value_raises_keras_style_message(tmp_path, field, value, message):
    kwargs = {"model_dir": tmp_path, "data_dir": tmp_path, "output_dir": tmp_path, field: value}
    with pytest.raises(ConfigError) as info:
        EvaluateConfig(**kwargs)
    assert str(info.value).startswith(message)


# --- gate and parity arithmetic -------------------------------------------------------------

def test_check_non_finite_value_fails_and_explains():
    assert Check("x", 0.5, "<=", 0.5).passed and Check("y", 0.99, ">=", 0.99).passed
    assert not Check("x", math.nan, "<=", 1.0).passed
    assert not Check("x", math.inf, "<=", 1.0).passed
    failed = Check("max_relative_logit_diff", 0.125, "<=", 0.0098)
    assert failed.explain() == "max_relative_logit_diff: measured 0.125 vs threshold <= 0.0098"
    assert failed.as_dict()["passed"] is False
    assert Check("x", math.inf, "<=", 1.0).as_dict()["value"] == "inf"


def test_verdict_message_lists_only_failed_checks():
    verdict = Verdict((Check("a", 1.0, "<=", 2.0), Check("b", 0.5, ">=", 0.99),
                       Check("c", 3.0, "<=", 1.0)))
    assert not verdict.passed and [c.name for c in verdict.failed] == ["b", "c"]
    assert verdict.message() == ("parity gate failed 2/3 checks: b: measured 0.5 vs threshold "
                                 ">= 0.99; c: measured 3 vs threshold <= 1")


def test_logit_parity_known_logits_gives_exact_measures():
    labels = np.array([0, 1, 1, 0])
    ref = ModelScores(np.array([[4.0, 0], [0, 2], [1, 3], [-8, 1]], np.float32), labels)
    cand = ModelScores(np.array([[4.5, 0], [0, 2], [3, 1], [-8, 1]], np.float32), labels)
    parity = logit_parity(ref, cand)
    np.testing.assert_allclose(parity.agreement, 0.75)
    np.testing.assert_allclose(parity.max_abs_diff, 2.0)
    np.testing.assert_allclose(parity.mean_abs_diff, 4.5 / 8)
    np.testing.assert_allclose(parity.max_relative_diff, 2.0 / 8.0)
    np.testing.assert_allclose([ref.accuracy, cand.accuracy], [0.75, 0.5])
    np.testing.assert_array_equal(ref.confusion_matrix(2), [[1, 1], [0, 2]])
    np.testing.assert_allclose(ref.per_class_accuracy(2), [0.5, 1.0])
    np.testing.assert_allclose(cand.per_class_accuracy(3), [0.5, 0.5, np.nan])


def test_logit_parity_non_finite_candidate_reports_inf_and_counts_them():
    labels = np.array([0, 1])
    ref = ModelScores(np.array([[2.0, 1.0], [0.0, 1.0]], np.float32), labels)
    cand = ModelScores(np.array([[np.inf, 1.0], [np.nan, 1.0]], np.float32), labels)
    parity = logit_parity(ref, cand)
    assert cand.nonfinite_count == 2
    assert parity.max_abs_diff == math.inf and parity.max_relative_diff == math.inf
    np.testing.assert_allclose(parity.abs_diff, [0.0, 0.0])


# --- CLI ------------------------------------------------------------------------------------

def test_evaluate_cli_help_lists_every_option_with_default():
    from ampflow.components.evaluate_parity.cli import register

    parser = argparse.ArgumentParser(prog="ampflow")
    register(parser.add_subparsers(dest="command"))
    sub = parser._subparsers._group_actions[0].choices["evaluate"]
    text = " ".join(sub.format_help().split())
    for field in dataclasses.fields(EvaluateConfig):
        assert "--" + field.name.replace("_", "-") in text, field.name
    assert "--no-fail-on-gate" in text
    assert "(default: 0.99)" in text and "(default: 0.5)" in text


@pytest.mark.slow
def test_evaluate_cli_failed_gate_exits_non_zero_with_measured_vs_threshold(
        trained_model, prepared_digits, tmp_path, capsys):
    from ampflow.cli import main

    code = main(["evaluate", "--model-dir", str(trained_model("mixed_float16")),
                 "--data-dir", str(prepared_digits), "--output-dir", str(tmp_path / "eval"),
                 "--max-relative-logit-diff", "1e-9"])
    err = capsys.readouterr().err
    assert code == GateFailedError.exit_code == 1
    # the CLI says the failed threshold as the flag that sets it (src/ampflow/cli.py's _in_flags)
    assert err.startswith("ampflow evaluate: error: parity gate failed 1/5 checks: "
                          "--max-relative-logit-diff: measured ")
    assert "vs threshold <= 1.000e-09" in err and "Traceback" not in err
    assert load_verdict(tmp_path / "eval")["passed"] is False
