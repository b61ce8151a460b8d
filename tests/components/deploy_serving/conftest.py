"""Fixtures of the deploy step: tiny real SavedModels in the export layout, and kubeconfigs.

The model and the helpers the tests import live in deploy_helpers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_helpers import MODEL_NAME, free_port, write_saved_model

from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.serving.testing import ServeProcess


@pytest.fixture(scope="session")
def export_base(tmp_path_factory) -> Path:
    """<export_base>/digits/{1,2}/: two versions of the tiny model, as the exporter lays them."""
    base = tmp_path_factory.mktemp("export")
    for version in (1, 2):
        write_saved_model(base / MODEL_NAME / str(version), seed=version)
    return base


@pytest.fixture
def dead_kubeconfig(tmp_path) -> tuple[Path, str]:
    """A kubeconfig whose API server is a free loopback port: (path, server URL)."""
    server = f"https://127.0.0.1:{free_port()}"
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: dead\n  cluster:\n    server: {server}\n"
        "    insecure-skip-tls-verify: true\n"
        "users:\n- name: dead\n  user:\n    token: not-a-real-token\n"
        "contexts:\n- name: dead\n  context:\n    cluster: dead\n    user: dead\n"
        "current-context: dead\n"
    )
    return path, server


@pytest.fixture
def no_kube_env(monkeypatch, tmp_path):
    """No $KUBECONFIG, no ~/.kube/config, not in a pod: no cluster configuration at all."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def served_store(tmp_path, export_base):
    """A model store holding digits/1 and an `ampflow serve` process polling it every 0.5 s."""
    store = tmp_path / "store"
    run_deploy(DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", model_store=str(store)))
    with ServeProcess(MODEL_NAME, store / MODEL_NAME, tmp_path / "server.log",
                      "--file-system-poll-wait-seconds", "0.5") as server:
        yield store, server.address, server.proc
