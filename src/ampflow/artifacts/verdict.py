"""The parity verdict as an artifact: what it holds, how it is read, and whose model it judges.

`verdict.json` is the contract between evaluate and everything after it (the pipeline's gate
task, export). It names the exact model it judged by the sha256 of its `model.keras`, so a
verdict can never be paired with another model by mistake (a re-trained model in the same dir,
a wrong `--eval-dir`): export compares the hash before it exports anything.
"""

from __future__ import annotations

import hashlib
import math
import operator
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ampflow.errors import GateFailedError, ModelLoadError
from ampflow.files import read_artifact_json

VERDICT_FILE = "verdict.json"
HASH_KEY = "model_sha256"
_OPS = {"<=": operator.le, ">=": operator.ge}


def model_sha256(model_dir: str | os.PathLike) -> str:
    """sha256 of the trained model file (`<model_dir>/model.keras`): the model's identity."""
    from ampflow.artifacts.model_dir import MODEL_FILE

    path = Path(model_dir) / MODEL_FILE
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as e:
        raise ModelLoadError(f"cannot read {path} to identify the model: {e.strerror}") from e
    return digest.hexdigest()


def load_verdict(eval_dir: str | os.PathLike) -> dict[str, Any]:
    """Read `verdict.json` from an evaluation dir; ModelLoadError if it is missing or corrupt.

    The gate task and the export step read it to stop a model whose parity gate failed.
    """
    path = Path(eval_dir) / VERDICT_FILE
    verdict = read_artifact_json(eval_dir, VERDICT_FILE, artifact="an evaluation output",
                                 hint="run `ampflow evaluate` first", error=ModelLoadError)
    if (not isinstance(verdict, dict) or not isinstance(verdict.get("passed"), bool)
            or not isinstance(verdict.get("failed_checks"), list)):
        raise ModelLoadError(
            f"{path} must hold an object with a bool 'passed' and a list 'failed_checks'. "
            f"Received: {str(verdict)[:200]}"
        )
    return verdict


def require_passed(eval_dir: str | os.PathLike) -> dict[str, Any]:
    """The verdict if it passed; GateFailedError naming every failed check otherwise.

    This is the pipeline's gate: evaluate itself always succeeds (so that KFP uploads its
    report, metrics and verdict even for a failed model), and this call, in a task of its own,
    stops the run before export with the reason in its message.
    """
    verdict = load_verdict(eval_dir)
    if verdict["passed"]:
        return verdict
    lines = [explain_check(check) for check in verdict["failed_checks"]]
    notes = [f"note: {note}" for note in verdict.get("notes") or [] if isinstance(note, str)]
    raise GateFailedError(
        f"the FP32-parity gate failed {len(lines)} check(s), so the run stops before export: "
        + "; ".join(lines + notes)
        + ". The evaluate task's report and metrics show every measure.")


def require_same_model(verdict: dict[str, Any], model_dir: str | os.PathLike) -> str:
    """The model's hash, if `verdict` was written for the model in `model_dir`; else raise.

    Raises GateFailedError in one line: a verdict without a hash (older ampflow) or with
    another model's hash proves nothing about this model.
    """
    actual = model_sha256(model_dir)
    recorded = verdict.get(HASH_KEY)
    if recorded != actual:
        found = f"sha256 {recorded[:12]}…" if recorded else f"no {HASH_KEY}"
        raise GateFailedError(
            f"the parity verdict is not for this model: expected {HASH_KEY} {actual[:12]}… "
            f"(model.keras in {model_dir}), received {found} in the verdict; evaluate this "
            "model and export with that evaluation.")
    return actual


def explain_check(check: Any) -> str:
    """`name: measured X vs threshold op Y`, as the evaluate step printed it."""
    try:
        return Check(str(check["name"]), float(check["value"]), str(check["op"]),
                     float(check["threshold"]), reason=str(check.get("reason") or "")).explain()
    except (TypeError, KeyError, ValueError):
        return str(check)


@dataclass(frozen=True)
class Check:
    """One gate check: `value op threshold` must hold; a non-finite value always fails."""

    name: str
    value: float
    op: str
    threshold: float
    description: str = ""
    reason: str = ""  # the outcome in words with its numbers, where a sentence says more


    @property
    def passed(self) -> bool:
        """Whether the measured value satisfies the threshold (NaN/inf never pass)."""
        return math.isfinite(self.value) and _OPS[self.op](self.value, self.threshold)

    def as_dict(self) -> dict[str, Any]:
        """JSON form, as written into metrics.json and verdict.json."""
        out = asdict(self)
        out["value"] = self.value if math.isfinite(self.value) else str(self.value)
        out["passed"] = self.passed
        return out

    def explain(self) -> str:
        """`name: reason`, else `name: measured X vs threshold op Y`: what a failed gate prints."""
        if self.reason:
            return f"{self.name}: {self.reason}"
        measured, bound = _fmt(self.value), _fmt(self.threshold)
        return f"{self.name}: measured {measured} vs threshold {self.op} {bound}"


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:.3e}"
