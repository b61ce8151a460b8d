"""evaluate: the FP32 parity gate of a mixed-precision model.

*Inference parity* (numerics): the trained weights run under the training policy and under a
float32 twin (same architecture, float32 policy, weights copied); both are scored on the same
split. Any difference comes from half-precision compute alone. *Training parity*: a model
trained under float32 on the same data and seed is scored too; a paired test on the two models'
per-image correctness says whether AMP training lost accuracy, and the AMP training speedup is
measured from both runs (training.py). The pipeline runs both by default.

The gate's defaults, and why:
- `max_accuracy_drop=0.5` points (twin minus AMP). Same weights: a prediction flips only for an
  example whose top-2 logits are closer than the rounding error. On the 359 digits test images
  one flip is 0.28 points, so the default allows one net flip; on ImageNet-size test sets
  published AMP results match float32 well within 0.5 points.
- `min_agreement=0.99`: at most 1 % of examples may change class. Measured 100 % for
  mixed_float16 and mixed_bfloat16 on the digits test split (99.86 % for bfloat16 on the train
  split, two flips out of 1,438).
- `max_relative_logit_diff` = auto: 20 units of roundoff of the compute dtype (float16 2**-11,
  bfloat16 2**-8), relative to the largest |logit|: 9.8e-3 for float16, 7.8e-2 for bfloat16.
  bfloat16 keeps ~3 significant digits against float16's ~3.3, so one absolute bound would be
  either too loose for float16 or too tight for bfloat16; a relative bound also holds whatever
  the logit scale. Measured: 3.8e-4 (float16) and 3.8e-3 (bfloat16), about one unit each.
- `amp_nonfinite_logits <= 0`: an inf/NaN logit is a float16 overflow, never rounding noise.
  Overflows inside the network are often turned into finite but wrong logits by later layers
  (measured: see tests/components/evaluate_parity/conftest.py); the twin comparison catches
  those.
- with a baseline: the one-sided exact McNemar test must not find AMP training worse at
  `baseline_alpha=0.01`, and the drop must not exceed `max_baseline_accuracy_drop=3`
  points (BASELINE_MAX_DROP_POINTS has the measurements that chose both; training.py explains
  the statistics).
- `min_training_speedup` is off by default: the speedup depends on the hardware (none on a CPU
  without bfloat16 units, DESIGN.md), so gating on it is a per-deployment choice.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.components.evaluate_parity import training
from ampflow.components.evaluate_parity.gate import Check, Verdict, default_relative_logit_bound
from ampflow.components.evaluate_parity.parity import LogitParity, ModelScores, logit_parity
from ampflow.components.evaluate_parity.verdict import (
    HASH_KEY,
    VERDICT_FILE,
    model_sha256,
)
from ampflow.errors import ConfigError, GateFailedError
from ampflow.files import read_json, staging_dir, write_json_atomic

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
CONFUSION_MATRIX_FILE = "confusion_matrix.json"
REPORT_FILE = "report.md"
CONFIG_FILE = "config.json"
LOSS_SCALE_HISTORY_FILE = "loss_scale_history.json"
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
    max_accuracy_drop: float = field(default=0.5, metadata={
        "help": "Max accuracy drop of the AMP model vs its float32 twin, in percentage points."})
    min_agreement: float = field(default=0.99, metadata={
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
        if self.max_relative_logit_diff is not None and not self.max_relative_logit_diff >= 0:
            raise ConfigError("max_relative_logit_diff must be >= 0. Received: "
                              f"max_relative_logit_diff={self.max_relative_logit_diff}")
        if self.min_training_speedup is not None and not self.min_training_speedup > 0:
            raise ConfigError("min_training_speedup must be > 0. Received: "
                              f"min_training_speedup={self.min_training_speedup}")


@dataclass(frozen=True)
class EvaluateResult:
    """Where the evaluation was written, its metrics and its verdict."""

    output_dir: Path
    metrics: dict[str, Any]
    verdict: dict[str, Any]

    @property
    def passed(self) -> bool:
        """Whether the parity gate passed."""
        return bool(self.verdict["passed"])


def run_evaluate(config: EvaluateConfig) -> EvaluateResult:
    """Score the model, its float32 twin (and a baseline); write everything; then gate.

    All outputs are written before the gate can raise, so a failed gate still leaves the
    metrics, the verdict (passed=false) and the report for the post-mortem.
    """
    from ampflow.components.prepare_data import load_arrays, load_dataset_info
    from ampflow.components.train import load_trained_model

    info = load_dataset_info(config.data_dir)  # bad inputs fail before any compute
    model, metadata = load_trained_model(config.model_dir)
    model_hashes = {HASH_KEY: model_sha256(config.model_dir)}
    _require_same_dataset("model_dir", metadata, info)
    baseline = _load_baseline(config, info)
    if baseline is not None:
        model_hashes["baseline_" + HASH_KEY] = model_sha256(config.baseline_model_dir)
    _require_writable_parent(config.output_dir)

    images, labels = load_arrays(config.data_dir, config.split, limit=config.limit)
    images = images.astype(np.float32)
    scores = _score_all(config, model, metadata, baseline, images, labels)
    policy = _policy(metadata, model)
    metrics, verdict_obj, parity = _measure(config, metadata, policy, baseline, info, scores)
    verdict = _verdict_payload(config, verdict_obj, policy, model_hashes)
    _write_outputs(config, metrics, verdict, info, scores, parity)
    log.info("%s", verdict_obj.message())
    if not verdict_obj.passed and config.fail_on_gate:
        raise GateFailedError(f"{verdict_obj.message()} (outputs in {config.output_dir})")
    return EvaluateResult(output_dir=Path(config.output_dir), metrics=metrics, verdict=verdict)


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The flat finite numbers of metrics.json, ready for KFP `Metrics.log_metric(name, v)`.

    NaN and inf are left out: KFP stores metrics as protobuf JSON, which cannot hold them (the
    task would fail after its work is done). metrics.json keeps them, as null.
    """
    return {key: float(value) for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


# --- inputs ---------------------------------------------------------------------------------

def _require_in_range(name: str, value: float, low: float, high: float) -> None:
    if value is None or not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low:g}, {high:g}]. Received: {name}={value}")


