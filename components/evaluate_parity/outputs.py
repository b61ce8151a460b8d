"""What the evaluate step writes, all at once: a staging dir renamed to `output_dir`.

metrics.json, verdict.json (the gate's artifact, read by export and the pipeline's gate
task), confusion_matrix.json, the plots and report.md (report.py), config.json,
predictions.json (the model's answer to each example, which the serving gate pairs with the
served model's); the list and
the fields are docs/ARTIFACTS.md's. Non-finite numbers are written as null.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.verdict import VERDICT_FILE
from ampflow.components.evaluate_parity import report
from ampflow.components.evaluate_parity.config import EvaluateConfig
from ampflow.components.evaluate_parity.gate import Verdict
from ampflow.components.evaluate_parity.parity import LogitParity, ModelScores
from ampflow.files import read_json, staging_dir, write_json_atomic

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
CONFUSION_MATRIX_FILE = "confusion_matrix.json"
REPORT_FILE = "report.md"
CONFIG_FILE = "config.json"
LOSS_SCALE_HISTORY_FILE = "loss_scale_history.json"
PREDICTIONS_FILE = "predictions.json"  # serving_gate.py reads it


def verdict_payload(config: EvaluateConfig, verdict: Verdict, policy: str,
                    model_hashes: dict[str, str],
                    baselines: dict[str, Any] | None = None,
                    forced: bool = False) -> dict[str, Any]:
    """verdict.json: the gate's outcome, every check, the judged model, its baselines.

    `forced`: `force` let through a model the comparison with the one serving could not
    decide (its note says so in words).
    """
    return {
        "passed": verdict.passed,
        "forced": forced,
        "failed_checks": [check.as_dict() for check in verdict.failed],
        "checks": [check.as_dict() for check in verdict.checks],
        "message": verdict.message(),
        "notes": list(verdict.notes),
        "baselines": baselines or {},
        "model_dir": os.fspath(config.model_dir),
        "policy": policy,
        "metrics_file": METRICS_FILE,
        **model_hashes,
    }


def write_outputs(config: EvaluateConfig, metrics: dict[str, Any], verdict: dict[str, Any],
                  names: list[str], scores: dict[str, ModelScores], parity: LogitParity) -> None:
    """Write every file into a staging dir, then rename it to output_dir in one step."""
    matrix = scores["amp"].confusion_matrix(len(names))
    twin_matrix = scores["fp32_twin"].confusion_matrix(len(names))
    with staging_dir(config.output_dir, replaces=VERDICT_FILE) as tmp:
        write_json_atomic(tmp / METRICS_FILE, _json_safe(metrics))
        write_json_atomic(tmp / CONFUSION_MATRIX_FILE, {
            "categories": names, "matrix": matrix.tolist(),
            "fp32_twin_matrix": twin_matrix.tolist(),
            "rows": "true class", "columns": "predicted class",
        })
        report.plot_confusion_matrix(tmp / report.CONFUSION_PNG, names, matrix, twin_matrix)
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
        write_json_atomic(tmp / PREDICTIONS_FILE, {  # what the serving gate pairs with
            "split": config.split, "limit": config.limit,
            "labels": scores["amp"].labels.tolist(),
            "predictions": scores["amp"].predictions.tolist()})
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
