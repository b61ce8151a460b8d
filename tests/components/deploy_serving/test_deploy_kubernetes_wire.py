"""`deploy --target kubernetes` on the wire: a fake API server, real kubectl, a real gRPC server.

The fake (fake_apiserver.py) stands for Kubernetes' HTTP API only; what is tested is our side:
the server-side apply requests as the API server receives them, the canary → promote order,
`kubectl rollout status` and `kubectl rollout undo` run against it, the release record, and each
rollback. One `ampflow serve` (all versions) stands for both the canary and the stable pods:
every check asks it for the exact version and compares the answers with the recorded ones.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml
from deploy_helpers import MODEL_NAME
from fake_apiserver import FakeApiServer

from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.errors import DeployError
from ampflow.serving.testing import ServeProcess

pytestmark = [pytest.mark.k8s, pytest.mark.serving, pytest.mark.timeout(300)]

NAMESPACE = "team-a"
STABLE, CANARY = "tf-serving", "tf-serving-canary"
SHARED = ["ConfigMap", "NetworkPolicy", "PersistentVolumeClaim", "PodDisruptionBudget",
          "Service", "ServiceAccount"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(model store, gRPC address): `ampflow serve` polling the store, serving every version."""
    store = tmp_path_factory.mktemp("k8s-store")
    (store / MODEL_NAME).mkdir()
    with ServeProcess(MODEL_NAME, store / MODEL_NAME, store.parent / "k8s-server.log",
                      "--version-policy", "all", "--wait-for-base-path",  # empty until a deploy
                      "--file-system-poll-wait-seconds", "0.5") as served:
        yield store, served.address


def _deploy(api: FakeApiServer, tmp_path, store, address, saved_model_dir, **kwargs):
    api.kubeconfig(tmp_path / "kubeconfig")
    # the export's own number, as given (the module's store is shared; numbering is tested in
    # test_deploy_races.py): a version already there with this model is a no-op push
    return run_deploy(DeployConfig(
        saved_model_dir=saved_model_dir, version=int(saved_model_dir.name), target="kubernetes",
        model_store=str(store),
        kubeconfig=tmp_path / "kubeconfig", namespace=NAMESPACE, rollout_timeout_s=20,
        canary_timeout_s=60, server_address=address, canary_address=address, **kwargs))


def _applied(api: FakeApiServer) -> list[tuple[str, str, str | None]]:
    """(kind, name, pinned version or replicas) of each server-side apply, in order."""
    out = []
    for patch in api.patches:
        body = patch["body"]
        detail = None
        if body["kind"] == "Deployment":
            replicas = body["spec"].get("replicas")
            version = body["metadata"]["annotations"]["ampflow.dev/model-version"]
            detail = f"v{version}" + ("" if replicas is None else f" x{replicas}")
        elif body["kind"] == "ConfigMap" and "version" in body.get("data", {}):
            detail = f"record v{body['data']['version']}"
        out.append((body["kind"], body["metadata"]["name"], detail))
    return out


def _stable_version(api: FakeApiServer) -> str:
    return api.deployment(NAMESPACE, STABLE)["metadata"]["annotations"]["ampflow.dev/model-version"]


def _kubectl_calls(api: FakeApiServer, what: str) -> int:
    return sum(1 for method, path in api.requests if what in path)


@pytest.mark.slow
def test_first_deploy_runs_a_canary_then_promotes_and_records_the_release(
        server, export_base, tmp_path):
    store, address = server
    with FakeApiServer() as api:
        result = _deploy(api, tmp_path, store, address, export_base / MODEL_NAME / "1")
        steps = _applied(api)
    assert (result.served_version, result.previous_version, result.promoted) == (1, None, True)
    assert result.canary_address == address and result.endpoint == address
    assert result.canary_share == pytest.approx(1.0)  # no stable pods yet: all of it
    kinds = [kind for kind, _, _ in steps]
    # a first deploy: the shared objects, then the canary track, then the release, then the
    # canary retired and the release recorded
    assert sorted(kinds[:6]) == SHARED
    assert steps[6:9] == [("ConfigMap", steps[6][1], None), ("Deployment", CANARY, "v1 x1"),
                          ("Service", CANARY, None)]
    assert ("Deployment", STABLE, "v1") in steps[9:17]
    assert steps[-2:] == [("Deployment", CANARY, "v1 x0"),
                          ("ConfigMap", "tf-serving-release", "record v1")]
    for patch in api.patches:
        assert patch["content_type"] == "application/apply-patch+yaml"
        assert patch["query"]["fieldManager"] == ["ampflow-deploy"]
        # force: we own the fields we set, even after someone's `kubectl edit` took them
        assert [v.lower() for v in patch["query"]["force"]] == ["true"]  # Go ParseBool: True
        assert f"/namespaces/{NAMESPACE}/" in patch["path"]
    # kubectl rollout status watched both Deployments (list + watch by name)
    assert _kubectl_calls(api, f"fieldSelector=metadata.name%3D{CANARY}") >= 1
    assert _kubectl_calls(api, f"fieldSelector=metadata.name%3D{STABLE}") >= 1
    assert (store / MODEL_NAME / "1" / "saved_model.pb").is_file()


