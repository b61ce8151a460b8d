"""The AMP training speedup is never printed `± nan`: one timed epoch has no interval, said so.

A run of 1 or 2 epochs times one epoch per model (the first, which compiles, is left out of
longer runs), so the speedup's standard error is NaN; run-local's summary printed
`amp_training_speedup 0.291x ± nan` (issue 46), and so did `ampflow evaluate` and report.md.
The metrics here come from the real training_metrics on such a run's metadata.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ampflow.components.evaluate_parity.parity import ModelScores
from ampflow.components.evaluate_parity.training import speedup_text, training_metrics


def _scores(correct: list[bool]) -> ModelScores:
    labels = np.arange(len(correct)) % 3
    predicted = np.where(correct, labels, (labels + 1) % 3)
    return ModelScores(logits=np.eye(3, dtype=np.float32)[predicted], labels=labels)


def _meta(*epoch_rates):
    return {"epochs": [{"epoch": i, "examples_per_sec": r} for i, r in enumerate(epoch_rates)],
            "train_seconds": 10.0}


def _metrics(amp_epochs, base_epochs) -> dict:
    amp, base = _scores([True] * 9 + [False]), _scores([True] * 8 + [False] * 2)
    return {**training_metrics(amp, base, _meta(*amp_epochs), _meta(*base_epochs)),
            "amp_accuracy": 0.9, "num_examples": 10}


TWO_EPOCHS = ((5.0, 29.1), (8.0, 100.0))  # one timed epoch each: 0.291x, no interval
FOUR_EPOCHS = ((5.0, 29.0, 30.0, 31.0), (8.0, 99.0, 100.0, 101.0))


def test_one_timed_epoch_gives_the_ratio_and_says_why_there_is_no_interval():
    metrics = _metrics(*TWO_EPOCHS)
    assert math.isnan(metrics["training_speedup_stderr"])
    text = speedup_text(metrics)
    assert text.startswith("0.291x (no interval: one timed epoch per run")
    assert "nan" not in text
    # 30 ± 1 vs 100 ± 1 over 3 timed epochs: the delta method's SE of the ratio
    stderr = 0.3 * math.hypot(1 / math.sqrt(3) / 30, 1 / math.sqrt(3) / 100)
    assert speedup_text(_metrics(*FOUR_EPOCHS)) == f"0.3x ± {stderr:.2g} (SE)"
    assert speedup_text({"training_speedup": math.nan}).startswith("not measured")
    assert speedup_text({"training_speedup": None}).startswith("not measured")  # JSON's null


@pytest.mark.parametrize("epochs", [TWO_EPOCHS, FOUR_EPOCHS])
def test_the_run_summary_evaluate_summary_and_report_print_no_nan(epochs):
    from ampflow.components.evaluate_parity.cli import _summary
    from ampflow.components.evaluate_parity.report import _training_section
    from ampflow.pipeline.report import training_parity

    metrics = _metrics(*epochs)
    run_summary = training_parity(metrics)["parity.amp_training_speedup"]
    assert "nan" not in run_summary and " vs 100 img/s" in run_summary
    result = SimpleNamespace(passed=True, verdict={"notes": []}, output_dir=Path("eval"),
                             metrics={**metrics, "context": {"policy": "mixed_float16"},
                                      "baseline_detectable_drop_points": 46.0,  # step.py's
                                      "chance_accuracy": 0.34, "chance_binomial_p_value": 0.01,
                                      "fp32_twin_accuracy": 0.9, "argmax_agreement": 1.0,
                                      "max_relative_logit_diff": 1e-4})
    assert "nan" not in _summary(result)["training_speedup"]
    section = _training_section(metrics, {"modality": "text"})
    [line] = [s for s in section if s.startswith("- AMP training speedup")]
    assert "texts/s" in line and "img/s" not in line
    assert "nan" not in "\n".join(section)  # the table's SE too: n/a
