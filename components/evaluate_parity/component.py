"""KFP components: evaluate (FP32 parity, always publishes) and the gate that stops the run.

KFP's launcher uploads a task's output artifacts only when the task exits 0. So `evaluate_parity`
never fails on a failed gate: it publishes its metrics, confusion matrix, report and verdict
either way (the UI shows why), and `parity_gate`, a small task after it, fails the run before
export with the failed checks in its message.
"""

from typing import NamedTuple

from kfp.dsl import (
    Artifact,
    ClassificationMetrics,
    Dataset,
    Input,
    Markdown,
    Metrics,
    Model,
    Output,
)

from ampflow.components.evaluate_parity.config import EvaluateConfig
from ampflow.components.evaluate_parity.serving_gate import ServingGateConfig
from ampflow.kfp_args import document_args

_DATA = "The prepared dataset (prepare-data's output): its test split is scored."
_VERDICT = "evaluate-parity's verdict: the evaluation dir (verdict.json, metrics.json, report)."


def evaluate_parity(
    data: Input[Dataset],
    model: Input[Model],
    metrics: Output[Metrics],
    confusion: Output[ClassificationMetrics],
    report: Output[Markdown],
    verdict: Output[Artifact],
    baseline_model: Input[Model] = None,
    max_accuracy_drop: float = 0.5,
    min_agreement: float = 0.99,
    max_relative_logit_diff: float = -1.0,
    max_baseline_accuracy_drop: float = 3.0,
    baseline_alpha: float = 0.01,
    chance_alpha: float = 0.01,
    min_accuracy: float = 0.0,
    metric_thresholds: str = "",
) -> NamedTuple("Outputs", [("gate_passed", bool), ("gate_message", str)]):
    """Score the AMP model against chance, its float32 twin and the float32-trained model.

    Always succeeds and publishes: `verdict` (the evaluation dir: verdict.json, metrics.json,
    report.md, plots; export reads it), KFP `metrics`, the `confusion` matrix and a
    self-contained Markdown `report`; `gate_passed`/`gate_message` show the outcome in the UI.
    The model serving is compared by `serving_gate`, in the serving branch. The defaults are
    `EvaluateConfig`'s (written out here: KFP copies this function's source into the task), and
    so is the Args KFP shows (its fields' help).
    """
    import json
    from collections import namedtuple
    from pathlib import Path

    from ampflow.components.evaluate_parity.config import EvaluateConfig
    from ampflow.components.evaluate_parity.report import inline_images
    from ampflow.components.evaluate_parity.step import run_evaluate, scalar_metrics

    result = run_evaluate(EvaluateConfig(
        model_dir=model.path, data_dir=data.path, output_dir=verdict.path,
        baseline_model_dir=baseline_model.path if baseline_model else None,
        max_accuracy_drop=max_accuracy_drop, min_agreement=min_agreement,
        max_relative_logit_diff=(max_relative_logit_diff if max_relative_logit_diff >= 0
                                 else None),
        max_baseline_accuracy_drop=max_baseline_accuracy_drop, baseline_alpha=baseline_alpha,
        chance_alpha=chance_alpha, min_accuracy=min_accuracy,
        metric_thresholds=metric_thresholds,
        fail_on_gate=False))  # the gate task decides; this task always publishes
    for name, value in scalar_metrics(result.metrics).items():
        metrics.log_metric(name, value)
    matrix = json.loads((Path(verdict.path) / "confusion_matrix.json").read_text())
    confusion.log_confusion_matrix(matrix["categories"], matrix["matrix"])
    report_md = (Path(verdict.path) / "report.md").read_text()
    Path(report.path).write_text(inline_images(report_md, Path(verdict.path)))
    verdict.metadata.update({
        "passed": result.passed, "message": result.verdict["message"],
        "failed_checks": [c["name"] for c in result.verdict["failed_checks"]],
        "model_sha256": result.verdict["model_sha256"],
        "notes": result.verdict["notes"], "baselines": result.verdict["baselines"]})
    outputs = namedtuple("Outputs", ["gate_passed", "gate_message"])
    return outputs(result.passed, result.verdict["message"])


def parity_gate(verdict: Input[Artifact]):
    """Fail the run before export when the parity verdict failed, naming each failed check."""
    from ampflow.artifacts.verdict import require_passed

    require_passed(verdict.path)



def compare_serving(
    data: Input[Dataset],
    verdict: Input[Artifact],
    comparison: Output[Artifact],
    metrics: Output[Metrics],
    serving_model_store: str,
    model_name: str = "ampflow",
    serving_alpha: float = 0.01,
    serving_rule: str = "no-regression",
    non_inferiority_margin: float = 0.0,
    max_detectable_drop: float = 5.0,
    force: bool = False,
) -> NamedTuple("Outputs", [("gate_passed", bool), ("gate_message", str)]):
    """Compare the evaluated model with the one serving, on the same examples; always publish.

    Reads the highest version under `<serving_model_store>/<model_name>` (a path this task can
    read: the model-store claim, mounted as for deploy), scores it on the examples evaluate
    judged and pairs the answers: `comparison` holds serving_verdict.json (none serving yet:
    the first release, passed), `metrics` its numbers; `serving_gate` decides.
    """
    from collections import namedtuple

    from ampflow.components.evaluate_parity.serving_gate import (
        ServingGateConfig,
        run_serving_gate,
    )

    result = run_serving_gate(ServingGateConfig(
        eval_dir=verdict.path, data_dir=data.path, output_dir=comparison.path,
        serving_base_path=f"{serving_model_store.rstrip('/')}/{model_name}",
        serving_alpha=serving_alpha, serving_rule=serving_rule,
        non_inferiority_margin=non_inferiority_margin, max_detectable_drop=max_detectable_drop,
        force=force, fail_on_gate=False))
    for name, value in result.scalar_metrics().items():
        metrics.log_metric(name, value)
    comparison.metadata.update({"passed": result.passed, "message": result.message,
                                "outcome": result.verdict["outcome"],
                                "forced": result.verdict["forced"],
                                "baseline": result.verdict["baselines"]["serving"]})
    outputs = namedtuple("Outputs", ["gate_passed", "gate_message"])
    return outputs(result.passed, result.message)


def serving_gate(comparison: Input[Artifact]):
    """Fail the run before deploy when the comparison with the model serving refused it."""
    from ampflow.components.evaluate_parity.serving_gate import require_not_worse

    require_not_worse(comparison.path)


document_args(evaluate_parity, EvaluateConfig, notes={
    "max_relative_logit_diff": "Below 0: auto (KFP has no optional floats)",
}, own={
    "data": _DATA,
    "model": "The AMP-trained model (train-amp's output).",
    "baseline_model": "The float32-trained model (train-float32's output), when the pipeline "
                      "was compiled with the baseline.",
})
document_args(parity_gate, own={"verdict": _VERDICT})
document_args(compare_serving, ServingGateConfig, own={
    "data": _DATA, "verdict": _VERDICT,
    "serving_model_store": "The model store deploy writes into (a path this task reads: the "
                           "model-store claim, mounted as for deploy, or gs://).",
    "model_name": "The served model name: the model serving is the highest version under "
                  "<serving_model_store>/<model_name>.",
})
document_args(serving_gate, own={"comparison": "compare-serving's comparison "
                                               "(serving_verdict.json)."})
