"""The release checks' arithmetic (release.py): chance, power, thresholds, the served version.

Pure numpy and files: the expected values are computed here independently (math.comb sums,
by hand), not with the functions under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ampflow.artifacts.verdict import Check
from ampflow.components.evaluate_parity import release
from ampflow.components.evaluate_parity.config import EvaluateConfig
from ampflow.components.evaluate_parity.gate import Verdict
from ampflow.components.evaluate_parity.parity import ModelScores
from ampflow.components.evaluate_parity.training import binomial_upper_tail
from ampflow.errors import ConfigError

NAMES = ["a", "b", "c"]


def _tail(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _power(n: int, chance: float, alpha: float) -> float:
    """Exact power against accuracy (1 + chance) / 2, by enumeration."""
    critical = next((k for k in range(n + 1) if _tail(k, n, chance) <= alpha), None)
    return 0.0 if critical is None else _tail(critical, n, (1 + chance) / 2)


def _scores(labels, predictions, classes: int = 3) -> ModelScores:
    return ModelScores(logits=np.eye(classes, dtype=np.float32)[predictions],
                       labels=np.asarray(labels, dtype=np.int64))


@pytest.mark.parametrize("k, n, p", [(6, 6, 1 / 3), (2, 6, 1 / 3), (0, 5, 0.3), (9, 40, 0.1),
                                     (30, 100, 0.25), (359, 359, 0.103)])
def test_binomial_tail_is_the_exact_sum(k, n, p):
    assert release.binomial_tail(k, n, p) == pytest.approx(_tail(k, n, p), rel=1e-9, abs=1e-300)


def test_binomial_tail_at_one_half_is_the_mcnemar_tail():
    for k, n in [(0, 10), (7, 10), (13, 20), (500, 1000)]:
        assert release.binomial_tail(k, n, 0.5) == pytest.approx(binomial_upper_tail(k, n)[0],
                                                                 rel=1e-9)


def test_binomial_tail_of_a_large_split_stays_finite():
    # 50,000 examples: a sum of 10**-x terms that would underflow without the log space
    assert release.binomial_tail(25_000, 50_000, 0.5) == pytest.approx(0.5, abs=0.01)
    assert 0.0 <= release.binomial_tail(6_000, 50_000, 0.1) < 1e-10


def test_a_chance_level_model_on_six_examples_is_not_above_chance_and_the_split_is_too_small():
    labels = [0, 0, 1, 1, 2, 2]
    test = release.chance_test(_scores(labels, [0, 0, 0, 0, 0, 0]), NAMES, 0.01, 0.8, "test")

    assert (test.correct, test.chance, test.majority_class) == (2, pytest.approx(1 / 3), "a")
    assert test.p_value == pytest.approx(1 - (2 / 3) ** 6 - 6 * (1 / 3) * (2 / 3) ** 5)
    assert not test.check().passed
    assert test.sentence().startswith(
        "accuracy 0.333 is not above chance 0.333 (the majority-class rate of the 6 test "
        "examples, class 'a'): one-sided binomial p = 0.649 > alpha 0.01")
    assert test.too_small and test.power == pytest.approx(_power(6, 1 / 3, 0.01))
    needed = next(n for n in range(7, 200) if _power(n, 1 / 3, 0.01) >= 0.8)
    note = test.too_small_note()
    assert f"needs at least {needed} examples for 0.8" in note
    assert "--test-fraction of prepare-data and run-local" in note and "\n" not in note


def test_a_perfect_model_on_six_examples_is_above_chance_though_the_split_is_small():
    labels = [0, 0, 1, 1, 2, 2]
    test = release.chance_test(_scores(labels, labels), NAMES, 0.01, 0.8, "test")
    assert test.p_value == pytest.approx(1 / 729)
    assert test.check().passed and test.too_small  # significant is significant; still said


def test_chance_is_the_majority_class_rate_so_always_answering_it_never_passes():
    # 90 % of the split is class 0: a model that always says 0 is 90 % accurate, and at chance
    labels = [0] * 90 + [1] * 5 + [2] * 5
    test = release.chance_test(_scores(labels, [0] * 100), NAMES, 0.01, 0.8, "test")
    assert test.accuracy == test.chance == 0.9
    assert not test.check().passed
    # one more right answer than chance on each minority class is not enough either...
    better = release.chance_test(_scores(labels, [0] * 90 + [1] + [0] * 4 + [2] + [0] * 4),
                                 NAMES, 0.01, 0.8, "test")
    assert better.p_value == pytest.approx(_tail(92, 100, 0.9)) and not better.check().passed
    # ...while all of them is
    best = release.chance_test(_scores(labels, labels), NAMES, 0.01, 0.8, "test")
    assert best.p_value == pytest.approx(0.9**100) and best.check().passed


def test_examples_needed_is_the_smallest_split_with_the_stated_power():
    for chance in (1 / 3, 0.1, 0.5):
        n = release.examples_needed(chance, 0.01, 0.8)
        assert _power(n, chance, 0.01) >= 0.8 > _power(n - 1, chance, 0.01), chance
    assert release.chance_test_power(6, 1 / 3, 0.01) == pytest.approx(_power(6, 1 / 3, 0.01))


def test_a_split_too_small_for_any_decision_has_no_power():
    # chance 1/2 on 5 examples: even 5 of 5 right is p = 1/32 > 0.01
    assert release.chance_test_power(5, 0.5, 0.01) == 0.0


@pytest.mark.parametrize("text, parsed", [
    ("", ()),
    ("amp_accuracy>=0.9", (("amp_accuracy", ">=", 0.9),)),
    (" amp_accuracy >= 0.9 , max_abs_logit_diff<=1e-2", (("amp_accuracy", ">=", 0.9),
                                                           ("max_abs_logit_diff", "<=", 0.01))),
])
def test_metric_thresholds_parse(text, parsed):
    assert release.parse_metric_thresholds(text) == parsed


@pytest.mark.parametrize("text", ["amp_accuracy>0.9", "amp_accuracy>=", "amp_accuracy>=high",
                                  ">=0.9", "amp_accuracy>=nan", "a>=1;b<=2"])
def test_metric_thresholds_refuse_what_they_cannot_read_in_one_line(text):
    with pytest.raises(ConfigError, match=r"^metric_thresholds must be NAME>=VALUE or "
                                          r"NAME<=VALUE.*Received: ") as e:
        release.parse_metric_thresholds(text)
    assert "\n" not in str(e.value)


def test_threshold_checks_gate_min_accuracy_and_named_metrics():
    metrics = {"amp_accuracy": 0.8, "argmax_agreement": 1.0, "context": {}}
    checks = release.threshold_checks(metrics, 0.85, "argmax_agreement>=0.99")
    assert [(c.name, c.passed) for c in checks] == [("min_accuracy", False),
                                                    ("threshold:argmax_agreement", True)]
    assert checks[0].explain() == "min_accuracy: accuracy 0.800 is below min_accuracy 0.85"
    assert release.threshold_checks(metrics, 0.0, "") == []  # both off by default
    with pytest.raises(ConfigError, match=r"measures no 'amp_acuracy'. Received: "
                                          r"amp_acuracy>=0.5; did you mean amp_accuracy\?$"):
        release.threshold_checks(metrics, 0.0, "amp_acuracy>=0.5")


@pytest.mark.parametrize("field, value, message", [
    ("chance_alpha", 0.0, r"chance_alpha must be in \(0, 1\)"),
    ("serving_alpha", 1.0, r"serving_alpha must be in \(0, 1\)"),
    ("min_power", 1.5, r"min_power must be in \(0, 1\)"),
    ("min_accuracy", 1.5, r"min_accuracy must be in \[0, 1\]"),
    ("metric_thresholds", "amp_accuracy=0.9", r"metric_thresholds must be NAME>=VALUE"),
])
def test_evaluate_config_refuses_bad_release_settings(tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message):
        EvaluateConfig(model_dir=tmp_path, data_dir=tmp_path, output_dir=tmp_path / "o",
                       **{field: value})


def test_find_served_version_takes_the_highest_complete_version(tmp_path):
    base = tmp_path / "store" / "ampflow"
    assert release.find_served_version(base) is None  # no store yet: the first release
    assert release.find_served_version(None) is None and release.find_served_version("") is None
    for name in ("1", "3", "12", ".13.incomplete-x", "14"):
        (base / name).mkdir(parents=True)
    (base / "1" / "saved_model.pb").write_bytes(b"")
    (base / "3" / "model.tflite").write_bytes(b"")
    (base / ".13.incomplete-x" / "saved_model.pb").write_bytes(b"")  # a deploy still copying
    # 12 and 14 hold no model (a half-copied number): not versions a server loads
    served = release.find_served_version(base)
    assert (served.version, served.path) == (3, base / "3")
    assert served.base_path == str(base)


def test_a_failed_check_explains_itself_with_its_sentence_and_the_verdict_adds_notes():
    check = Check("chance_binomial_p_value", 0.65, "<=", 0.01, reason="accuracy 0.333 is not "
                  "above chance 0.333")
    plain = Check("argmax_agreement", 0.5, ">=", 0.99)
    verdict = Verdict((check, plain), notes=("the test split is too small",))
    assert verdict.message() == (
        "parity gate failed 2/2 checks: chance_binomial_p_value: accuracy 0.333 is not above "
        "chance 0.333; argmax_agreement: measured 0.5 vs threshold >= 0.99; note: the test "
        "split is too small")
