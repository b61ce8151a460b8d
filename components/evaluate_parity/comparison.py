"""The new model against the version serving: the paired numbers, and the rule that decides.

Both models answer the same examples (release.py scores the served one as a server runs it);
training.py's paired test (one-sided exact McNemar) and power.py's numbers say what the data
show. The user picks the rule (`serving_rule`):

- **no-regression** (the default): the new model is refused when it is significantly less
  accurate (p < `serving_alpha`). A test that finds nothing on a small split proves little, so
  when the new model is worse on the point estimate and the test could not detect (80 % power)
  a drop of `max_detectable_drop` points, it is not deployed either: the verdict says the test
  cannot tell, with the numbers and what to do (more test data, the non-inferiority rule with
  a margin, or `force`, which deploys it and is recorded in the verdict). A model no worse on
  the point estimate passes whatever the test's power.
- **non-inferiority**: deploy only if the data show the new model is not worse by
  `non_inferiority_margin` points or more (power.py's score test at `serving_alpha`). It decides
  what the first rule cannot: a small drop on a large split (significant, within the margin)
  passes, and a worse model on a split too small to bound its drop fails, with no override.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ampflow.artifacts.verdict import Check
from ampflow.components.evaluate_parity import power
from ampflow.components.evaluate_parity.config import NO_REGRESSION, NON_INFERIORITY
from ampflow.components.evaluate_parity.parity import ModelScores
from ampflow.components.evaluate_parity.release import ServedVersion, hold_out_more


@dataclass(frozen=True)
class ServingRule:
    """How the comparison decides: the serving fields of EvaluateConfig (their defaults)."""

    name: str  # NO_REGRESSION or NON_INFERIORITY
    alpha: float
    margin: float  # points; the non-inferiority rule's
    max_detectable_drop: float  # points; the no-regression rule's
    power: float
    force: bool

    @classmethod
    def of(cls, config) -> ServingRule:
        """The rule of an EvaluateConfig or a ServingGateConfig (the same field names)."""
        return cls(config.serving_rule, config.serving_alpha, config.non_inferiority_margin,
                   config.max_detectable_drop, config.min_power, config.force)


@dataclass(frozen=True)
class ServingComparison:
    """The new model against the served version on the same examples, and the rule's outcome."""

    served: ServedVersion
    accuracy: float
    served_accuracy: float
    num_examples: int
    new_only: int  # examples only the new model classifies correctly
    served_only: int  # examples only the served version classifies correctly
    p_value: float  # one-sided: P(losing >= served_only discordant examples | equal accuracy)
    method: str
    split: str
    rule: ServingRule
    detectable_drop: float | None  # points the test finds with rule.power; None: no drop
    noninferiority_p_value: float | None = None  # with the non-inferiority rule
    item: str = "examples"  # the data's word: images, texts

    @property
    def alpha(self) -> float:
        """The rule's significance level (both tests are one-sided at it)."""
        return self.rule.alpha

    @property
    def delta_points(self) -> float:
        """New accuracy minus served accuracy, in percentage points."""
        return 100.0 * (self.new_only - self.served_only) / self.num_examples

    @property
    def significantly_worse(self) -> bool:
        """Whether the paired test finds the new model less accurate at alpha."""
        return self.p_value < self.alpha

    @property
    def cannot_tell(self) -> bool:
        """Worse on the point estimate, not significantly, and the test too weak to tell."""
        weak = self.detectable_drop is None or self.detectable_drop > self.rule.max_detectable_drop
        return (self.rule.name == NO_REGRESSION and self.delta_points < 0
                and not self.significantly_worse and weak)

    @property
    def forced(self) -> bool:
        """Whether `force` let through a model the rule would have stopped as undecided."""
        return self.cannot_tell and self.rule.force

    @property
    def outcome(self) -> str:
        """`worse`, `cannot tell`, `not shown non-inferior` (the refusals), `forced` or `passed`."""
        if self.rule.name == NON_INFERIORITY:
            shown = self.noninferiority_p_value is not None and (
                self.noninferiority_p_value <= self.alpha)
            return "passed" if shown else "not shown non-inferior"
        if self.significantly_worse:
            return "worse"
        if self.cannot_tell:
            return "forced" if self.rule.force else "cannot tell"
        return "passed"

    def power_sentence(self) -> str:
        """What the paired test could detect on this split: the verdict line's last clause."""
        share = (self.new_only + self.served_only) / self.num_examples
        if self.detectable_drop is None:
            found = "could not detect any drop, however large"
        else:
            found = (f"detects a drop of {self.detectable_drop:.1f} points or more with "
                     f"{self.rule.power:.0%} power")
        return (f"on {self.num_examples} {self.item} at alpha {self.alpha:g} the paired test "
                f"{found} (assuming the {share:.1%} discordance seen here, or the drop itself "
                "where larger)")

    def sentence(self) -> str:
        """The comparison in words: the paired numbers, the test, what it could detect."""
        worse = self.significantly_worse
        head = (f"accuracy {self.accuracy:.3f} is significantly below the serving model's "
                if worse else f"accuracy {self.accuracy:.3f} vs the serving model's ")
        text = (f"{head}{self.served_accuracy:.3f} (version {self.served.version} at "
                f"{self.served.base_path}): on the same {self.num_examples} {self.split} "
                f"{self.item} it is right on {self.new_only} that the serving model gets "
                f"wrong and wrong on {self.served_only} that it gets right "
                f"({self.delta_points:+.2f} points), one-sided McNemar p = {self.p_value:.3g} "
                f"{'<' if worse else '>='} alpha {self.alpha:g}; {self.power_sentence()}")
        return text + self._rule_clause()

    def _rule_clause(self) -> str:
        outcome = self.outcome
        if self.rule.name == NON_INFERIORITY:
            shown = "shows" if outcome == "passed" else "does not show"
            return (f"; non-inferiority with a margin of {self.rule.margin:g} points: the score "
                    f"test {shown} it is not worse by that much (p = "
                    f"{self.noninferiority_p_value:.3g} vs alpha {self.alpha:g})")
        if outcome in ("cannot tell", "forced"):
            limit = f"{self.rule.max_detectable_drop:g}"
            text = (f"; worse on the point estimate, and too weak a test to find a {limit}-point "
                    "drop (max_detectable_drop)")
            if outcome == "forced":
                return text + "; deployed all the same by force (recorded in the verdict)"
            return text + (f". To decide: {hold_out_more(self.item)}; or choose "
                           "--serving-rule non-inferiority with a --non-inferiority-margin in "
                           "points; or deploy it all the same with --force")
        return ""

    def metrics(self) -> dict[str, Any]:
        """The flat entries of metrics.json."""
        out = {
            "num_examples": self.num_examples,
            "serving_version": float(self.served.version),
            "serving_accuracy": self.served_accuracy,
            "serving_accuracy_delta_points": self.delta_points,
            "serving_new_only_correct": float(self.new_only),
            "serving_only_correct": float(self.served_only),
            "serving_mcnemar_p_value": self.p_value,
            "serving_mcnemar_method": self.method,
            "serving_detectable_drop_points": (math.inf if self.detectable_drop is None
                                               else self.detectable_drop),  # null in JSON
            "serving_rule": self.rule.name,
            "serving_outcome": self.outcome,
        }
        if self.noninferiority_p_value is not None:
            out["serving_noninferiority_p_value"] = self.noninferiority_p_value
            out["serving_noninferiority_margin_points"] = self.rule.margin
        return out

    def checks(self) -> list[Check]:
        """The gate's checks under the rule (see the module docstring)."""
        if self.rule.name == NON_INFERIORITY:
            return [Check("serving_noninferiority_p_value", self.noninferiority_p_value, "<=",
                          self.alpha, f"one-sided score test that the model is not worse than "
                          f"the one serving by {self.rule.margin:g} points or more",
                          reason=self.sentence())]
        checks = [Check("serving_mcnemar_p_value", self.p_value, ">=", self.alpha,
                        f"one-sided paired (McNemar) test: chance of losing this many {self.item} "
                        "to the model now serving by luck, if both were equally accurate",
                        reason=self.sentence())]
        if self.cannot_tell and not self.rule.force:
            drop = math.inf if self.detectable_drop is None else self.detectable_drop
            checks.append(Check("serving_detectable_drop_points", drop, "<=",
                                self.rule.max_detectable_drop,
                                "the smallest drop the paired test detects with "
                                f"{self.rule.power:.0%} power, points (gated when the model is "
                                "worse on the point estimate)", reason=self.sentence()))
        return checks

    def notes(self) -> tuple[str, ...]:
        """What the verdict adds in words: a forced deployment."""
        if self.forced:
            return (f"deployed by force although the test could not tell: {self.sentence()}",)
        return ()


def compare_with_served(new: ModelScores, served_scores: ModelScores, served: ServedVersion,
                        rule: ServingRule, split: str, item: str = "examples"
                        ) -> ServingComparison:
    """The paired test of training.py, new model vs served version, decided by `rule`."""
    from ampflow.components.evaluate_parity.training import paired_test

    test = paired_test(new, served_scores)
    n = test.num_examples
    discordant = (test.amp_only + test.baseline_only) / n
    noninferiority = (power.noninferiority_p_value(test.amp_only, test.baseline_only, n,
                                                   rule.margin / 100.0)
                      if rule.name == NON_INFERIORITY else None)
    return ServingComparison(
        served=served, accuracy=new.accuracy, served_accuracy=served_scores.accuracy,
        num_examples=n, new_only=test.amp_only, served_only=test.baseline_only,
        p_value=test.p_value, method=test.method, split=split, rule=rule,
        detectable_drop=power.detectable_drop(n, discordant, rule.alpha, rule.power),
        noninferiority_p_value=noninferiority, item=item)
