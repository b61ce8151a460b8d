"""Two rollouts of one Deployment at once (issue 24, item 3), on the loopback fake API server.

Each deploy first creates the ConfigMap `<stable>-rollout-lock`; the API server refuses to
create an object that exists (409 AlreadyExists), so of two deploys released at the same moment
one rolls out and the other fails with one clear line before it changes anything, instead of
the two interleaving their canaries and promotions. The lock is never deleted (the Role grants
no delete): it is released, or a lock left by a deploy that died is taken over once expired, by
a PATCH that carries the resourceVersion read (409 Conflict if it changed meanwhile).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from deploy_helpers import MODEL_NAME
from fake_apiserver import FakeApiServer

from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.components.deploy_serving.kubernetes_cluster import Cluster
from ampflow.errors import DeployError
from ampflow.serving.testing import ServeProcess

pytestmark = [pytest.mark.k8s, pytest.mark.serving, pytest.mark.timeout(300)]

NAMESPACE = "team-a"
STABLE = "tf-serving"
LOCK = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{STABLE}-rollout-lock"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("k8s-race-store")
    (store / MODEL_NAME).mkdir()
    with ServeProcess(MODEL_NAME, store / MODEL_NAME, store.parent / "k8s-race-server.log",
                      "--version-policy", "all", "--wait-for-base-path",  # empty until a deploy
                      "--file-system-poll-wait-seconds", "0.5") as served:
        yield store, served.address


def _config(api, tmp_path, store, address, saved_model_dir) -> DeployConfig:
    api.kubeconfig(tmp_path / "kubeconfig")
    return DeployConfig(  # the export's own number, as given (the module's store is shared)
        saved_model_dir=saved_model_dir, version=int(saved_model_dir.name), target="kubernetes",
        model_store=str(store),
        kubeconfig=tmp_path / "kubeconfig", namespace=NAMESPACE, rollout_timeout_s=20,
        canary_timeout_s=60, server_address=address, canary_address=address)


def _lock(api, expires_at: float, holder: str = "other-pod:7") -> None:
    api.objects[LOCK] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": f"{STABLE}-rollout-lock", "namespace": NAMESPACE, "uid": "u-old",
        "resourceVersion": "41"}, "data": {"holder": holder, "version": "9",
                                           "expires_at": str(int(expires_at))}}


def _released(api, lock: str = LOCK) -> bool:
    return api.objects[lock]["data"]["expires_at"] == "0"


@pytest.mark.slow
def test_two_rollouts_of_one_deployment_at_once_one_fails_clearly(server, export_base,
                                                                  tmp_path, monkeypatch):
    store, address = server
    tried = threading.Barrier(2, timeout=120)
    lock_rollout = Cluster.lock_rollout

    def lock_then_wait_for_the_other(self, *args):
        """Whoever wins holds the lock until the other has tried it too (deterministic)."""
        try:
            return lock_rollout(self, *args)
        finally:
            tried.wait()

    monkeypatch.setattr(Cluster, "lock_rollout", lock_then_wait_for_the_other)
    with FakeApiServer() as api:
        configs = [_config(api, tmp_path, store, address, export_base / MODEL_NAME / str(v))
                   for v in (1, 2)]
        start = threading.Barrier(2)
        outcomes: dict[int, object] = {}

        def deploy(config):
            start.wait()
            try:
                outcomes[config.resolved_version] = run_deploy(config)
            except DeployError as e:
                outcomes[config.resolved_version] = e

        threads = [threading.Thread(target=deploy, args=(c,)) for c in configs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=240)
        assert sorted(outcomes) == [1, 2]
        failed = {v: o for v, o in outcomes.items() if isinstance(o, DeployError)}
        assert len(failed) == 1, outcomes  # exactly one rolled out, the other was refused
        (loser, error), = failed.items()
        winner = 3 - loser
        assert str(error).startswith(f"another deploy is rolling out Deployment "
                                     f"{NAMESPACE}/{STABLE} right now (version {winner}")
        assert "Nothing was changed" in str(error)
        assert outcomes[winner].served_version == winner
        pinned = api.deployment(NAMESPACE, STABLE)["metadata"]["annotations"]
        assert pinned["ampflow.dev/model-version"] == str(winner)
        # the loser applied nothing: every apply pins the winner's version or none
        versions = {p["body"]["metadata"].get("annotations", {}).get("ampflow.dev/model-version")
                    for p in api.patches}
        assert str(loser) not in versions
        assert _released(api)  # released by the winner


@pytest.mark.slow
def test_a_live_lock_refuses_the_deploy_and_changes_nothing(server, export_base, tmp_path):
    store, address = server
    with FakeApiServer() as api:
        _lock(api, time.time() + 600)
        with pytest.raises(DeployError, match=r"another deploy .* \(version 9, by other-pod:7"):
            run_deploy(_config(api, tmp_path, store, address, export_base / MODEL_NAME / "1"))
        assert api.patches == []
        assert api.objects[LOCK]["metadata"]["uid"] == "u-old"  # not taken


@pytest.mark.slow
def test_an_expired_lock_of_a_dead_deploy_is_taken_over(server, export_base, tmp_path):
    store, address = server
    with FakeApiServer() as api:
        _lock(api, time.time() - 1)
        result = run_deploy(_config(api, tmp_path, store, address,
                                    export_base / MODEL_NAME / "1"))
        assert result.served_version == 1
        assert not [path for method, path in api.requests if method == "DELETE"]
        lock_patches = [p for p in api.merge_patches if p["path"] == LOCK]
        # taken over on the resourceVersion read, then released on the one the take-over got
        assert [p["body"]["metadata"]["resourceVersion"] for p in lock_patches] == ["41", "1"]
        assert [p["body"]["data"]["version"] for p in lock_patches] == ["1", ""]
        assert _released(api)


@pytest.mark.slow
def test_with_a_name_prefix_the_lock_is_released_without_a_delete(server, export_base,
                                                                   tmp_path):
    """k8s/rbac grants no delete of ConfigMaps (before: delete of the one name
    tf-serving-rollout-lock, so with --name-prefix the release got 403 and the next deploy
    was refused until the TTL)."""
    store, address = server
    prefixed = f"/api/v1/namespaces/{NAMESPACE}/configmaps/exp-{STABLE}-rollout-lock"
    with FakeApiServer(forbid={("DELETE", "configmaps")}) as api:
        for version in (1, 2):
            config = _config(api, tmp_path, store, address,
                             export_base / MODEL_NAME / str(version))
            result = run_deploy(dataclasses.replace(config, name_prefix="exp-"))
            assert result.served_version == version
            assert _released(api, prefixed)


def test_a_deploy_past_its_ttl_does_not_release_the_lock_another_took_over(export_base,
                                                                           tmp_path):
    with FakeApiServer() as api:
        config = _config(api, tmp_path, tmp_path / "store", None,
                         export_base / MODEL_NAME / "1")
        late, next_one, third = Cluster(config), Cluster(config), Cluster(config)
        try:
            late.lock_rollout(STABLE, 1, ttl_s=-5)  # outlived its TTL
            next_one.lock_rollout(STABLE, 2, ttl_s=600)  # takes the expired lock over
            late.unlock_rollout()  # before: deleted next_one's lock by name
            assert api.objects[LOCK]["data"]["version"] == "2"
            with pytest.raises(DeployError, match=r"another deploy .* \(version 2"):
                third.lock_rollout(STABLE, 3, ttl_s=600)
            next_one.unlock_rollout()
            assert _released(api)
            third.lock_rollout(STABLE, 3, ttl_s=600)
        finally:
            for cluster in (late, next_one, third):
                cluster.close()