def _require_same_dataset(what: str, metadata: dict[str, Any], info: dict[str, Any]) -> None:
    """The model must take this dataset's images and predict its classes."""
    expected = (list(info["image_shape"]), int(info["num_classes"]))
    received = (list(metadata.get("input_shape") or []), int(metadata.get("num_classes") or 0))
    if expected != received:
        raise ConfigError(
            f"{what} must hold a model for the dataset in data_dir (input_shape "
            f"{expected[0]}, {expected[1]} classes). Received: input_shape {received[0]}, "
            f"{received[1]} classes"
        )


def _load_baseline(config: EvaluateConfig, info: dict[str, Any]):
    """Load the optional float32 baseline; a mixed-precision 'baseline' is a config error."""
    if config.baseline_model_dir is None:
        return None
    from ampflow.components.train import load_trained_model

    model, metadata = load_trained_model(config.baseline_model_dir)
    _require_same_dataset("baseline_model_dir", metadata, info)
    policy = _policy(metadata, model)
    if policy != "float32":
        raise ConfigError(
            "baseline_model_dir must hold a model trained under the float32 policy. "
            f"Received: a model trained under {policy!r}"
        )
    return model, metadata


def _require_writable_parent(output_dir: Path) -> None:
    from ampflow.files import ensure_writable_dir

    ensure_writable_dir(Path(output_dir).resolve().parent, "output_dir's parent")


def _policy(metadata: dict[str, Any], model) -> str:
    """The training policy from the metadata, else from the model's compute layers."""
    from ampflow.components.evaluate_parity.twin import compute_policy

    return (metadata.get("precision") or {}).get("policy") or compute_policy(model)


def _compute_dtype(policy: str) -> str:
    import keras

    return keras.DTypePolicy(policy).compute_dtype


# --- measuring ------------------------------------------------------------------------------

