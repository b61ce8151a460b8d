"""Helpers of the k8s tests (a plain module: conftest.py cannot be imported by tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

K8S_DIR = Path(__file__).resolve().parents[2] / "k8s"
TARGETS = ("overlays/cpu", "overlays/gpu", "rbac", "rbac-kubeflow", "model-store", "pipeline", ".")


def require_tool(path: str | None, what: str, install: str) -> str:
    """The tool's path; a missing tool skips locally but fails under CI (CI=true)."""
    if path:
        return path
    message = f"{what} not found; install it: {install}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    """(object name, pod spec) of every workload among `objects`."""
    out = []
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            out.append((obj["metadata"]["name"], obj["spec"]["template"]["spec"]))
    return out


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]
