"""Verdict files for the export tests (a plain module: tests cannot import conftest.py)."""

from __future__ import annotations

import json


def write_verdict(directory, passed: bool, failed_checks=(), model_dir=None):
    """A verdict.json; with `model_dir`, one that names that model (its model.keras sha256)."""
    from ampflow.artifacts.verdict import model_sha256

    directory.mkdir(parents=True, exist_ok=True)
    verdict = {"passed": passed, "failed_checks": list(failed_checks)}
    if model_dir is not None:
        verdict["model_sha256"] = model_sha256(model_dir)
    (directory / "verdict.json").write_text(json.dumps(verdict))
    return directory