def _score_all(config, model, metadata, baseline, images, labels) -> dict[str, ModelScores]:
    """Logits of the AMP model, its float32 twin and (if given) the baseline."""
    from ampflow.components.evaluate_parity.twin import build_float32_twin

    twin = build_float32_twin(model, metadata)
    scores = {
        "amp": _score(model, images, labels, config.batch_size),
        "fp32_twin": _score(twin, images, labels, config.batch_size),
    }
    if baseline is not None:
        scores["baseline"] = _score(baseline[0], images, labels, config.batch_size)
    return scores


def _score(model, images: np.ndarray, labels: np.ndarray, batch_size: int) -> ModelScores:
    """Logits in batches of one fixed shape: one trace per model, not one per batch size."""
    from ampflow.components.evaluate_parity.twin import logits_model

    batch_size = min(batch_size, len(images))
    padding = -len(images) % batch_size
    padded = np.concatenate([images, np.repeat(images[-1:], padding, axis=0)])
    logits = logits_model(model).predict(padded, batch_size=batch_size, verbose=0)
    return ModelScores(logits=np.asarray(logits[: len(images)], dtype=np.float32), labels=labels)


def _measure(
    config, metadata, policy, baseline, info, scores
) -> tuple[dict[str, Any], Verdict, LogitParity]:
    """All parity measures (flat scalars + per-class + context), the gate, the raw diffs."""
    amp, twin = scores["amp"], scores["fp32_twin"]
    parity = logit_parity(twin, amp)
    compute_dtype = (metadata.get("precision") or {}).get("compute_dtype") or _compute_dtype(
        policy)
    bound = (config.max_relative_logit_diff if config.max_relative_logit_diff is not None
             else default_relative_logit_bound(compute_dtype))
    metrics: dict[str, Any] = {
        "num_examples": int(amp.labels.shape[0]),
        "amp_accuracy": amp.accuracy,
        "fp32_twin_accuracy": twin.accuracy,
        "accuracy_drop_points": 100.0 * (twin.accuracy - amp.accuracy),
        "argmax_agreement": parity.agreement,
        "max_abs_logit_diff": parity.max_abs_diff,
        "mean_abs_logit_diff": parity.mean_abs_diff,
        "max_relative_logit_diff": parity.max_relative_diff,
        "amp_nonfinite_logits": amp.nonfinite_count,
    }
    checks = _inference_checks(config, metrics, bound)
    if baseline is not None:
        metrics.update(training.training_metrics(amp, scores["baseline"], metadata, baseline[1]))
        checks += training.training_checks(metrics, config.max_baseline_accuracy_drop,
                                           config.baseline_alpha, config.min_training_speedup)
    verdict = Verdict(tuple(checks))
    metrics["gate_passed"] = 1.0 if verdict.passed else 0.0
    metrics["per_class_accuracy"] = _per_class(scores, info)
    metrics["context"] = _context(config, metadata, baseline, policy, compute_dtype, bound)
    metrics["gate"] = {"passed": verdict.passed, "checks": [c.as_dict() for c in checks]}
    return metrics, verdict, parity


def _inference_checks(config, metrics: dict[str, Any], bound: float) -> list[Check]:
    return [
        Check("accuracy_drop_points", metrics["accuracy_drop_points"], "<=",
              config.max_accuracy_drop, "float32-twin accuracy minus AMP accuracy, points"),
        Check("argmax_agreement", metrics["argmax_agreement"], ">=", config.min_agreement,
              "fraction of examples with the same top-1 class"),
        Check("max_relative_logit_diff", metrics["max_relative_logit_diff"], "<=", bound,
              "max |logit diff| / max |float32 logit|"),
        Check("amp_nonfinite_logits", float(metrics["amp_nonfinite_logits"]), "<=", 0.0,
              "inf/NaN logits of the AMP model (an overflow)"),
    ]


def _per_class(scores: dict[str, ModelScores], info: dict[str, Any]) -> dict[str, dict]:
    names = _class_names(info)
    out = {}
    for key, model_scores in scores.items():
        values = model_scores.per_class_accuracy(len(names))
        out[key] = {name: (float(v) if math.isfinite(v) else None)
                    for name, v in zip(names, values, strict=True)}
    return out


