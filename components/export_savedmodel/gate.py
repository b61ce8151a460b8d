"""The deployment gate: export only a model whose evaluate verdict passed, unless forced.

The gate is an artifact (`<eval_dir>/verdict.json`, written by the evaluate step), not a side
effect, and it names the model it judged (the sha256 of its `model.keras`): a verdict for any
other model is refused as if there were none. Forcing past it is allowed, because a human may
knowingly ship a model that missed a threshold, but it is logged loudly and recorded in the
export metadata for whoever serves it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampflow.artifacts.verdict import (
    VERDICT_FILE,
    load_verdict,
    require_same_model,
)
from ampflow.errors import GateFailedError, ModelLoadError

log = logging.getLogger(__name__)

_BANNER = "!" * 78


@dataclass(frozen=True)
class GateDecision:
    """Whether the export may go ahead, and why (recorded in `ampflow_export.json`)."""

    verdict_passed: bool | None  # None: no verdict was read
    forced: bool
    verdict_path: str | None
    failed_checks: list[Any] = field(default_factory=list)
    warning: str | None = None
    verdict: dict[str, Any] | None = None  # the verdict read, for the model check
    model_sha256: str | None = None  # the exported model, confirmed to be the one judged

    def as_metadata(self) -> dict[str, Any]:
        """JSON form, as written into ampflow_export.json."""
        return {"verdict_passed": self.verdict_passed, "forced": self.forced,
                "verdict_path": self.verdict_path, "failed_checks": self.failed_checks,
                "warning": self.warning, "model_sha256": self.model_sha256}


def check_gate(eval_dir: str | os.PathLike | None, force: bool) -> GateDecision:
    """Read the verdict; raise GateFailedError if it failed (or is unreadable) and not `force`.

    Reads no model: a refused model costs nothing. `check_model` then proves the verdict is
    about the model being exported.
    """
    if eval_dir is None:
        if not force:  # ExportConfig already refuses this; kept for direct callers
            raise GateFailedError("no eval_dir given: the export gate needs the evaluate step's "
                                  "verdict.json (or force=True to export ungated)")
        return _forced(None, None, [], "exported WITHOUT a parity verdict (no eval_dir)")
    path = Path(eval_dir) / VERDICT_FILE
    if not force and not Path(eval_dir).is_dir():  # a flag naming nothing: exit 2, not a gate
        from ampflow.errors import ModelConfigError

        raise ModelConfigError(f"eval_dir must be the output dir of `ampflow evaluate` (holding "
                               f"{VERDICT_FILE}). Received: eval_dir={str(eval_dir)!r} (no such "
                               "directory)")
    try:
        verdict = _load_verdict(path)
    except GateFailedError as e:
        if not force:
            raise
        return _forced(None, str(path), [], f"exported WITHOUT a readable verdict: {e}")
    failed = list(verdict.get("failed_checks", []))
    if verdict["passed"]:
        log.info("parity gate passed (%s)", path)
        return GateDecision(True, False, str(path), failed, verdict=verdict)
    if not force:
        raise GateFailedError(
            f"the parity gate failed, so no SavedModel is exported. Expected: passed=true in "
            f"{path}. Received: passed=false, failed_checks={_brief(failed)}. Fix the model, "
            "or pass --force to export it anyway (recorded in ampflow_export.json)."
        )
    decision = _forced(False, str(path), failed,
                       f"exported DESPITE a FAILED parity gate: failed_checks={_brief(failed)}")
    return dataclasses.replace(decision, verdict=verdict)


def check_model(gate: GateDecision, model_dir: str | os.PathLike, force: bool) -> GateDecision:
    """Refuse (one line) a verdict written for another model: its model_sha256 must match."""
    if gate.verdict is None:  # no verdict was read: already forced, nothing to compare
        return gate
    try:
        digest = require_same_model(gate.verdict, model_dir)
    except GateFailedError as e:
        if not force:
            raise
        warning = f"exported WITHOUT a verdict for this model: {e}"
        forced = _forced(gate.verdict_passed, gate.verdict_path, gate.failed_checks,
                         f"{gate.warning}; and {warning}" if gate.warning else warning)
        return dataclasses.replace(forced, verdict=gate.verdict)
    return dataclasses.replace(gate, model_sha256=digest)


def _load_verdict(path: Path) -> dict[str, Any]:
    """The evaluate step's reader, with its errors turned into a gate failure."""
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
