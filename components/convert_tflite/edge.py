"""The edge check: every variant rerun in the standalone LiteRT interpreter an app ships.

What must hold between the two runtimes depends on the variant's arithmetic:
- float activations (float32, float16, dynamic_range): the same outputs, to `edge_tolerance`
  (float kernels differ only in rounding of their sums) and the same classes;
- int8 activations (full_int8): LiteRT's own answers must pass the variant's gate (agreement
  with the SavedModel, accuracy drop). Identical outputs are not what int8 kernels promise:
  each requantization may round differently by one step (XNNPACK rounds once, TFLite's builtin
  kernels twice, LiteRT#7441), and a step grows through the model's nonlinearities. Measured on
  bert_tiny (docs/how-to/text-models.md): the builtin kernels of tf.lite and LiteRT gave
  identical probabilities, while each runtime's XNNPACK (its default) differed from them and
  from the other's by up to 0.03. The largest difference is still reported.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.components.convert_tflite.variants import SPECS
from ampflow.errors import ConfigError
from ampflow.serving.model_format import CLASS_IDS_OUTPUT, PROBABILITIES_OUTPUT

log = logging.getLogger(__name__)


def edge_plan(config) -> dict[str, Any]:
    """Whether the edge check runs (and the runtime's version), decided before any compute."""
    from ampflow.components.convert_tflite.checks import litert_available

    if config.edge_check is False:
        return {"enabled": False, "reason": "disabled (edge_check=False)", "runtime": None}
    problem = litert_available()
    if problem and config.edge_check:
        raise ConfigError(f"edge_check=True needs the ai-edge-litert package. Received: {problem}")
    if problem:
        log.warning("edge check skipped: %s", problem)
        return {"enabled": False, "reason": problem, "runtime": None}
    return {"enabled": True, "reason": None, "runtime": f"ai-edge-litert {_litert_version()}"}


def quantized_activations(variant: str) -> bool:
    """Whether `variant` computes in int8 (the edge check then gates LiteRT's own quality)."""
    return SPECS[variant].activations == "int8"


def edge_check(config, path: Path, examples, out, edge: dict, *, variant: str,
               ref_probs: np.ndarray, labels: np.ndarray, position: str | None = None,
               signature_key: str | None = None) -> dict[str, Any]:
    """Rerun `path` in LiteRT; compare with the tf.lite outputs `out` and with the reference.

    `ref_probs` are the SavedModel's probabilities on the test `labels`' examples.
    """
    from ampflow.components.convert_tflite import checks

    if not edge["enabled"]:
        return {"status": "skipped", "reason": edge["reason"]}
    runner = checks.TFLiteRunner(path, runtime="litert",
                                 signature_key=signature_key or config.signature_key,
                                 num_threads=config.num_threads)
    edge_out = runner.predict(examples, config.batch_size,
                              desc=f"edge check {position or path.stem} (LiteRT)")
    ids = np.asarray(edge_out[CLASS_IDS_OUTPUT])
    ref_accuracy = float(np.mean(np.argmax(ref_probs, axis=-1) == labels))
    accuracy = float(np.mean(ids == labels))
    return {
        "status": "ran",
        "runtime": edge["runtime"],
        "rule": "gate" if quantized_activations(variant) else "same outputs",
        "max_abs_diff": float(np.max(np.abs(edge_out[PROBABILITIES_OUTPUT]
                                            - out[PROBABILITIES_OUTPUT]))),
        "class_agreement": float(np.mean(ids == out[CLASS_IDS_OUTPUT])),
        "agreement": float(np.mean(ids == np.argmax(ref_probs, axis=-1))),
        "accuracy": accuracy,
        "accuracy_drop_points": (ref_accuracy - accuracy) * 100.0,
    }


def edge_gates(config, variant: str, edge: dict) -> list[tuple[str, str, float, float]]:
    """(name, op, threshold, value) of the edge check's gates for `variant` (none if skipped)."""
    if edge["status"] != "ran":
        return []
    if quantized_activations(variant):
        return [(f"edge_{name}", op, threshold, edge[name])
                for name, op, threshold in config.gates_for(variant)
                if name in ("agreement", "accuracy_drop_points")]
    return [("edge_max_abs_diff", "<=", config.edge_tolerance, edge["max_abs_diff"]),
            ("edge_class_agreement", ">=", 1.0, edge["class_agreement"])]


def _litert_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ai-edge-litert")
    except PackageNotFoundError:
        return "unknown"
