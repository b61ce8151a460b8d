"""Render the k8s/ kustomizations once per session with the real `kubectl kustomize`."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from k8s_helpers import K8S_DIR, load_all_yaml, require_tool


@pytest.fixture(scope="session")
def kubectl() -> str:
    found = os.environ.get("KUBECTL") or shutil.which("kubectl")
    return require_tool(found, "kubectl (with kustomize)", "see the Makefile's tools venv")


@pytest.fixture(scope="session")
def render(kubectl):
    """`render(target)` -> (YAML text, list of objects) of `kubectl kustomize k8s/<target>`."""
    cache: dict[str, tuple[str, list[dict]]] = {}

    def _render(target: str) -> tuple[str, list[dict]]:
        if target not in cache:
            proc = subprocess.run(
                [kubectl, "kustomize", str(K8S_DIR / target)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert proc.returncode == 0, proc.stderr
            cache[target] = (proc.stdout, load_all_yaml(proc.stdout))
        return cache[target]

    return _render
