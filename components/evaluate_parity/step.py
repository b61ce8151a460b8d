"""evaluate: the release gate of a mixed-precision model (quality, then FP32 parity).

*Inference parity* (numerics): the trained weights run under the training policy and under a
float32 twin (same architecture, float32 policy, weights copied); both are scored on the same
split. Any difference comes from half-precision compute alone. *Training parity*: a model
trained under float32 on the same data and seed is scored too; a paired test on the two models'
per-image correctness says whether AMP training lost accuracy, and the AMP training speedup is
measured from both runs (training.py). The pipeline runs both by default.

Before parity, the model's own quality (release.py): above chance, past the optional absolute
thresholds and, with a serving base path, no worse than the model serving there.

The config and its defaults (and why they are what they are) are in config.py; what is
written, in outputs.py.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.throughput import throughput_unit
from ampflow.artifacts.verdict import HASH_KEY, Check, model_sha256
from ampflow.components.evaluate_parity import outputs, release, training
from ampflow.components.evaluate_parity.comparison import ServingRule, compare_with_served
from ampflow.components.evaluate_parity.config import EvaluateConfig
from ampflow.components.evaluate_parity.gate import Verdict, default_relative_logit_bound
from ampflow.components.evaluate_parity.parity import LogitParity, ModelScores, logit_parity
from ampflow.components.evaluate_parity.power import detectable_drop_points
from ampflow.data.split_request import split_request
from ampflow.errors import ConfigError, GateFailedError
from ampflow.progress import Progress, keras_callback

log = logging.getLogger(__name__)


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
    from ampflow.artifacts.model_dir import load_trained
    from ampflow.data import load_dataset_info

    info = load_dataset_info(config.data_dir)  # bad inputs fail before any compute
    trained = load_trained(config.model_dir)  # a text model with the tokenizer it trained with
    model, metadata = trained.model, trained.metadata
    model_hashes = {HASH_KEY: model_sha256(config.model_dir)}
    _require_same_dataset("model_dir", metadata, info)
    baseline = _load_baseline(config, info, trained.tokenizer)
    if baseline is not None:
        model_hashes["baseline_" + HASH_KEY] = model_sha256(config.baseline_model_dir)
    _require_writable_parent(config.output_dir)

    served = release.find_served_version(config.serving_base_path)
    request = split_request(config.data_dir, config.split, config.limit)
    served_scores = (release.score_served(served, request, release.class_names(info),
                                          config.batch_size) if served else None)
    inputs = np.asarray(trained.inputs(request.examples))  # text: its own tokenizer's ids
    scores = _score_all(config, model, metadata, baseline, inputs, request.labels)
    if served_scores is not None:
        scores["serving"] = served_scores
    policy = _policy(metadata, model)
    metrics, verdict_obj, parity = _measure(config, metadata, policy, baseline, info, scores,
                                            served)
    verdict = outputs.verdict_payload(config, verdict_obj, policy, model_hashes,
                                      _baselines(config, baseline, served),
                                      forced=metrics.get("serving_outcome") == "forced")
    outputs.write_outputs(config, metrics, verdict, release.class_names(info), scores, parity)
    for note in verdict_obj.notes:
        log.warning("%s", note)
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

def _require_same_dataset(what: str, metadata: dict[str, Any], info: dict[str, Any]) -> None:
    """The model must take this dataset's images (or texts) and predict its classes."""
    from ampflow.data.modalities import modality_of

    data, model = modality_of(info), modality_of(metadata)  # the seam, asked once
    if model is not data:
        raise ConfigError(f"{what} must hold a model for the dataset in data_dir, which holds "
                          f"{data.name} data. Received: a model trained on "
                          f"{model.name} data")
    shape = data.model_input_shape(info, metadata)  # text: any length, its own tokenizer's
    expected = (list(shape or []), int(info["num_classes"]))
    received = (list(metadata.get("input_shape") or []), int(metadata.get("num_classes") or 0))
    if expected != received:
        raise ConfigError(
            f"{what} must hold a model for the dataset in data_dir (input_shape "
            f"{expected[0]}, {expected[1]} classes). Received: input_shape {received[0]}, "
            f"{received[1]} classes"
        )


def _load_baseline(config: EvaluateConfig, info: dict[str, Any], tokenizer=None):
    """Load the optional float32 baseline; a mixed-precision 'baseline' is a config error.

    A text baseline is scored on the model's token ids, so it must have been trained with the
    same tokenizer (the same training split and settings give the same vocabulary).
    """
    if config.baseline_model_dir is None:
        return None
    from ampflow.artifacts.model_dir import load_trained

    baseline = load_trained(config.baseline_model_dir)
    model, metadata = baseline.model, baseline.metadata
    _require_same_dataset("baseline_model_dir", metadata, info)
    if tokenizer is not None and (baseline.tokenizer.vocabulary != tokenizer.vocabulary
                                  or baseline.tokenizer.config != tokenizer.config):
        raise ConfigError("baseline_model_dir must hold a model tokenized as model_dir's is "
                          "(train both on the same data with the same --max-sequence-length "
                          "and --vocabulary-size). Received: another vocabulary or settings")
    policy = _policy(metadata, model)
    if policy != "float32":
        raise ConfigError(
            "baseline_model_dir must hold a model trained under the float32 policy. "
            f"Received: a model trained under {policy!r}"
        )
    return model, metadata


