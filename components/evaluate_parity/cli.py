"""`ampflow evaluate`: a thin shell over `run_evaluate` (a failed gate exits non-zero)."""

from __future__ import annotations

from ampflow.cliutil import add_step_command


def _detects(metrics: dict, prefix: str) -> str:
    """What the paired test could detect on this split (power.py), in the data's words."""
    from ampflow.artifacts.throughput import throughput_unit

    drop = metrics[f"{prefix}_detectable_drop_points"]
    examples = (f"{metrics['num_examples']} "
                f"{throughput_unit(metrics['context'].get('modality')).plural}")
    if drop == float("inf"):
        return f"no drop detectable on {examples}"
    return f"detects a drop >= {drop:.1f} points on {examples}"


def _summary(result) -> dict:
    from ampflow.components.evaluate_parity.training import speedup_text

    metrics = result.metrics
    summary = {
        "gate": "passed" if result.passed else f"FAILED: {result.verdict['message']}",
        "policy": metrics["context"]["policy"],
        "amp_accuracy": metrics["amp_accuracy"],
        "chance_accuracy": (f"{metrics['chance_accuracy']:.4g} (one-sided binomial p = "
                            f"{metrics['chance_binomial_p_value']:.3g})"),
        "fp32_twin_accuracy": metrics["fp32_twin_accuracy"],
        "argmax_agreement": metrics["argmax_agreement"],
        "max_relative_logit_diff": metrics["max_relative_logit_diff"],
    }
    if "baseline_accuracy" in metrics:
        summary["float32_trained_accuracy"] = metrics["baseline_accuracy"]
        summary["amp_vs_float32_trained"] = (
            f"{metrics['baseline_accuracy_delta_points']:+.2f} points (paired SE "
            f"{metrics['baseline_delta_stderr_points']:.2f}, one-sided McNemar p = "
            f"{metrics['baseline_mcnemar_p_value']:.3g}; {_detects(metrics, 'baseline')})")
        summary["training_speedup"] = speedup_text(metrics)
    if "serving_accuracy" in metrics:
        summary["serving_accuracy"] = (
            f"{metrics['serving_accuracy']:.4g} (version {int(metrics['serving_version'])}; "
            f"{metrics['serving_accuracy_delta_points']:+.2f} points, one-sided McNemar p = "
            f"{metrics['serving_mcnemar_p_value']:.3g}; {_detects(metrics, 'serving')}; "
            f"{metrics['serving_rule']}: {metrics['serving_outcome']})")
    summary.update({f"note {i}": note for i, note in enumerate(result.verdict["notes"], 1)})
    summary["output_dir"] = str(result.output_dir)
    return summary


def register(subparsers) -> None:
    """Add the `evaluate` subcommand."""
    from ampflow.components.evaluate_parity.step import EvaluateConfig, run_evaluate

    add_step_command(
        subparsers,
        "evaluate",
        config_cls=EvaluateConfig,
        run=run_evaluate,
        summarize=_summary,
        help="Release gate: above chance, the AMP model vs its float32 twin, a float32-trained "
             "baseline and the model serving.",
        description="Score a mixed-precision model and its float32 twin (same weights, float32 "
                    "policy) on a dataset split, test its accuracy against chance and, with "
                    "--serving-base-path, against the model serving there; write metrics.json, "
                    "confusion_matrix.json, verdict.json and report.md with plots; exit "
                    "non-zero if the gate fails.",
    )
