"""The comparison with the model serving, decided from per-example correctness (no model).

Fast tests of the direction and the rule: each feeds comparison.py the two models' answers as
correctness arrays, as the serving gate pairs them, so `make test-fast` fails when the
comparison's direction is inverted (a better model refused, a worse one let through), when a
worse model on a small split is deployed silently, or when the rule is not the one named.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ampflow.components.evaluate_parity.comparison import ServingRule, compare_with_served
from ampflow.components.evaluate_parity.config import EvaluateConfig
from ampflow.components.evaluate_parity.gate import Verdict
from ampflow.components.evaluate_parity.parity import ModelScores
from ampflow.components.evaluate_parity.release import ServedVersion
from ampflow.components.evaluate_parity.serving_gate import (
    SERVING_VERDICT_FILE,
    ServingGateConfig,
    require_not_worse,
)
from ampflow.errors import ConfigError, GateFailedError

SERVED = ServedVersion("/store/reviews", 1, None, "/store/reviews/1")


def _scores(right: np.ndarray) -> ModelScores:
    """Answers of a two-class model, right where `right` is True (every label is class 0)."""
    predictions = np.where(right, 0, 1)
    return ModelScores(logits=np.eye(2, dtype=np.float32)[predictions],
                       labels=np.zeros(len(right), dtype=np.int64))


def _pairs(both: int, new_only: int, served_only: int, neither: int):
    """(new, served) scores with these counts of each kind of example."""
    new = np.array([True] * both + [True] * new_only + [False] * served_only + [False] * neither)
    served = np.array([True] * both + [False] * new_only + [True] * served_only
                      + [False] * neither)
    return _scores(new), _scores(served)


def _rule(**changes) -> ServingRule:
    """The rule of EvaluateConfig's defaults, with `changes`."""
    fields = {name: EvaluateConfig.__dataclass_fields__[name].default for name in (
        "serving_rule", "serving_alpha", "non_inferiority_margin", "max_detectable_drop",
        "min_power", "force")}
    fields.update(changes)
    return ServingRule(fields["serving_rule"], fields["serving_alpha"],
                       fields["non_inferiority_margin"], fields["max_detectable_drop"],
                       fields["min_power"], fields["force"])


def _compare(counts, **rule):
    new, served = _pairs(*counts)
    return compare_with_served(new, served, SERVED, _rule(**rule), "test", "texts")


# Issue 46: a 1-epoch model (13 of 18 texts right, 0.722) against the 8-epoch one serving
# (14 of 18, 0.778): 1 text only the new one gets right, 2 only the served one.
EIGHTEEN_TEXTS = (12, 1, 2, 3)


def test_a_worse_model_on_eighteen_texts_is_not_deployed_silently():
    comparison = _compare(EIGHTEEN_TEXTS)
    assert (comparison.accuracy, comparison.served_accuracy) == (13 / 18, 14 / 18)
    assert comparison.p_value == 0.5 and comparison.delta_points == pytest.approx(-5.556, 1e-3)
    assert comparison.outcome == "cannot tell"
    verdict = Verdict(tuple(comparison.checks()))
    assert not verdict.passed
    assert [c.name for c in verdict.failed] == ["serving_detectable_drop_points"]
    assert all("images" not in c.description and "examples" not in c.description
               for c in comparison.checks())  # the data's words: texts
    line = comparison.sentence()
    detectable = comparison.detectable_drop
    assert detectable > 40.0  # not even a 20-point drop could have been found
    assert f"detects a drop of {detectable:.1f} points or more with 80% power" in line
    assert "on 18 texts at alpha 0.01" in line and "(-5.56 points)" in line
    for remedy in ("hold out more texts (--test-fraction", "--serving-rule non-inferiority",
                   "--non-inferiority-margin", "--force"):
        assert remedy in line, remedy
    assert "\n" not in line


def test_force_deploys_the_undecided_model_and_the_verdict_records_it():
    comparison = _compare(EIGHTEEN_TEXTS, force=True)
    assert comparison.outcome == "forced" and comparison.forced
    assert Verdict(tuple(comparison.checks())).passed
    (note,) = comparison.notes()
    assert note.startswith("deployed by force although the test could not tell")
    assert comparison.metrics()["serving_outcome"] == "forced"


def test_force_never_deploys_a_significantly_worse_model():
    comparison = _compare((0, 0, 12, 6), force=True)
    assert comparison.p_value < 0.01 and comparison.outcome == "worse"
    assert not comparison.forced
    assert [c.name for c in Verdict(tuple(comparison.checks())).failed] == [
        "serving_mcnemar_p_value"]


def test_a_clearly_better_model_is_deployed_on_the_same_small_split():
    comparison = _compare((6, 8, 0, 4))
    assert comparison.delta_points > 0 and comparison.outcome == "passed"
    assert Verdict(tuple(comparison.checks())).passed
    assert "detects a drop of" in comparison.sentence()


@pytest.mark.parametrize("counts", [(0, 2, 12, 4), (100, 10, 40, 50)])
def test_the_direction_the_worse_model_fails_and_the_same_pair_swapped_passes(counts):
    """Inverting the comparison (new and served swapped anywhere) fails here, in the fast tier."""
    worse = _compare(counts)
    assert worse.served_only > worse.new_only and worse.p_value < 0.01
    assert worse.outcome == "worse" and worse.sentence().startswith(
        f"accuracy {worse.accuracy:.3f} is significantly below the serving model's")
    both, new_only, served_only, neither = counts
    better = _compare((both, served_only, new_only, neither))
    assert better.new_only > better.served_only and better.p_value > 0.5
    assert better.outcome == "passed" and Verdict(tuple(better.checks())).passed
    assert better.metrics()["serving_only_correct"] == new_only