def _promote_version_1(api, tmp_path, store, address, export_base):
    _deploy(api, tmp_path, store, address, export_base / MODEL_NAME / "1")
    recorded = api.objects[f"/api/v1/namespaces/{NAMESPACE}/configmaps/tf-serving-release"]
    assert recorded["data"]["version"] == "1"
    api.patches.clear()


@pytest.mark.slow
def test_second_deploy_promotes_and_reports_the_previous_version(server, export_base, tmp_path):
    store, address = server
    with FakeApiServer() as api:
        _promote_version_1(api, tmp_path, store, address, export_base)
        result = _deploy(api, tmp_path, store, address, export_base / MODEL_NAME / "2")
        steps = _applied(api)
        assert _stable_version(api) == "2"
    assert (result.served_version, result.previous_version) == (2, 1)
    assert result.canary_share == pytest.approx(1 / 3)  # 1 canary pod beside 2 stable ones
    # not a first deploy: nothing shared is applied before the canary has passed
    assert [k for k, _, _ in steps[:3]] == ["ConfigMap", "Deployment", "Service"]
    assert steps[1] == ("Deployment", CANARY, "v2 x1")
    assert steps[-1] == ("ConfigMap", "tf-serving-release", "record v2")


def _with_wrong_answers(src, dst):
    """A copy of a version whose recorded answers are not what it computes."""
    shutil.copytree(src, dst)
    with np.load(dst / "ampflow_canary.npz") as data:
        arrays = dict(data)
    arrays["probabilities"] = np.roll(arrays["probabilities"], 1, axis=1)
    arrays["class_ids"] = (arrays["class_ids"] + 1) % 10
    with open(dst / "ampflow_canary.npz", "wb") as f:
        np.savez(f, **arrays)
    return dst


@pytest.mark.slow
def test_canary_with_wrong_answers_is_removed_and_the_stable_track_never_changes(
        server, export_base, tmp_path):
    store, address = server
    wrong = _with_wrong_answers(export_base / MODEL_NAME / "2", tmp_path / "x" / MODEL_NAME / "3")
    with FakeApiServer() as api:
        _promote_version_1(api, tmp_path, store, address, export_base)
        with pytest.raises(DeployError) as info:
            _deploy(api, tmp_path, store, address, wrong)
        steps = _applied(api)
        assert _stable_version(api) == "1"
    message = str(info.value)
    assert "does not give the recorded answers on 6 real examples" in message
    assert "rolled back: version 1 is serving (the stable Deployment was never changed)" in message
    assert "the canary was scaled to 0" in message
    assert ("Deployment", STABLE, "v3") not in steps
    assert steps[-1] == ("Deployment", CANARY, "v3 x0")
    assert not any(detail == "record v3" for _, _, detail in steps)


@pytest.mark.slow
def test_stalled_promotion_re_applies_the_recorded_release_exactly(server, export_base, tmp_path):
    store, address = server
    with FakeApiServer(stall={(STABLE, "2")}) as api:
        _promote_version_1(api, tmp_path, store, address, export_base)
        record_map = api.objects[f"/api/v1/namespaces/{NAMESPACE}/configmaps/tf-serving-release"]
        recorded = [d for d in yaml.safe_load_all(record_map["data"]["release.yaml"]) if d]
        with pytest.raises(DeployError) as info:
            _deploy(api, tmp_path, store, address, export_base / MODEL_NAME / "2")
        steps = _applied(api)
        assert _stable_version(api) == "1"
        rollback_bodies = [p["body"] for p in api.patches][-len(recorded):]
    message = str(info.value)
    assert "exceeded its progress deadline" in message
    assert "rolled back: version 1 is serving" in message
    assert "the recorded release of version 1 was re-applied and rolled out" in message
    assert ("Deployment", STABLE, "v2") in steps  # promotion was attempted...
    assert ("Deployment", CANARY, "v2 x0") in steps  # ...the canary retired...
    assert rollback_bodies == recorded  # ...and the recorded render re-applied, object by object


