"""The edge check's rule per variant (issue 46): float outputs the same, int8 answers gated.

The user's case: a full_int8 bert_tiny agreed with the SavedModel on every sentence in both
runtimes, and only tf.lite's and LiteRT's probabilities differed (by 0.059), which failed the
variant against the float variants' 1e-5. Int8 kernels may round each requantization
differently (XNNPACK once, the builtin kernels twice), so what must hold in LiteRT is the
variant's own gate; the float variants must still give tf.lite's outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ampflow.components.convert_tflite import ConvertConfig
from ampflow.components.convert_tflite.edge import edge_gates, quantized_activations
from ampflow.components.convert_tflite.step import _gate_checks

CONFIG = ConvertConfig(saved_model_dir=Path("m"), data_dir=Path("d"), output_dir=Path("o"))


def _metrics(edge_diff: float, edge_agreement: float = 1.0) -> dict:
    edge = {"status": "ran", "max_abs_diff": edge_diff, "class_agreement": 1.0,
            "agreement": edge_agreement, "accuracy": 0.71,
            "accuracy_drop_points": (1.0 - edge_agreement) * 100}
    return {"agreement": 1.0, "accuracy_drop_points": 0.0, "max_abs_prob_diff": 0.0,
            "failed_examples": 0, "edge": edge}


def _failed(variant: str, metrics: dict) -> list[str]:
    return [c["name"] for c in _gate_checks(CONFIG, variant, metrics) if not c["passed"]]


def test_a_full_int8_whose_runtimes_differ_by_0_059_but_agree_passes():
    assert _failed("full_int8", _metrics(0.059)) == []
    names = {c["name"] for c in _gate_checks(CONFIG, "full_int8", _metrics(0.059))}
    assert {"edge_agreement", "edge_accuracy_drop_points"} <= names
    assert "edge_max_abs_diff" not in names


def test_a_full_int8_whose_litert_answers_fail_the_gate_fails():
    assert _failed("full_int8", _metrics(0.059, edge_agreement=0.9)) == [
        "edge_agreement", "edge_accuracy_drop_points"]


@pytest.mark.parametrize("variant", ["float32", "float16", "dynamic_range"])
def test_a_float_variant_must_still_give_the_same_outputs_in_litert(variant):
    assert "edge_max_abs_diff" in _failed(variant, _metrics(0.059))
    assert _failed(variant, _metrics(1e-6)) == []


def test_the_rule_follows_the_variants_activations_and_a_skipped_check_gates_nothing():
    assert [v for v in ("float32", "float16", "dynamic_range", "full_int8")
            if quantized_activations(v)] == ["full_int8"]
    assert edge_gates(CONFIG, "full_int8", {"status": "skipped", "reason": "x"}) == []