def test_a_large_split_detects_small_drops_so_a_small_insignificant_drop_passes():
    # 2,000 examples, 1 point worse (30 vs 50 discordant), p = 0.017: the test detects ~3 points
    comparison = _compare((1800, 30, 50, 120))
    assert 0.01 < comparison.p_value < 0.05
    assert comparison.detectable_drop < comparison.rule.max_detectable_drop
    assert comparison.outcome == "passed"


def test_non_inferiority_decides_what_no_regression_cannot():
    # a small, significant drop on a large split: refused as a regression, shown within 1 point
    large = (18_000, 200, 300, 1500)
    assert _compare(large).outcome == "worse"
    within = _compare(large, serving_rule="non-inferiority", non_inferiority_margin=1.0)
    assert within.outcome == "passed" and within.noninferiority_p_value < 1e-4
    assert [c.name for c in within.checks()] == ["serving_noninferiority_p_value"]
    assert Verdict(tuple(within.checks())).passed
    assert "non-inferiority with a margin of 1 points: the score test shows" in within.sentence()
    # the 18 texts that the first rule cannot decide: decided both ways by the margin
    assert _compare(EIGHTEEN_TEXTS).outcome == "cannot tell"
    tight = _compare(EIGHTEEN_TEXTS, serving_rule="non-inferiority", non_inferiority_margin=5)
    assert tight.outcome == "not shown non-inferior"
    assert not Verdict(tuple(tight.checks())).passed
    loose = _compare(EIGHTEEN_TEXTS, serving_rule="non-inferiority", non_inferiority_margin=50)
    assert loose.outcome == "passed"


def test_non_inferiority_is_not_overridden_by_force():
    comparison = _compare(EIGHTEEN_TEXTS, serving_rule="non-inferiority",
                          non_inferiority_margin=5, force=True)
    assert comparison.outcome == "not shown non-inferior" and not comparison.forced


@pytest.mark.parametrize("changes, message", [
    ({"serving_rule": "strict"}, "serving_rule must be one of no-regression, non-inferiority"),
    ({"serving_rule": "non-inferiority"}, "non_inferiority_margin must be > 0 points"),
    ({"max_detectable_drop": -1.0}, r"max_detectable_drop must be in \[0, 100\]"),
])
def test_a_bad_rule_is_refused_in_one_line_by_both_configs(tmp_path, changes, message):
    for config in (EvaluateConfig, ServingGateConfig):
        kwargs = ({"model_dir": tmp_path, "data_dir": tmp_path, "output_dir": tmp_path}
                  if config is EvaluateConfig else
                  {"eval_dir": tmp_path, "data_dir": tmp_path, "output_dir": tmp_path})
        with pytest.raises(ConfigError, match=message):
            config(**kwargs, **changes)


def test_the_serving_gate_config_takes_the_evaluate_steps_defaults(tmp_path):
    gate = ServingGateConfig(eval_dir=tmp_path, data_dir=tmp_path, output_dir=tmp_path)
    for name in ("serving_alpha", "serving_rule", "non_inferiority_margin",
                 "max_detectable_drop", "min_power", "force"):
        assert getattr(gate, name) == EvaluateConfig.__dataclass_fields__[name].default, name


@pytest.mark.parametrize("outcome, why", [
    ("worse", "the model is significantly worse than the one serving"),
    ("cannot tell", "the test cannot tell whether the drop is real"),
    ("not shown non-inferior", "the data do not show the model is within the non-inferiority"),
])
def test_the_pipelines_gate_refuses_with_the_outcomes_reason(tmp_path, outcome, why):
    (tmp_path / SERVING_VERDICT_FILE).write_text(json.dumps(
        {"passed": False, "outcome": outcome, "message": "accuracy 0.722 vs ..."}))
    with pytest.raises(GateFailedError, match=why) as refused:
        require_not_worse(tmp_path)
    assert str(refused.value).endswith("so it is not deployed: accuracy 0.722 vs ...")


def test_evaluates_summary_line_carries_the_detectable_drop_in_the_datas_words(tmp_path):
    from types import SimpleNamespace

    from ampflow.components.evaluate_parity.cli import _summary

    comparison = _compare(EIGHTEEN_TEXTS)
    metrics = {"context": {"policy": "mixed_float16", "modality": "text"},
               "amp_accuracy": 13 / 18, "chance_accuracy": 0.5, "chance_binomial_p_value": 0.05,
               "fp32_twin_accuracy": 13 / 18, "argmax_agreement": 1.0,
               "max_relative_logit_diff": 0.0, **comparison.metrics()}
    verdict = {"message": comparison.sentence(), "notes": []}
    summary = _summary(SimpleNamespace(metrics=metrics, verdict=verdict, passed=False,
                                       output_dir=tmp_path))
    assert summary["serving_accuracy"].endswith(
        f"detects a drop >= {comparison.detectable_drop:.1f} points on 18 texts; "
        "no-regression: cannot tell)")
