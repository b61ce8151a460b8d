"""Parity measures between two models' logits on the same labelled examples (pure numpy).

Kept free of TensorFlow so the arithmetic of the gate can be read and tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ModelScores:
    """One model's logits on the evaluation set, and what follows from them."""

    logits: np.ndarray  # float32 [N, num_classes]
    labels: np.ndarray  # int64 [N]

    @property
    def predictions(self) -> np.ndarray:
        """Top-1 class ids (argmax of logits = argmax of probabilities)."""
        return np.argmax(self.logits, axis=1)

    @property
    def accuracy(self) -> float:
        """Top-1 accuracy in [0, 1]."""
        return float(np.mean(self.predictions == self.labels))

    @property
    def nonfinite_count(self) -> int:
        """Logit values that are inf or NaN (a float16 overflow shows up here first)."""
        return int(np.size(self.logits) - np.count_nonzero(np.isfinite(self.logits)))

    def confusion_matrix(self, num_classes: int) -> np.ndarray:
        """Counts [true class, predicted class]: KFP ClassificationMetrics' orientation."""
        matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
        np.add.at(matrix, (self.labels, self.predictions), 1)
        return matrix

    def per_class_accuracy(self, num_classes: int) -> np.ndarray:
        """Recall of each class; NaN for a class absent from the evaluation set."""
        matrix = self.confusion_matrix(num_classes)
        support = matrix.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(support > 0, np.diag(matrix) / np.maximum(support, 1), np.nan)


@dataclass(frozen=True)
class LogitParity:
    """How far `candidate`'s logits are from `reference`'s on the same examples."""

    agreement: float  # fraction of examples with the same top-1 class
    max_abs_diff: float
    mean_abs_diff: float
    max_relative_diff: float  # max |diff| / max |reference logit|: scale-free
    abs_diff: np.ndarray  # flat |diff| of every finite pair, for the histogram


def logit_parity(reference: ModelScores, candidate: ModelScores) -> LogitParity:
    """Compare two models' logits; non-finite candidate logits make the diffs infinite.

    The relative bound divides by the largest reference logit magnitude, so one threshold holds
    for a model whose logits span ±3 and for one whose logits span ±30.
    """
    if reference.logits.shape != candidate.logits.shape:
        raise ValueError(
            f"logits must have the same shape. Received: {reference.logits.shape} vs "
            f"{candidate.logits.shape}"
        )
    diff = np.abs(reference.logits.astype(np.float64) - candidate.logits.astype(np.float64))
    finite = np.isfinite(diff)
    max_abs = float(np.max(diff)) if finite.all() else float("inf")
    mean_abs = float(np.mean(diff)) if finite.all() else float("inf")
    scale = float(np.max(np.abs(reference.logits))) if reference.logits.size else 0.0
    return LogitParity(
        agreement=float(np.mean(reference.predictions == candidate.predictions)),
        max_abs_diff=max_abs,
        mean_abs_diff=mean_abs,
        max_relative_diff=max_abs / scale if scale > 0 else max_abs,
        abs_diff=diff[finite].ravel(),
    )
