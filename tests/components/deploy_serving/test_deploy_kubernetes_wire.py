"""`deploy --target kubernetes` on the wire: a fake API server on loopback, a real gRPC server.

The fake (fake_apiserver.py) stands for Kubernetes' HTTP API only: what is tested is our side —
server-side apply requests as the API server receives them, the rollout wait, the rollback on a
stalled rollout, and the canary against a real `ampflow serve`.
"""

from __future__ import annotations

import pytest
from fake_apiserver import FakeApiServer

from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.errors import DeployError

MODEL_NAME = "digits"  # as in conftest.py
KINDS = [
    "ConfigMap",
    "Deployment",
    "HorizontalPodAutoscaler",
    "NetworkPolicy",
    "PersistentVolumeClaim",
    "PodDisruptionBudget",
    "Service",
    "ServiceAccount",
]


def _config(export_base, store, kubeconfig, version, **kwargs):
    return DeployConfig(
        saved_model_dir=export_base / MODEL_NAME / str(version),
        target="kubernetes",
        model_store=str(store),
        kubeconfig=kubeconfig,
        namespace="team-a",
        rollout_timeout_s=20,
        **kwargs,
    )


def _pinned(api: FakeApiServer) -> list[str]:
    return [
        p["body"]["metadata"]["annotations"]["ampflow.dev/model-version"]
        for p in api.patches
        if p["body"]["kind"] == "Deployment"
    ]


@pytest.mark.k8s
@pytest.mark.serving
@pytest.mark.timeout(180)
def test_deploy_applies_server_side_waits_and_canaries_real_server(
    served_store, export_base, tmp_path
):
    store, address, _ = served_store
    with FakeApiServer() as api:
        api.kubeconfig(tmp_path / "kubeconfig")
        result = run_deploy(
            _config(export_base, store, tmp_path / "kubeconfig", 2, server_address=address)
        )
    assert (result.served_version, result.endpoint, result.previous_version) == (2, address, None)
    assert sorted(p["body"]["kind"] for p in api.patches) == KINDS
    for patch in api.patches:
        assert patch["content_type"] == "application/apply-patch+yaml"
        assert patch["query"]["fieldManager"] == ["ampflow-deploy"]
        assert patch["query"]["force"][0].lower() == "true"
        assert patch["path"].split("/")[-3:-2] != ["default"]
        assert "/namespaces/team-a/" in patch["path"]
    assert (store / MODEL_NAME / "2" / "saved_model.pb").is_file()
    assert _pinned(api) == ["2"]


@pytest.mark.k8s
def test_stalled_rollout_rolls_back_to_the_previous_version(export_base, tmp_path):
    store = tmp_path / "store"
    with FakeApiServer(stall_version="2") as api:
        api.kubeconfig(tmp_path / "kubeconfig")
        # version 1 goes live first (its canary is not the point here: no server to ask)
        with pytest.raises(DeployError, match=r"did not become AVAILABLE"):
            run_deploy(
                _config(
                    export_base,
                    store,
                    tmp_path / "kubeconfig",
                    1,
                    server_address="127.0.0.1:1",
                    canary_timeout_s=0.5,
                )
            )
        api.patches.clear()
        with pytest.raises(DeployError) as info:
            run_deploy(_config(export_base, store, tmp_path / "kubeconfig", 2))
    message = str(info.value)
    assert "ProgressDeadlineExceeded" in message
    assert "rolled back: version 1 is serving" in message
    assert _pinned(api) == ["2", "1"]  # the new render, then the previous one again
