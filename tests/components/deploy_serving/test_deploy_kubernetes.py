"""`deploy --target kubernetes`: fails fast and changes nothing without a cluster; renders."""

from __future__ import annotations

import time

import pytest

from ampflow.cli import main
from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.components.deploy_serving import kubernetes_target as kt
from ampflow.errors import DeployError

MODEL_NAME = "digits"  # as in conftest.py


def _config(export_base, store, **kwargs):
    return DeployConfig(
        saved_model_dir=export_base / MODEL_NAME / "2",
        target="kubernetes",
        model_store=str(store),
        **kwargs,
    )


def test_unreachable_api_server_fails_fast_and_changes_nothing(
    export_base, tmp_path, dead_kubeconfig
):
    kubeconfig, server = dead_kubeconfig
    store = tmp_path / "store"
    start = time.monotonic()
    with pytest.raises(DeployError) as info:
        run_deploy(_config(export_base, store, kubeconfig=kubeconfig, connect_timeout_s=2))
    # "fails fast" means the connect timeout, not the minutes of a TCP timeout; the margin
    # covers importing the kubernetes client on a loaded 2-core machine
    assert time.monotonic() - start < 30
    message = str(info.value)
    assert f"cannot reach the Kubernetes API server at {server}" in message
    assert "--kubeconfig" in message and "--context" in message
    assert "Nothing was changed" in message
    assert not store.exists()


def test_no_kube_configuration_at_all_fails_with_how_to(export_base, tmp_path, no_kube_env):
    store = tmp_path / "store"
    with pytest.raises(DeployError, match=r"no Kubernetes configuration found.*--kubeconfig"):
        run_deploy(_config(export_base, store))
    assert not store.exists()


def test_unknown_context_names_the_file(export_base, tmp_path, dead_kubeconfig):
    kubeconfig, _ = dead_kubeconfig
    with pytest.raises(
        DeployError, match=r"cannot load Kubernetes configuration from .*kubeconfig"
    ):
        run_deploy(_config(export_base, tmp_path / "s", kubeconfig=kubeconfig, context="nope"))


def test_cli_unreachable_prints_one_line_and_exits_1(
    export_base, tmp_path, dead_kubeconfig, capsys
):
    kubeconfig, server = dead_kubeconfig
    code = main(
        [
            "deploy",
            "--target",
            "kubernetes",
            "--saved-model-dir",
            str(export_base / MODEL_NAME / "2"),
            "--model-store",
            str(tmp_path / "store"),
            "--kubeconfig",
            str(kubeconfig),
            "--connect-timeout-s",
            "2",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("ampflow deploy: error: cannot reach the Kubernetes API server")
    assert server in err[-1] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "store").exists()


@pytest.mark.k8s
def test_render_pins_version_namespace_prefix_and_volume(export_base, tmp_path):
    config = _config(
        export_base,
        tmp_path,
        namespace="team-a",
        name_prefix="exp1-",
        image="registry.local/serving:2.20.0",
    )
    objects = kt.render(config, MODEL_NAME, 2)
    assert {o["metadata"]["namespace"] for o in objects} == {"team-a"}
    assert all(o["metadata"]["name"].startswith("exp1-") for o in objects)
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    models = config_map["data"]["models.config"]
    assert f'base_path: "/models/{MODEL_NAME}"' in models
    assert "specific { versions: 2 }" in models
    assert "max_batch_size" in config_map["data"]["batching.config"]  # merged, not replaced
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["metadata"]["annotations"][kt.VERSION_ANNOTATION] == "2"
    spec = deployment["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"] == "registry.local/serving:2.20.0"
    assert spec["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    assert kt._service_address(config, objects) == "exp1-tf-serving.team-a.svc:8500"


@pytest.mark.k8s
def test_render_new_version_changes_config_map_name(export_base, tmp_path):
    config = _config(export_base, tmp_path)
    names = {
        v: next(o for o in kt.render(config, MODEL_NAME, v) if o["kind"] == "ConfigMap")[
            "metadata"
        ]["name"]
        for v in (1, 2, 1)
    }
    assert names[1] != names[2]  # a new version rolls the Deployment; v1 again = same as before


@pytest.mark.k8s
def test_render_object_store_drops_pvc_and_uses_uri(export_base):
    config = _config(export_base, "gs://bucket/models")
    objects = kt.render(config, MODEL_NAME, 2)
    assert "PersistentVolumeClaim" not in {o["kind"] for o in objects}
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    assert f'base_path: "gs://bucket/models/{MODEL_NAME}"' in config_map["data"]["models.config"]
    volumes = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"][
        "volumes"
    ]
    assert all("persistentVolumeClaim" not in v for v in volumes)


def _deployment(generation=2, observed=2, want=2, replicas=2, updated=2, available=2, cond=None):
    return _Obj(
        metadata=_Obj(generation=generation),
        spec=_Obj(replicas=want),
        status=_Obj(
            observed_generation=observed,
            replicas=replicas,
            updated_replicas=updated,
            available_replicas=available,
            conditions=cond or [],
        ),
    )


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    "kwargs, done, why",
    [
        ({}, True, "complete"),
        ({"observed": 1}, False, "has not seen"),
        ({"updated": 1}, False, "1/2 replicas updated"),
        ({"replicas": 3}, False, "1 old replicas"),
        ({"available": 1}, False, "1/2 updated replicas available"),
        (
            {"cond": [_Obj(type="Progressing", reason="ProgressDeadlineExceeded", message="m")]},
            False,
            "ProgressDeadlineExceeded",
        ),
    ],
)
def test_rollout_state_reads_deployment_status(kwargs, done, why):
    state = kt.rollout_state(_deployment(**kwargs))
    assert state[0] is done and why in state[1]


