"""KFP component: evaluate (FP32 parity gate). A thin wrapper over `run_evaluate`."""

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
):
    """Prove the AMP model matches its float32 twin; fail the task (and the run) if not.

    `max_relative_logit_diff` < 0 means the per-dtype default. The `verdict` artifact is the
    evaluation dir (verdict.json, metrics.json, report.md, plots) that export reads.
    """
    import json
    from pathlib import Path

    from ampflow.components.evaluate_parity.report import inline_images
    from ampflow.components.evaluate_parity.step import (
        EvaluateConfig,
        run_evaluate,
        scalar_metrics,
    )

    result = run_evaluate(EvaluateConfig(
        model_dir=model.path, data_dir=data.path, output_dir=verdict.path,
        baseline_model_dir=baseline_model.path if baseline_model else None,
        max_accuracy_drop=max_accuracy_drop, min_agreement=min_agreement,
        max_relative_logit_diff=(max_relative_logit_diff if max_relative_logit_diff >= 0
                                 else None),
        fail_on_gate=False))  # publish the KFP metrics first, then fail below
    for name, value in scalar_metrics(result.metrics).items():
        metrics.log_metric(name, value)
    matrix = json.loads((Path(verdict.path) / "confusion_matrix.json").read_text())
    confusion.log_confusion_matrix(matrix["categories"], matrix["matrix"])
    report_md = (Path(verdict.path) / "report.md").read_text()
    Path(report.path).write_text(inline_images(report_md, Path(verdict.path)))
    verdict.metadata.update({"passed": result.passed,
                             "failed_checks": result.verdict["failed_checks"]})
    if not result.passed:
        from ampflow.errors import GateFailedError

        raise GateFailedError(result.verdict["message"])
