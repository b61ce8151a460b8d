"""Step 3: the release gate: above chance, thresholds, the model serving, and FP32 parity."""

from ampflow.components.evaluate_parity.step import (
    EvaluateConfig,
    EvaluateResult,
    run_evaluate,
    scalar_metrics,
)
from ampflow.components.evaluate_parity.twin import build_float32_twin, logits_model
from ampflow.components.evaluate_parity.verdict import (
    load_verdict,
    model_sha256,
    require_passed,
    require_same_model,
)

__all__ = [
    "EvaluateConfig",
    "EvaluateResult",
    "build_float32_twin",
    "load_verdict",
    "logits_model",
    "model_sha256",
    "require_passed",
    "require_same_model",
    "run_evaluate",
    "scalar_metrics",
]
