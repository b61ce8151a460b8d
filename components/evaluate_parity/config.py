"""The evaluate step's config: what it reads and the gate's thresholds, with their defaults.

Each default is chosen from a measurement or a statistical rule (one net flip on the digits
test split, 20 units of roundoff per compute dtype, tests at 0.01, power 0.8); what is good
enough (`min_accuracy`, `metric_thresholds`, `min_training_speedup`) is the deployment's call,
so off by default. Each default and why: docs/explanation/design-notes.md,
"evaluate_parity/config.py".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ampflow.errors import ConfigError

MAX_ACCURACY_DROP_POINTS = 0.5
MIN_AGREEMENT = 0.99

# Training-parity defaults, from measurements on the digits test split (359 images, small_cnn,
# 8 epochs, seeds 1-5, this CPU). AMP-trained minus float32-trained accuracy with the same seed
# ranged from -2.23 to +1.67 points (mixed_float16) and -1.39 to +0.56 (mixed_bfloat16); the
# smallest one-sided McNemar p was 0.048 (-2.23 points: 5 vs 13 images). Two mixed_float16 runs
# with different seeds differ by up to 3.06 points (p = 0.013); float32 runs by at most 0.84.
# One run against one run carries that training noise, which the paired test (it sees only the
# test set's noise) does not: so the level is 0.01 and the cap 3 points, which none of the ten
# measured sound pairs fails, while damaged AMP training (a stalled or collapsed run) loses far
# more (tests/components/evaluate_parity). On a large test set the paired test dominates: at
# 10,000 images, 300 of them discordant, it flags a one-sided loss of 0.4 points.
BASELINE_MAX_DROP_POINTS = 3.0
BASELINE_ALPHA = 0.01
CHANCE_ALPHA = 0.01
MIN_POWER = 0.8
SERVING_ALPHA = 0.01
MAX_DETECTABLE_DROP_POINTS = 5.0
# The rules that decide the comparison with the model serving (comparison.py).
NO_REGRESSION = "no-regression"
NON_INFERIORITY = "non-inferiority"
SERVING_RULES = (NO_REGRESSION, NON_INFERIORITY)


@dataclass(frozen=True)
class EvaluateConfig:
    """What the parity evaluation reads and the gate's thresholds; written as config.json."""

    model_dir: Path = field(metadata={"help": "A trained model dir (from train)."})
    data_dir: Path = field(metadata={"help": "The prepared dataset dir the model was trained on."})
    output_dir: Path = field(metadata={"help": "Directory that receives metrics, verdict, report."})
    baseline_model_dir: Path | None = field(default=None, metadata={
        "help": "Optional float32-trained model dir (same data and seed) for training parity."})
    split: str = field(default="test", metadata={"help": "Dataset split to evaluate on."})
    batch_size: int = field(default=256, metadata={"help": "Examples per inference batch."})
    limit: int | None = field(default=None, metadata={
        "help": "Evaluate only the first N examples of the split (smoke runs)."})
    max_accuracy_drop: float = field(default=MAX_ACCURACY_DROP_POINTS, metadata={
        "help": "Max accuracy drop of the AMP model vs its float32 twin, in percentage points."})
    min_agreement: float = field(default=MIN_AGREEMENT, metadata={
        "help": "Min fraction of examples where AMP and float32 twin predict the same class."})
    max_relative_logit_diff: float | None = field(default=None, metadata={
        "help": "Max |logit diff| / max |logit|; unset = auto: 20 units of roundoff of the "
                "compute dtype (9.8e-3 for float16, 7.8e-2 for bfloat16)."})
    max_baseline_accuracy_drop: float = field(default=BASELINE_MAX_DROP_POINTS, metadata={
        "help": "With a baseline: max accuracy drop of the AMP-trained model vs the "
                "float32-trained baseline, in points (whatever the paired test says)."})
    baseline_alpha: float = field(default=BASELINE_ALPHA, metadata={
        "help": "With a baseline: significance level of the one-sided paired (McNemar) test "
                "that fails the gate when AMP training is significantly less accurate."})
    min_training_speedup: float | None = field(default=None, metadata={
        "help": "With a baseline: min training throughput ratio AMP/float32; unset = not "
                "gated (the speedup is hardware-dependent)."})
    chance_alpha: float = field(default=CHANCE_ALPHA, metadata={
        "help": "Significance level of the one-sided binomial test that the accuracy is above "
                "the split's majority-class rate (chance); the gate fails above it."})
    min_power: float = field(default=MIN_POWER, metadata={
        "help": "Power the chance test must have against a model halfway between chance and "
                "perfect (a smaller split is reported as too small to decide), and the power "
                "at which each paired comparison's detectable drop is stated."})
    min_accuracy: float = field(default=0.0, metadata={
        "help": "Min accuracy of the AMP model on the split, 0 to 1; 0 = not gated."})
    metric_thresholds: str = field(default="", metadata={
        "metavar": "NAME>=VALUE,...",
        "help": "More absolute thresholds, NAME>=VALUE or NAME<=VALUE, comma-separated, on the "
                "numbers of metrics.json (e.g. 'fp32_twin_accuracy>=0.9'); empty = none."})
    serving_base_path: str | None = field(default=None, metadata={
        "metavar": "DIR",
        "help": "Base path of the model now serving (<model_store>/<model_name>, TF Serving's "
                "layout): its highest version is scored on the same examples and the gate "
                "fails on a significant regression; no version there = the first release."})
    serving_alpha: float = field(default=SERVING_ALPHA, metadata={
        "help": "Significance level of the one-sided paired (McNemar) test that fails the gate "
                "when the model is less accurate than the one serving."})
    serving_rule: str = field(default=NO_REGRESSION, metadata={
        "choices": SERVING_RULES,
        "help": "How the comparison with the model serving decides: no-regression (refuse a "
                "significantly worse model, and one worse on the point estimate when the test "
                "cannot detect a --max-detectable-drop) or non-inferiority (deploy only if the "
                "data show it is not worse by --non-inferiority-margin points)."})
    non_inferiority_margin: float = field(default=0.0, metadata={
        "help": "With --serving-rule non-inferiority: the accuracy drop, in points, the "
                "deployment accepts (required: > 0)."})
    max_detectable_drop: float = field(default=MAX_DETECTABLE_DROP_POINTS, metadata={
        "help": "With --serving-rule no-regression: a model worse than the one serving on the "
                "point estimate is refused unless the paired test detects a drop of this many "
                "points (at min_power, 80 %% by default); more test data, a margin or --force "
                "decide it."})
    force: bool = field(default=False, metadata={
        "help": "Deploy a model the no-regression rule stops because its test cannot tell "
                "(never a significantly worse one); recorded in the verdict."})
    fail_on_gate: bool = field(default=True, metadata={
        "help": "Raise (exit non-zero) when the gate fails; the outputs are written either way."})

    def __post_init__(self) -> None:
        if self.batch_size is None or self.batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0. Received: batch_size={self.batch_size}")
        if self.limit is not None and self.limit <= 0:
            raise ConfigError(f"limit must be > 0. Received: limit={self.limit}")
        if not self.split:
            raise ConfigError(f"split must be a non-empty name. Received: split={self.split!r}")
        _require_in_range("min_agreement", self.min_agreement, 0.0, 1.0)
        _require_in_range("max_accuracy_drop", self.max_accuracy_drop, 0.0, 100.0)
        _require_in_range("max_baseline_accuracy_drop", self.max_baseline_accuracy_drop,
                          0.0, 100.0)
        if self.baseline_alpha is None or not 0.0 < self.baseline_alpha < 1.0:
            raise ConfigError("baseline_alpha must be in (0, 1). Received: "
                              f"baseline_alpha={self.baseline_alpha}")
        for name in ("chance_alpha", "serving_alpha", "min_power"):
            value = getattr(self, name)
            if value is None or not 0.0 < value < 1.0:
                raise ConfigError(f"{name} must be in (0, 1). Received: {name}={value}")
        _require_in_range("min_accuracy", self.min_accuracy, 0.0, 1.0)
        check_serving_rule(self)
        from ampflow.components.evaluate_parity.release import parse_metric_thresholds

        parse_metric_thresholds(self.metric_thresholds)
        if self.max_relative_logit_diff is not None and not self.max_relative_logit_diff >= 0:
            raise ConfigError("max_relative_logit_diff must be >= 0. Received: "
                              f"max_relative_logit_diff={self.max_relative_logit_diff}")
        if self.min_training_speedup is not None and not self.min_training_speedup > 0:
            raise ConfigError("min_training_speedup must be > 0. Received: "
                              f"min_training_speedup={self.min_training_speedup}")


def check_serving_rule(config) -> None:
    """The rule's fields (EvaluateConfig's or ServingGateConfig's), in one line each."""
    if config.serving_rule not in SERVING_RULES:
        raise ConfigError(f"serving_rule must be one of {', '.join(SERVING_RULES)}. Received: "
                          f"serving_rule={config.serving_rule!r}")
    _require_in_range("max_detectable_drop", config.max_detectable_drop, 0.0, 100.0)
    _require_in_range("non_inferiority_margin", config.non_inferiority_margin, 0.0, 100.0)
    if config.serving_rule == NON_INFERIORITY and not config.non_inferiority_margin > 0:
        raise ConfigError("non_inferiority_margin must be > 0 points with serving_rule "
                          "non-inferiority (the drop the deployment accepts). Received: "
                          f"non_inferiority_margin={config.non_inferiority_margin}")
    if config.non_inferiority_margin >= 100.0:
        raise ConfigError("non_inferiority_margin must be under 100 points. Received: "
                          f"non_inferiority_margin={config.non_inferiority_margin}")


def _require_in_range(name: str, value: float, low: float, high: float) -> None:
    if value is None or not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low:g}, {high:g}]. Received: {name}={value}")
