"""The gate against the model now serving, as a step of its own: the pipeline's serving branch.

`run_evaluate` with a `serving_base_path` compares inline (one verdict, for `ampflow
evaluate`). In the pipeline the evaluate task runs in every run and mounts no model store (a
run without a serving target needs no claim), so the comparison runs where the store is
mounted, in the serving branch before deploy: this step reads what evaluate recorded (the
split, the labels and the model's answer to each example: predictions.json), scores the
served version on the same examples through `serving_default` (images as pixels, texts as the
raw texts: ampflow.data.split_request), and writes serving_verdict.json: the paired test of
release.py, its numbers and the version compared.
No version serving yet is the first release: passed, and said so.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.components.evaluate_parity import release
from ampflow.components.evaluate_parity.comparison import ServingComparison, ServingRule
from ampflow.components.evaluate_parity.config import EvaluateConfig, check_serving_rule
from ampflow.components.evaluate_parity.gate import Verdict
from ampflow.components.evaluate_parity.outputs import PREDICTIONS_FILE, _json_safe
from ampflow.components.evaluate_parity.parity import ModelScores
from ampflow.data.split_request import split_request
from ampflow.errors import ConfigError, GateFailedError, ModelLoadError

log = logging.getLogger(__name__)

SERVING_VERDICT_FILE = "serving_verdict.json"
GATE_NAME = "no regression against the model serving"


def _evaluate_field(name: str):
    """A field with the evaluate step's default and help (one home: EvaluateConfig)."""
    source = EvaluateConfig.__dataclass_fields__[name]
    return field(default=source.default, metadata=source.metadata)


@dataclass(frozen=True)
class ServingGateConfig:
    """What the comparison with the model serving reads and its significance level."""

    eval_dir: Path = field(metadata={"help": "The evaluate step's output dir."})
    data_dir: Path = field(metadata={"help": "The prepared dataset dir evaluate scored."})
    output_dir: Path = field(metadata={"help": "Directory that receives serving_verdict.json."})
    serving_base_path: str | None = field(default=None, metadata={
        "help": "<model_store>/<model_name>: the highest version there is compared."})
    serving_alpha: float = _evaluate_field("serving_alpha")
    serving_rule: str = _evaluate_field("serving_rule")
    non_inferiority_margin: float = _evaluate_field("non_inferiority_margin")
    max_detectable_drop: float = _evaluate_field("max_detectable_drop")
    min_power: float = _evaluate_field("min_power")
    force: bool = _evaluate_field("force")
    batch_size: int = field(default=256, metadata={"help": "Examples per inference batch."})
    fail_on_gate: bool = field(default=True, metadata={
        "help": "Raise when the model is significantly worse; the verdict is written either way."})

    def __post_init__(self) -> None:
        if not 0.0 < self.serving_alpha < 1.0:
            raise ConfigError("serving_alpha must be in (0, 1). Received: "
                              f"serving_alpha={self.serving_alpha}")
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0. Received: batch_size={self.batch_size}")
        if not 0.0 < self.min_power < 1.0:
            raise ConfigError(f"min_power must be in (0, 1). Received: min_power={self.min_power}")
        check_serving_rule(self)


@dataclass(frozen=True)
class ServingGateResult:
    """serving_verdict.json's content and where it was written."""

    output_dir: Path
    verdict: dict[str, Any]

    @property
    def passed(self) -> bool:
        """Whether the model is not significantly worse than the one serving (or none serves)."""
        return bool(self.verdict["passed"])

    @property
    def message(self) -> str:
        """The outcome in one line, with the paired numbers."""
        return str(self.verdict["message"])

    def scalar_metrics(self) -> dict[str, float]:
        """The finite numbers of the comparison, for KFP `Metrics.log_metric`."""
        return {k: float(v) for k, v in self.verdict["metrics"].items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}

    def raise_if_failed(self) -> None:
        """GateFailedError (the refusal, in one line) when the comparison failed."""
        if not self.passed:
            raise GateFailedError(refusal(self.verdict))


def run_serving_gate(config: ServingGateConfig) -> ServingGateResult:
    """Compare evaluate's recorded answers with the served version's; write; then gate."""
    from ampflow.artifacts.verdict import load_verdict

    evaluated = load_verdict(config.eval_dir)
    recorded = read_predictions(config.eval_dir)
    served = release.find_served_version(config.serving_base_path)
    if served is None:
        verdict = _first_release(config)
    else:
        comparison = _compare(config, recorded, served)
        outcome = Verdict(tuple(comparison.checks()), notes=comparison.notes())
        verdict = {"gate": GATE_NAME, "passed": outcome.passed,
                   "failed_checks": [c.as_dict() for c in outcome.failed],
                   "checks": [c.as_dict() for c in outcome.checks],
                   "message": comparison.sentence(), "outcome": comparison.outcome,
                   "forced": comparison.forced, "notes": list(outcome.notes),
                   "metrics": comparison.metrics(),
                   "baselines": {"serving": served_baseline(served)}}
    verdict["model_sha256"] = evaluated.get("model_sha256")
    _write(config.output_dir, verdict)
    log.info("%s", verdict["message"])
    result = ServingGateResult(Path(config.output_dir), verdict)
    if config.fail_on_gate:
        result.raise_if_failed()
    return result


