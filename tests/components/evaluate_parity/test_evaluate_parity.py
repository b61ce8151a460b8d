"""The evaluate step end to end: real trained models, real data, real files."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest

from ampflow.artifacts.model_dir import load_trained_model
from ampflow.artifacts.verdict import load_verdict
from ampflow.components.evaluate_parity import EvaluateConfig, run_evaluate, scalar_metrics
from ampflow.components.evaluate_parity.gate import default_relative_logit_bound
from ampflow.data import load_arrays
from ampflow.errors import ConfigError, GateFailedError
from ampflow.modeling.twin import build_float32_twin

OUTPUT_FILES = {"metrics.json", "verdict.json", "confusion_matrix.json", "report.md",
                "predictions.json", "config.json", "per_class_accuracy.png", "confusion_matrix.png",
                "logit_diff_histogram.png", "loss_scale_history.png"}


def _test_split(prepared_digits):
    images, labels = load_arrays(prepared_digits, "test")
    return images.astype("float32"), labels


def _right(model, images, labels) -> np.ndarray:
    """Independent of the step: full model (probabilities), argmax, compare per image."""
    return np.argmax(model.predict(images, verbose=0), axis=1) == labels


@pytest.fixture(scope="module")
def answers(prepared_digits):
    """Factory: `answers(model_dir, twin=False)` → which test images the published model (or
    its float32 twin) gets right, computed here once per module: the gate, overflow and
    baseline tests check the step against the same session models (a load and a predict
    each, otherwise repeated per test)."""
    images, labels = _test_split(prepared_digits)
    cache = {}

    def _get(model_dir, twin: bool = False) -> np.ndarray:
        if (model_dir, twin) not in cache:
            model, meta = load_trained_model(model_dir)
            cache[model_dir, twin] = _right(build_float32_twin(model, meta) if twin else model,
                                            images, labels)
        return cache[model_dir, twin]

    return _get


@pytest.fixture(scope="module")
def evaluated(trained_model, prepared_digits, tmp_path_factory):
    """Factory: `evaluated(policy)` → run_evaluate's result with the defaults on the session's
    model of `policy`, once per module (the gate and the confusion-matrix tests read the same
    run; nothing writes into its output dir)."""
    results = {}

    def _get(policy: str):
        if policy not in results:
            results[policy] = run_evaluate(EvaluateConfig(
                model_dir=trained_model(policy), data_dir=prepared_digits,
                output_dir=tmp_path_factory.mktemp(f"eval-{policy}") / "eval"))
        return results[policy]

    return _get


@pytest.mark.slow
@pytest.mark.parametrize("policy, compute_dtype", [("mixed_float16", "float16"),
                                                   ("mixed_bfloat16", "bfloat16")])
def test_run_evaluate_trained_amp_model_passes_gate_with_defaults(
        trained_model, prepared_digits, evaluated, answers, policy, compute_dtype):
    model_dir = trained_model(policy)
    result = evaluated(policy)

    assert result.passed, result.verdict["message"]
    assert {p.name for p in result.output_dir.iterdir()} == OUTPUT_FILES
    metrics = json.loads((result.output_dir / "metrics.json").read_text())
    _, labels = _test_split(prepared_digits)
    amp_accuracy = float(answers(model_dir).mean())
    twin_accuracy = float(answers(model_dir, twin=True).mean())
    assert metrics["num_examples"] == len(labels) == 359
    np.testing.assert_allclose(metrics["amp_accuracy"], amp_accuracy, atol=1e-12)
    np.testing.assert_allclose(metrics["fp32_twin_accuracy"], twin_accuracy, atol=1e-12)
    np.testing.assert_allclose(metrics["accuracy_drop_points"],
                               100 * (twin_accuracy - amp_accuracy), atol=1e-9)
    assert metrics["amp_accuracy"] > 0.9
    assert metrics["argmax_agreement"] >= 0.99
    # the twin really computes in float32: the logits differ, by rounding only
    bound = default_relative_logit_bound(compute_dtype)
    assert 0 < metrics["max_relative_logit_diff"] <= bound
    assert 0 < metrics["mean_abs_logit_diff"] <= metrics["max_abs_logit_diff"]
    assert metrics["context"]["policy"] == policy
    assert metrics["context"]["relative_logit_bound"] == bound
    assert [c["name"] for c in metrics["gate"]["checks"]] == [
        "chance_binomial_p_value", "accuracy_drop_points", "argmax_agreement",
        "max_relative_logit_diff", "amp_nonfinite_logits"]
    # the digits test split: 359 images, the most frequent digit 37 of them
    assert metrics["chance_accuracy"] == pytest.approx(37 / 359)
    assert metrics["chance_test_power"] == pytest.approx(1.0)
    assert result.verdict["notes"] == [] and result.verdict["baselines"]["serving"] is None
    assert load_verdict(result.output_dir) == {**result.verdict}
    assert load_verdict(result.output_dir)["failed_checks"] == []
    assert scalar_metrics(metrics)["gate_passed"] == 1.0


@pytest.mark.slow
def test_run_evaluate_confusion_matrix_maps_to_kfp_and_matches_per_class(
        evaluated, prepared_digits):
    result = evaluated("mixed_bfloat16")  # the gate test's run
    cm = json.loads((result.output_dir / "confusion_matrix.json").read_text())
    _, labels = _test_split(prepared_digits)
    matrix = np.array(cm["matrix"])
    assert cm["categories"] == [str(i) for i in range(10)]
    assert matrix.shape == (10, 10) and matrix.sum() == len(labels)
    np.testing.assert_array_equal(matrix.sum(axis=1), np.bincount(labels, minlength=10))
    np.testing.assert_allclose(np.trace(matrix) / matrix.sum(), result.metrics["amp_accuracy"])
    per_class = result.metrics["per_class_accuracy"]["amp"]
    np.testing.assert_allclose([per_class[str(i)] for i in range(10)],
                               np.diag(matrix) / matrix.sum(axis=1))
    report = (result.output_dir / "report.md").read_text()
    assert "# FP32 parity: PASSED" in report and "| argmax_agreement |" in report
    assert "![loss-scale history](loss_scale_history.png)" in report
    assert (result.output_dir / "loss_scale_history.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_build_float32_twin_mixed_model_computes_float32_with_same_weights(trained_model):
    model, meta = load_trained_model(trained_model("mixed_float16"))
    twin = build_float32_twin(model, meta)
    import keras

    # by type, not by name: a Conv2D built earlier in the session renames this one conv2d_1
    first_conv = next(layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D))
    assert first_conv.compute_dtype == "float16"
    assert {layer.compute_dtype for layer in twin.layers} == {"float32"}
    for ours, theirs in zip(twin.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.slow
def test_run_evaluate_float16_overflow_fails_gate_naming_each_measure(
        overflowing_float16_model, trained_model, prepared_digits, answers, tmp_path):
    out = tmp_path / "eval"
    config = EvaluateConfig(model_dir=overflowing_float16_model, data_dir=prepared_digits,
                            output_dir=out)
    with pytest.raises(GateFailedError) as info:
        run_evaluate(config)

    message = str(info.value)
    assert "parity gate failed" in message
    assert "accuracy_drop_points: measured" in message and "vs threshold <= 0.5" in message
    assert "argmax_agreement: measured" in message and "vs threshold >= 0.99" in message
    assert "max_relative_logit_diff: measured" in message and "vs threshold <= 0.009766" in message
    # the outputs were written before the gate raised
    assert {p.name for p in out.iterdir()} == OUTPUT_FILES
    verdict = load_verdict(out)
    assert verdict["passed"] is False
    failed = {c["name"] for c in verdict["failed_checks"]}
    # What holds on every CPU kind: each twin comparison fails. How far the overflow reaches
    # the AMP model's own answers depends on the CPU's oneDNN kernels (AVX2, AVX-512/VNNI,
    # bf16, AMX): an inf may reach the logits (amp_nonfinite_logits), and the accuracy may fall
    # to chance (chance_binomial_p_value: deterministically so on a Xeon with AVX-512/VNNI and
    # no bf16). Those measures of the AMP model alone may join; no other check may fail, and
    # the message names every one that did.
    must_fail = {"accuracy_drop_points", "argmax_agreement", "max_relative_logit_diff"}
    amp_model_alone = {"amp_nonfinite_logits", "chance_binomial_p_value"}
    assert must_fail <= failed <= must_fail | amp_model_alone
    assert all(f"{name}: " in message for name in failed), message
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["gate_passed"] == 0.0  # (how far accuracy falls depends on the kernels too)
    # the float32 function survived the rescaling: the twin scores like the original model
    np.testing.assert_allclose(metrics["fp32_twin_accuracy"],
                               answers(trained_model("mixed_float16")).mean(), atol=0.01)
    assert "# FP32 parity: FAILED" in (out / "report.md").read_text()


@pytest.mark.slow
def test_run_evaluate_fail_on_gate_false_returns_failed_verdict(
        trained_model, prepared_digits, tmp_path):
    result = run_evaluate(EvaluateConfig(
        model_dir=trained_model("mixed_float16"), data_dir=prepared_digits,
        output_dir=tmp_path / "eval", max_relative_logit_diff=1e-9, fail_on_gate=False,
        limit=100, max_accuracy_drop=100.0, min_agreement=0.0))

    # The other checks are opened wide: one argmax flipped by float16 rounding (a matter of the
    # CPU's kernels) must not decide which checks fail; only the impossible bound may.
    assert not result.passed and result.metrics["num_examples"] == 100
    assert [c["name"] for c in result.verdict["failed_checks"]] == ["max_relative_logit_diff"]
    check = result.verdict["failed_checks"][0]
    assert check["threshold"] == 1e-9 and check["value"] > 1e-9
    assert "max_relative_logit_diff: measured" in result.verdict["message"]
    assert "vs threshold <= 1.000e-09" in result.verdict["message"]
    assert load_verdict(result.output_dir)["passed"] is False


@pytest.mark.slow
def test_run_evaluate_with_float32_baseline_reports_training_parity(
        trained_model, prepared_digits, answers, tmp_path):
    amp_dir, base_dir = trained_model("mixed_bfloat16"), trained_model("float32")
    result = run_evaluate(EvaluateConfig(model_dir=amp_dir, data_dir=prepared_digits,
                                         output_dir=tmp_path / "eval",
                                         baseline_model_dir=base_dir, fail_on_gate=False))

    metrics = result.metrics
    base_meta, amp_meta = (json.loads((d / "metadata.json").read_text())
                           for d in (base_dir, amp_dir))
    base_right, amp_right = answers(base_dir), answers(amp_dir)
    np.testing.assert_allclose(metrics["baseline_accuracy"], base_right.mean(), atol=1e-12)
    np.testing.assert_allclose(metrics["baseline_accuracy_delta_points"],
                               100 * (amp_right.mean() - base_right.mean()), atol=1e-9)
    # the paired test, recomputed here from the two models' answers (exact binomial tail)
    amp_only, base_only = int(np.sum(amp_right & ~base_right)), int(np.sum(~amp_right & base_right))
    assert (metrics["baseline_amp_only_correct"], metrics["baseline_only_correct"]) == (
        amp_only, base_only)
    n = amp_only + base_only
    expected_p = sum(math.comb(n, i) for i in range(base_only, n + 1)) / 2**n if n else 1.0
    np.testing.assert_allclose(metrics["baseline_mcnemar_p_value"], expected_p, rtol=1e-12)
    # speedup: ratio of the mean epoch throughputs (first epoch left out), with an error bar
    rates = [[e["examples_per_sec"] for e in m["epochs"][1:]] for m in (amp_meta, base_meta)]
    np.testing.assert_allclose(metrics["training_speedup"],
                               np.mean(rates[0]) / np.mean(rates[1]))
    assert metrics["training_speedup_stderr"] > 0
    checks = {c["name"]: c for c in result.verdict["checks"]}
    assert checks["baseline_accuracy_delta_points"]["threshold"] == -3.0
    assert checks["baseline_mcnemar_p_value"]["op"] == ">="
    assert checks["baseline_mcnemar_p_value"]["threshold"] == 0.01
    for check in checks.values():
        assert check["passed"] == (check["value"] >= check["threshold"]
                                   if check["op"] == ">=" else check["value"] <= check["threshold"])
    assert metrics["per_class_accuracy"].keys() == {"amp", "fp32_twin", "baseline"}
    assert result.verdict["model_sha256"] == _sha256(amp_dir / "model.keras")
    assert result.verdict["baseline_model_sha256"] == _sha256(base_dir / "model.keras")
    report = (result.output_dir / "report.md").read_text()
    assert "## Training parity" in report and "McNemar p =" in report
    assert "AMP training speedup:" in report


@pytest.mark.slow
def test_run_evaluate_damaged_amp_training_fails_the_training_checks(
        trained_model, prepared_digits, tmp_path):
    # training that stalled after one epoch: its weights, not its rounding, are the damage
    result = run_evaluate(EvaluateConfig(
        model_dir=trained_model("mixed_bfloat16", epochs=1), data_dir=prepared_digits,
        output_dir=tmp_path / "eval", baseline_model_dir=trained_model("float32"),
        fail_on_gate=False))

    assert not result.passed
    failed = {c["name"] for c in result.verdict["failed_checks"]}
    assert {"baseline_accuracy_delta_points", "baseline_mcnemar_p_value"} <= failed
    assert result.metrics["baseline_accuracy_delta_points"] < -3.0
    assert result.metrics["baseline_mcnemar_p_value"] < 0.01


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_run_evaluate_mixed_precision_baseline_rejected(trained_model, prepared_digits,
                                                        tmp_path):
    with pytest.raises(ConfigError, match=r"baseline_model_dir must hold a model trained under "
                                          r"the float32 policy. Received: .*'mixed_float16'"):
        run_evaluate(EvaluateConfig(model_dir=trained_model("mixed_bfloat16"),
                                    data_dir=prepared_digits, output_dir=tmp_path / "eval",
                                    baseline_model_dir=trained_model("mixed_float16")))
    assert not (tmp_path / "eval").exists()