def _class_names(info: dict[str, Any]) -> list[str]:
    names = info.get("class_names") or []
    if len(names) != int(info["num_classes"]):
        names = [str(i) for i in range(int(info["num_classes"]))]
    return [str(name) for name in names]


def _context(config, metadata, baseline, policy, compute_dtype, bound) -> dict[str, Any]:
    ctx = {
        "model_name": metadata.get("model_name"),
        "model_dir": os.fspath(config.model_dir),
        "policy": policy,
        "compute_dtype": compute_dtype,
        "split": config.split,
        "relative_logit_bound": bound,
        "relative_logit_bound_source": ("config" if config.max_relative_logit_diff is not None
                                        else f"auto: 20 units of roundoff of {compute_dtype}"),
        "baseline_model_dir": (os.fspath(config.baseline_model_dir)
                               if config.baseline_model_dir else None),
    }
    if baseline is not None:
        ctx["baseline_notes"] = training.comparability_notes(metadata, baseline[1])
        for note in ctx["baseline_notes"]:
            log.warning("baseline not strictly comparable: %s", note)
    return ctx


# --- writing --------------------------------------------------------------------------------

def _verdict_payload(config, verdict: Verdict, policy: str,
                     model_hashes: dict[str, str]) -> dict[str, Any]:
    return {
        "passed": verdict.passed,
        "failed_checks": [check.as_dict() for check in verdict.failed],
        "checks": [check.as_dict() for check in verdict.checks],
        "message": verdict.message(),
        "model_dir": os.fspath(config.model_dir),
        "policy": policy,
        "metrics_file": METRICS_FILE,
        **model_hashes,
    }


def _write_outputs(config, metrics, verdict, info, scores, parity: LogitParity) -> None:
    """Write every file into a staging dir, then rename it to output_dir in one step."""
    from ampflow.components.evaluate_parity import report

    names = _class_names(info)
    with staging_dir(config.output_dir, replaces="verdict.json") as tmp:
        write_json_atomic(tmp / METRICS_FILE, _json_safe(metrics))
        write_json_atomic(tmp / CONFUSION_MATRIX_FILE, {
            "categories": names,
            "matrix": scores["amp"].confusion_matrix(len(names)).tolist(),
            "fp32_twin_matrix": scores["fp32_twin"].confusion_matrix(len(names)).tolist(),
            "rows": "true class", "columns": "predicted class",
        })
        series = {key: np.array([np.nan if v is None else v for v in per.values()])
                  for key, per in metrics["per_class_accuracy"].items()}
        report.plot_per_class_accuracy(tmp / report.PER_CLASS_PNG, names, series)
        scale = float(np.max(np.abs(scores["fp32_twin"].logits), initial=0.0))
        report.plot_logit_diff_histogram(tmp / report.LOGIT_DIFF_PNG, parity.abs_diff,
                                         metrics["context"]["relative_logit_bound"] * scale)
        report.plot_loss_scale_history(tmp / report.LOSS_SCALE_PNG,
                                       _loss_scale_history(config.model_dir),
                                       metrics["context"]["policy"])
        (tmp / REPORT_FILE).write_text(report.render_markdown(metrics, verdict))
        write_json_atomic(tmp / CONFIG_FILE, _config_dict(config))
        write_json_atomic(tmp / VERDICT_FILE, verdict)


def _loss_scale_history(model_dir: Path) -> list[dict[str, Any]]:
    path = Path(model_dir) / LOSS_SCALE_HISTORY_FILE
    if not path.is_file():
        return []
    try:
        history = read_json(path)
    except ValueError:
        log.warning("%s is corrupt; the loss-scale plot will be empty", path)
        return []
    return history if isinstance(history, list) else []


def _config_dict(config: EvaluateConfig) -> dict[str, Any]:
    return {k: os.fspath(v) if isinstance(v, Path) else v
            for k, v in dataclasses.asdict(config).items()}


def _json_safe(value: Any) -> Any:
    """Non-finite floats become null: strict JSON readers (KFP among them) reject NaN/inf."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