def served_baseline(served: release.ServedVersion | None,
                    base_path: str | None = None) -> dict[str, Any] | None:
    """The `serving` entry of a verdict's `baselines`: what was compared, or why nothing."""
    if served is not None:
        return {"base_path": served.base_path, "version": served.version,
                "path": served.source}
    if not base_path:
        return None
    return {"base_path": base_path, "version": None,
            "why_none": "no version serving there: the first release"}


REFUSALS = {  # the comparison's outcome -> why the model is not deployed
    "worse": "the model is significantly worse than the one serving",
    "cannot tell": "the model is worse than the one serving on the point estimate and the "
                   "test cannot tell whether the drop is real",
    "not shown non-inferior": "the data do not show the model is within the non-inferiority "
                              "margin of the one serving",
}


def refusal(verdict: dict[str, Any]) -> str:
    """The one-line refusal of a failed comparison (a verdict without an outcome: `worse`)."""
    why = REFUSALS.get(str(verdict.get("outcome")), REFUSALS["worse"])
    return f"{why}, so it is not deployed: {verdict['message']}"


def require_not_worse(comparison_dir: str | os.PathLike) -> dict[str, Any]:
    """The comparison's verdict if it passed; GateFailedError with the paired numbers if not."""
    from ampflow.files import read_artifact_json

    verdict = read_artifact_json(comparison_dir, SERVING_VERDICT_FILE,
                                 artifact="a comparison with the model serving",
                                 hint="run the comparison first", error=ModelLoadError)
    if not isinstance(verdict, dict) or not isinstance(verdict.get("passed"), bool):
        raise ModelLoadError(f"{Path(comparison_dir) / SERVING_VERDICT_FILE} must hold an "
                             f"object with a bool 'passed'. Received: {str(verdict)[:200]}")
    if not verdict["passed"]:
        raise GateFailedError(refusal(verdict))
    return verdict


def read_predictions(eval_dir: str | os.PathLike) -> dict[str, Any]:
    """What evaluate recorded: split, limit, labels and the model's answers, as arrays."""
    from ampflow.files import read_artifact_json

    raw = read_artifact_json(eval_dir, PREDICTIONS_FILE, artifact="an evaluation output",
                             hint="evaluate with this version of ampflow", error=ModelLoadError)
    try:
        labels = np.asarray(raw["labels"], dtype=np.int64)
        predictions = np.asarray(raw["predictions"], dtype=np.int64)
        if labels.shape != predictions.shape or labels.ndim != 1:
            raise ValueError("labels and predictions must be two lists of one length")
        return {"split": str(raw["split"]), "limit": raw.get("limit"), "labels": labels,
                "predictions": predictions}
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{Path(eval_dir) / PREDICTIONS_FILE} is not evaluate's record of "
                             f"its predictions: {e}") from e


def _compare(config: ServingGateConfig, recorded: dict[str, Any],
             served: release.ServedVersion) -> ServingComparison:
    """Score the served version on the examples evaluate judged; pair the answers."""
    from ampflow.artifacts.throughput import throughput_unit
    from ampflow.components.evaluate_parity.comparison import compare_with_served
    from ampflow.data import load_dataset_info

    info = load_dataset_info(config.data_dir)
    request = split_request(config.data_dir, recorded["split"], recorded["limit"])
    if not np.array_equal(request.labels, recorded["labels"]):
        raise ConfigError(f"data_dir must be the dataset evaluate scored: its {recorded['split']}"
                          f" split has other labels than {PREDICTIONS_FILE} in eval_dir. "
                          f"Received: data_dir={config.data_dir}")
    names = release.class_names(info)
    served_scores = release.score_served(served, request, names, config.batch_size)
    # the recorded answers as one-hot scores: the paired test reads only their argmax
    new = ModelScores(logits=np.eye(len(names), dtype=np.float32)[recorded["predictions"]],
                      labels=request.labels)
    return compare_with_served(new, served_scores, served, ServingRule.of(config),
                               recorded["split"], throughput_unit(info.get("modality")).plural)


def _first_release(config: ServingGateConfig) -> dict[str, Any]:
    baseline = served_baseline(None, config.serving_base_path)
    why = baseline["why_none"] if baseline else "no serving base path"
    return {"gate": GATE_NAME, "passed": True, "failed_checks": [], "checks": [],
            "message": f"no model serving to compare with ({why})", "outcome": "first release",
            "forced": False, "notes": [], "metrics": {},
            "baselines": {"serving": baseline}}


def _write(output_dir: Path, verdict: dict[str, Any]) -> None:
    from ampflow.files import staging_dir, write_json_atomic

    with staging_dir(Path(output_dir), replaces=SERVING_VERDICT_FILE) as tmp:
        write_json_atomic(tmp / SERVING_VERDICT_FILE, _json_safe(verdict))
