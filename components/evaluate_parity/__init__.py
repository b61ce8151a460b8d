"""Step 3: the FP32 parity gate (AMP model vs its float32 twin, optional float32 baseline)."""

from ampflow.components.evaluate_parity.step import (
    EvaluateConfig,
    EvaluateResult,
    load_verdict,
    run_evaluate,
    scalar_metrics,
)
from ampflow.components.evaluate_parity.twin import build_float32_twin, logits_model

__all__ = [
    "EvaluateConfig",
    "EvaluateResult",
    "build_float32_twin",
    "load_verdict",
    "logits_model",
    "run_evaluate",
    "scalar_metrics",
]
