"""Step 3: the release gate: above chance, thresholds, the model serving, and FP32 parity."""

from ampflow.components.evaluate_parity.step import (
    EvaluateConfig,
    EvaluateResult,
    run_evaluate,
    scalar_metrics,
)

__all__ = [
    "EvaluateConfig",
    "EvaluateResult",
    "run_evaluate",
    "scalar_metrics",
]