def _baselines(config: EvaluateConfig, baseline, served) -> dict[str, Any]:
    """Which baselines the verdict judged against: verdict.json's `baselines`."""
    from ampflow.components.evaluate_parity.serving_gate import served_baseline

    return {"chance": "the majority-class rate of the split",
            "float32_twin": os.fspath(config.model_dir),
            "float32_trained": (os.fspath(config.baseline_model_dir)
                                if baseline is not None else None),
            "serving": served_baseline(served, config.serving_base_path)}


def _require_writable_parent(output_dir: Path) -> None:
    from ampflow.files import ensure_writable_dir

    ensure_writable_dir(Path(output_dir).resolve().parent, "output_dir's parent")


def _policy(metadata: dict[str, Any], model) -> str:
    """The training policy from the metadata, else from the model's compute layers."""
    from ampflow.modeling.twin import compute_policy

    return (metadata.get("precision") or {}).get("policy") or compute_policy(model)


def _compute_dtype(policy: str) -> str:
    import keras

    return keras.DTypePolicy(policy).compute_dtype


# --- measuring ------------------------------------------------------------------------------

def _score_all(config, model, metadata, baseline, images, labels) -> dict[str, ModelScores]:
    """Logits of the AMP model, its float32 twin and (if given) the baseline."""
    from ampflow.modeling.twin import build_float32_twin

    twin = build_float32_twin(model, metadata)
    models = {"amp": model, "fp32_twin": twin}
    if baseline is not None:
        models["baseline"] = baseline[0]
    return {key: _score(m, images, labels, config.batch_size,
                        f"evaluate {key} (model {i}/{len(models)})")
            for i, (key, m) in enumerate(models.items(), 1)}


def _score(model, images: np.ndarray, labels: np.ndarray, batch_size: int,
           desc: str = "evaluate") -> ModelScores:
    """Logits in batches of one fixed shape: one trace per model, not one per batch size."""
    from ampflow.modeling.twin import logits_model

    batch_size = min(batch_size, len(images))
    padding = -len(images) % batch_size
    padded = np.concatenate([images, np.repeat(images[-1:], padding, axis=0)])
    with Progress(len(padded) // batch_size, desc, unit="batch", items_per_unit=batch_size,
                  item="img") as progress:
        logits = logits_model(model).predict(padded, batch_size=batch_size, verbose=0,
                                             callbacks=[keras_callback(progress)])
    return ModelScores(logits=np.asarray(logits[: len(images)], dtype=np.float32), labels=labels)


def _measure(
    config, metadata, policy, baseline, info, scores, served=None
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
    item = throughput_unit(info.get("modality")).plural  # the data's word: images, texts
    chance = release.chance_test(amp, release.class_names(info), config.chance_alpha,
                                 config.min_power, config.split, item)
    metrics.update(chance.metrics())
    checks = [chance.check(), *_inference_checks(config, metrics, bound)]
    notes = [chance.too_small_note()] if chance.too_small else []
    if baseline is not None:
        metrics.update(training.training_metrics(amp, scores["baseline"], metadata, baseline[1]))
        metrics["baseline_detectable_drop_points"] = detectable_drop_points(
            metrics["num_examples"], int(metrics["baseline_amp_only_correct"]),
            int(metrics["baseline_only_correct"]), config.baseline_alpha, config.min_power)
        checks += training.training_checks(metrics, config.max_baseline_accuracy_drop,
                                           config.baseline_alpha, config.min_training_speedup,
                                           config.min_power, item)
        notes += training.power_notes(metrics, config.max_baseline_accuracy_drop,
                                      config.baseline_alpha, item, config.min_power)
    if served is not None:
        comparison = compare_with_served(amp, scores["serving"], served, ServingRule.of(config),
                                         config.split, item)
        metrics.update(comparison.metrics())
        checks += comparison.checks()
        notes += comparison.notes()
    checks += release.threshold_checks(metrics, config.min_accuracy, config.metric_thresholds)
    verdict = Verdict(tuple(checks), notes=tuple(notes))
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
    names = release.class_names(info)
    out = {}
    for key, model_scores in scores.items():
        values = model_scores.per_class_accuracy(len(names))
        out[key] = {name: (float(v) if math.isfinite(v) else None)
                    for name, v in zip(names, values, strict=True)}
    return out


def _amp_check(model_dir, metadata: dict) -> dict[str, Any] | None:
    """The train step's AMP check (amp_report.json beside the model), for the report."""
    from ampflow.artifacts.model_dir import AMP_REPORT_FILE
    from ampflow.files import read_json

    path = Path(model_dir) / AMP_REPORT_FILE
    if not path.is_file():  # a model from before the check
        return None
    report = read_json(path)
    return {"summary": (metadata.get("model") or {}).get("amp_check"),
            "fixes": report.get("fixes", []), "warnings": report.get("warnings", []),
            "findings": [f for f in report.get("findings", []) if f.get("severity") != "info"],
            "dtype_counts": report.get("dtype_counts", {})}


def _context(config, metadata, baseline, policy, compute_dtype, bound) -> dict[str, Any]:
    ctx = {
        "architecture": metadata.get("architecture"),
        "modality": metadata.get("modality"),  # the rates' unit (artifacts.throughput)
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
    ctx["amp_check"] = _amp_check(config.model_dir, metadata)
    if baseline is not None:
        ctx["baseline_notes"] = training.comparability_notes(metadata, baseline[1])
        for note in ctx["baseline_notes"]:
            log.warning("baseline not strictly comparable: %s", note)
    return ctx