class _FakeCluster:
    """Stands in for the API server at the module's boundary (connect/apply/read/wait)."""

    def __init__(self, live=None, rollout_ok=True):
        self.live, self.rollout_ok = live, rollout_ok
        self.applied: list[list[dict]] = []

    def install(self, monkeypatch):
        monkeypatch.setattr(kt, "connect", lambda config: (object(), "https://fake:6443"))
        monkeypatch.setattr(kt, "check_reachable", lambda *a: None)
        monkeypatch.setattr(kt, "live_version", lambda *a: self.live)
        monkeypatch.setattr(kt, "apply", lambda client, objects, ns: self.applied.append(objects))
        monkeypatch.setattr(kt, "wait_rollout", self._wait)

    def _wait(self, *args):
        if not self.rollout_ok and len(self.applied) == 1:
            raise DeployError("rollout of Deployment ampflow/tf-serving did not complete")

    def pinned_versions(self) -> list[str]:
        return [
            next(o for o in objs if o["kind"] == "Deployment")["metadata"]["annotations"][
                kt.VERSION_ANNOTATION
            ]
            for objs in self.applied
        ]


@pytest.mark.k8s
def test_failed_rollout_re_applies_previous_version(export_base, tmp_path, monkeypatch):
    cluster = _FakeCluster(live=(MODEL_NAME, 1), rollout_ok=False)
    cluster.install(monkeypatch)
    with pytest.raises(DeployError, match=r"did not complete; rolled back: version 1 is serving"):
        run_deploy(_config(export_base, tmp_path))
    assert cluster.pinned_versions() == ["2", "1"]
    assert (tmp_path / MODEL_NAME / "2" / "saved_model.pb").is_file()  # pushed before apply


@pytest.mark.k8s
def test_canary_failure_re_applies_previous_version(export_base, tmp_path, monkeypatch):
    from ampflow.components.deploy_serving import canary

    cluster = _FakeCluster(live=(MODEL_NAME, 1))
    cluster.install(monkeypatch)

    def _bad_canary(address, *args, **kwargs):
        raise DeployError(f"canary Predict at {address} failed: INTERNAL")

    monkeypatch.setattr(canary, "check_version_served", _bad_canary)
    with pytest.raises(DeployError, match=r"tf-serving.ampflow.svc:8500 failed.*rolled back"):
        run_deploy(_config(export_base, tmp_path))
    assert cluster.pinned_versions() == ["2", "1"]


@pytest.mark.k8s
def test_successful_deploy_reports_endpoint_and_served_version(export_base, tmp_path, monkeypatch):
    from ampflow.components.deploy_serving import canary

    cluster = _FakeCluster(live=None)
    cluster.install(monkeypatch)
    monkeypatch.setattr(canary, "check_version_served", lambda a, n, v, s, **k: v)
    result = run_deploy(_config(export_base, tmp_path, namespace="prod"))
    assert (result.endpoint, result.served_version, result.previous_version) == (
        "tf-serving.prod.svc:8500",
        2,
        None,
    )
    assert cluster.pinned_versions() == ["2"]


def test_api_server_that_never_answers_times_out_in_connect_timeout(export_base, tmp_path):
    import socket

    with socket.socket() as silent:  # accepts TCP connections, never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        server = f"https://127.0.0.1:{silent.getsockname()[1]}"
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        )
        start = time.monotonic()
        with pytest.raises(DeployError, match=r"cannot reach .* within 1s"):
            run_deploy(
                _config(export_base, tmp_path / "s", kubeconfig=kubeconfig, connect_timeout_s=1)
            )
        assert time.monotonic() - start < 30  # the 1 s timeout held (margin: a loaded machine)
    assert not (tmp_path / "s").exists()


@pytest.mark.k8s
@pytest.mark.parametrize("store", ["pvc", "gs://bucket/models"])
def test_deploy_render_validates_strict(export_base, tmp_path, store):
    import kubernetes_validate

    config = _config(
        export_base,
        tmp_path if store == "pvc" else store,
        overlay="gpu",
        name_prefix="exp1-",
        namespace="team-a",
    )
    for obj in kt.render(config, MODEL_NAME, 2):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


@pytest.mark.k8s
def test_render_missing_manifests_dir_raises_config_error(export_base, tmp_path, monkeypatch):
    from ampflow.errors import ConfigError

    monkeypatch.setenv("AMPFLOW_K8S_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"AMPFLOW_K8S_DIR.*Received: manifests_dir=.*nowhere"):
        kt.render(_config(export_base, tmp_path), MODEL_NAME, 2)
