"""The run's closing table says what the gate could detect, for every decision (issue 46).

A run on a small split used to print "-5.56 points vs serving version 1 (McNemar p = 0.5)" and
nothing on what the test could have found; the split-too-small note appeared only in a step's
log. Here the table is built (pipeline/report.py's key_metrics) from artifacts as the tasks
write them: the comparison's metrics and notes from comparison.py itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ampflow.components.evaluate_parity.comparison import ServingRule, compare_with_served
from ampflow.components.evaluate_parity.parity import ModelScores
from ampflow.components.evaluate_parity.release import ServedVersion
from ampflow.components.evaluate_parity.serving_gate import SERVING_VERDICT_FILE, refusal
from ampflow.pipeline.report import key_metrics, serving_failure


def _scores(right: list[bool]) -> ModelScores:
    predictions = np.where(right, 0, 1)
    return ModelScores(np.eye(2, dtype=np.float32)[predictions], np.zeros(len(right), np.int64))


def _eighteen_texts(force: bool = False):
    """Issue 46's case: 1 text only the new model gets right, 2 only the served one."""
    new = [True] * 12 + [True] + [False] * 2 + [False] * 3
    served = [True] * 12 + [False] + [True] * 2 + [False] * 3
    rule = ServingRule("no-regression", 0.01, 0.0, 5.0, 0.8, force)
    return compare_with_served(_scores(new), _scores(served),
                               ServedVersion("/store/m", 1, Path("/store/m/1"), "/store/m/1"),
                               rule, "test", "texts")


def _run(tmp_path: Path, comparison, chance_note: str) -> SimpleNamespace:
    data, verdict, compared = (tmp_path / d for d in ("data", "verdict", "comparison"))
    for folder in (data, verdict, compared):
        folder.mkdir()
    (data / "dataset_info.json").write_text(json.dumps(
        {"modality": "text", "splits": {"train": 162, "test": 18}}))
    (verdict / "metrics.json").write_text(json.dumps(
        {"amp_accuracy": 13 / 18, "chance_accuracy": 0.5, "chance_binomial_p_value": 0.048,
         "gate": {"passed": True}}))
    (verdict / "verdict.json").write_text(json.dumps({"passed": True, "notes": [chance_note]}))
    checks = comparison.checks()
    (compared / SERVING_VERDICT_FILE).write_text(json.dumps(
        {"passed": all(c.passed for c in checks), "outcome": comparison.outcome,
         "message": comparison.sentence(), "notes": list(comparison.notes()),
         "metrics": {k: (None if v == float("inf") else v)
                     for k, v in comparison.metrics().items()}}))
    return SimpleNamespace(artifacts={"prepare-data": {"data": data},
                                      "evaluate-parity": {"verdict": verdict},
                                      "compare-serving": {"comparison": compared}})


def test_the_table_carries_the_detectable_drop_in_texts_and_every_note(tmp_path):
    comparison = _eighteen_texts()
    note = "the test split of 18 texts is too small to decide whether the model beats chance"
    rows = key_metrics(_run(tmp_path, comparison, note))
    line = rows["release.vs_serving"]
    assert f"detects >= {comparison.detectable_drop:.1f} points on 18 texts" in line
    assert "only served: 2 texts" in line and line.endswith("no-regression: cannot tell")
    assert rows["gate.note 1"] == note  # shown although the evaluate gate passed
    # the refusal the run prints names why and what the test could detect
    refused = serving_failure(tmp_path)
    assert refused == refusal(json.loads(
        (tmp_path / "comparison" / SERVING_VERDICT_FILE).read_text()))
    assert refused.startswith("the model is worse than the one serving on the point estimate "
                              "and the test cannot tell whether the drop is real")


def test_a_forced_deploy_is_a_row_of_the_table(tmp_path):
    rows = key_metrics(_run(tmp_path, _eighteen_texts(force=True), "a chance note"))
    assert rows["release.vs_serving"].endswith("no-regression: forced")
    assert rows["gate.note 2"].startswith("deployed by force although the test could not tell")
    assert serving_failure(tmp_path) is None  # it passed