@pytest.mark.slow
def test_stalled_promotion_without_a_record_uses_kubectl_rollout_undo(server, export_base,
                                                                     tmp_path):
    store, address = server
    with FakeApiServer(stall={(STABLE, "2")}) as api:
        _promote_version_1(api, tmp_path, store, address, export_base)
        del api.objects[f"/api/v1/namespaces/{NAMESPACE}/configmaps/tf-serving-release"]
        with pytest.raises(DeployError) as info:
            _deploy(api, tmp_path, store, address, export_base / MODEL_NAME / "2")
        assert _stable_version(api) == "1"  # the previous ReplicaSet's template is back
        undo = [p for p in api.patches
                if p["content_type"].startswith("application/json-patch+json")]
    assert "`kubectl rollout undo` restored the revision that was live before (1)" in str(
        info.value)
    assert len(undo) == 1 and undo[0]["path"].endswith(f"/deployments/{STABLE}")


@pytest.mark.slow
def test_stable_deployment_made_by_hand_is_restored_not_scaled_down(server, export_base,
                                                                   tmp_path):
    # `kubectl apply -k k8s/overlays/cpu` by hand: a stable Deployment without our annotations
    # and no release record. A failed promotion must give it back, not treat it as absent.
    from ampflow.components.deploy_serving import kubernetes_render

    store, address = server
    with FakeApiServer(stall={(STABLE, "1")}) as api:
        api.kubeconfig(tmp_path / "kubeconfig")
        config = DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", target="kubernetes",
                              model_store=str(store), namespace=NAMESPACE)
        by_hand = kubernetes_render.one(kubernetes_render.render(config, MODEL_NAME, 1),
                                        "Deployment")
        del by_hand["metadata"]["annotations"]["ampflow.dev/model-version"]
        by_hand["spec"]["template"]["spec"]["containers"][0]["image"] = "tensorflow/serving:2.19.0"
        _apply_by_hand(api, by_hand)
        with pytest.raises(DeployError) as info:
            _deploy(api, tmp_path, store, address, export_base / MODEL_NAME / "1")
        stable = api.deployment(NAMESPACE, STABLE)
    assert "restored the revision that was live before (1)" in str(info.value)
    assert "the stable Deployment that was live before is serving" in str(info.value)
    pod, hand_pod = stable["spec"]["template"]["spec"], by_hand["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "tensorflow/serving:2.19.0"  # the hand-made one
    assert pod["volumes"] == hand_pod["volumes"]
    assert stable["spec"].get("replicas") != 0


def _apply_by_hand(api: FakeApiServer, obj: dict) -> None:
    import json
    import urllib.request

    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{obj['metadata']['name']}"
    request = urllib.request.Request(
        f"{api.url}{path}?fieldManager=kubectl", data=json.dumps(obj).encode(), method="PATCH",
        headers={"Content-Type": "application/apply-patch+yaml"})
    urllib.request.urlopen(request, timeout=10).read()
    api.patches.clear()


@pytest.mark.slow
def test_first_deploy_whose_rollout_stalls_leaves_nothing_serving(server, export_base, tmp_path):
    store, address = server
    with FakeApiServer(stall={(STABLE, "1")}) as api:
        with pytest.raises(DeployError) as info:
            _deploy(api, tmp_path, store, address, export_base / MODEL_NAME / "1")
        stable = api.deployment(NAMESPACE, STABLE)
    message = str(info.value)
    assert "rolled back: nothing is serving (there was no previous version)" in message
    assert "first deploy: the new stable Deployment was scaled to 0" in message
    assert stable["spec"]["replicas"] == 0


@pytest.mark.slow
def test_canary_whose_pods_never_get_ready_is_removed(server, export_base, tmp_path):
    store, address = server
    with FakeApiServer(stall={(CANARY, "2")}) as api:
        _promote_version_1(api, tmp_path, store, address, export_base)
        with pytest.raises(DeployError) as info:
            _deploy(api, tmp_path, store, address, export_base / MODEL_NAME / "2")
        steps = _applied(api)
    assert f"rollout of Deployment {NAMESPACE}/{CANARY} did not complete" in str(info.value)
    assert "version 1 is serving (the stable Deployment was never changed)" in str(info.value)
    assert [s for s in steps if s[1] == STABLE] == []


def test_a_model_store_this_user_cannot_write_is_one_line_and_nothing_changes(
        export_base, tmp_path, monkeypatch):
    """The KFP deploy task mounts the model-store claim with no fsGroup (KFP sets none): a
    fresh volume's root is root's, mode 0755, and the step says so before touching anything."""
    import os
    from pathlib import Path

    from ampflow.errors import ConfigError

    store = tmp_path / "models"
    store.mkdir()
    store.chmod(0o555)
    real_access = os.access  # as root, answer as the kernel would for uid 10001
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != store
                        and real_access(path, mode))
    try:
        with FakeApiServer() as api, pytest.raises(ConfigError, match=(
                r"the model store .*models is not writable by this pod's user .* mode 0555, "
                r"and KFP sets no fsGroup")):
            _deploy(api, tmp_path, store, "127.0.0.1:1", export_base / MODEL_NAME / "1")
        assert api.patches == []
    finally:
        store.chmod(0o755)
