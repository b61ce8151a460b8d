"""The deployment gate: export only a model whose evaluate verdict passed, unless forced.

The gate is an artifact (`<eval_dir>/verdict.json`, written by the evaluate step), not a side
effect. Forcing past it is allowed, because a human may knowingly ship a model that missed a
threshold, but it is logged loudly and recorded in the export metadata for whoever serves it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampflow.errors import GateFailedError, ModelLoadError

log = logging.getLogger(__name__)

VERDICT_FILE = "verdict.json"
_BANNER = "!" * 78


@dataclass(frozen=True)
class GateDecision:
    """Whether the export may go ahead, and why (recorded in `ampflow_export.json`)."""

    verdict_passed: bool | None  # None: no verdict was read
    forced: bool
    verdict_path: str | None
    failed_checks: list[Any] = field(default_factory=list)
    warning: str | None = None

    def as_metadata(self) -> dict[str, Any]:
        return {"verdict_passed": self.verdict_passed, "forced": self.forced,
                "verdict_path": self.verdict_path, "failed_checks": self.failed_checks,
                "warning": self.warning}


def check_gate(eval_dir: str | os.PathLike | None, force: bool) -> GateDecision:
    """Read the verdict; raise GateFailedError if it failed (or is unreadable) and not `force`."""
    if eval_dir is None:
        if not force:  # ExportConfig already refuses this; kept for direct callers
            raise GateFailedError("no eval_dir given: the export gate needs the evaluate step's "
                                  "verdict.json (or force=True to export ungated)")
        return _forced(None, None, [], "exported WITHOUT a parity verdict (no eval_dir)")
    path = Path(eval_dir) / VERDICT_FILE
    try:
        verdict = _load_verdict(path)
    except GateFailedError as e:
        if not force:
            raise
        return _forced(None, str(path), [], f"exported WITHOUT a readable verdict: {e}")
    failed = list(verdict.get("failed_checks", []))
    if verdict["passed"]:
        log.info("parity gate passed (%s)", path)
        return GateDecision(True, False, str(path), failed)
    if not force:
        raise GateFailedError(
            f"the parity gate failed, so no SavedModel is exported. Expected: passed=true in "
            f"{path}. Received: passed=false, failed_checks={_brief(failed)}. Fix the model, "
            "or pass --force to export it anyway (recorded in ampflow_export.json)."
        )
    return _forced(False, str(path), failed,
                   f"exported DESPITE a FAILED parity gate: failed_checks={_brief(failed)}")


def _load_verdict(path: Path) -> dict[str, Any]:
    """The evaluate step's reader, with its errors turned into a gate failure."""
    from ampflow.components.evaluate_parity.step import load_verdict

    try:
        return load_verdict(path.parent)
    except ModelLoadError as e:
        raise GateFailedError(f"eval_dir must hold {VERDICT_FILE} (valid, from "
                              f"`ampflow evaluate`): {e}") from e


def _forced(passed, path, failed, warning: str) -> GateDecision:
    log.warning("\n%s\nFORCED EXPORT: %s.\nThis is recorded in ampflow_export.json "
                "(gate.forced=true).\n%s", _BANNER, warning, _BANNER)
    return GateDecision(passed, True, path, failed, warning)


def _brief(failed: list[Any]) -> list[Any]:
    """Check names where the verdict gives dicts; the items themselves otherwise."""
    return [c.get("name", c) if isinstance(c, dict) else c for c in failed]
