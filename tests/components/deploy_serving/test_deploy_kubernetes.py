"""`deploy --target kubernetes`: fails fast and changes nothing without a cluster; renders the
release, its canary and the release record (the flows on the wire: test_deploy_kubernetes_wire)."""

from __future__ import annotations

import time

import pytest
from deploy_helpers import MODEL_NAME

from ampflow.cli import main
from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.components.deploy_serving import kubernetes_render as kr
from ampflow.errors import DeployError


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
    objects = kr.render(config, MODEL_NAME, 2)
    assert {o["metadata"]["namespace"] for o in objects} == {"team-a"}
    assert all(o["metadata"]["name"].startswith("exp1-") for o in objects)
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    models = config_map["data"]["models.config"]
    assert f'base_path: "/models/{MODEL_NAME}"' in models
    assert "specific { versions: 2 }" in models
    assert "max_batch_size" in config_map["data"]["batching.config"]  # merged, not replaced
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["metadata"]["annotations"][kr.VERSION_ANNOTATION] == "2"
    spec = deployment["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"] == "registry.local/serving:2.20.0"
    assert spec["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    assert kr.service_address(objects, "team-a") == "exp1-tf-serving.team-a.svc:8500"


@pytest.mark.k8s
def test_render_new_version_changes_config_map_name(export_base, tmp_path):
    config = _config(export_base, tmp_path)
    names = {
        v: next(o for o in kr.render(config, MODEL_NAME, v) if o["kind"] == "ConfigMap")[
            "metadata"
        ]["name"]
        for v in (1, 2, 1)
    }
    assert names[1] != names[2]  # a new version rolls the Deployment; v1 again = same as before


@pytest.mark.k8s
def test_render_object_store_drops_pvc_and_uses_uri(export_base):
    config = _config(export_base, "gs://bucket/models")
    objects = kr.render(config, MODEL_NAME, 2)
    assert "PersistentVolumeClaim" not in {o["kind"] for o in objects}
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    assert f'base_path: "gs://bucket/models/{MODEL_NAME}"' in config_map["data"]["models.config"]
    volumes = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"][
        "volumes"
    ]
    assert all("persistentVolumeClaim" not in v for v in volumes)


@pytest.mark.k8s
def test_canary_objects_are_a_second_track_of_the_same_release(export_base, tmp_path):
    import kubernetes_validate

    config = _config(export_base, tmp_path, namespace="team-a", name_prefix="exp1-")
    release = kr.render(config, MODEL_NAME, 2)
    config_map, canary, service = kr.canary_objects(release, replicas=2)
    stable = kr.one(release, "Deployment")
    assert config_map is kr.one(release, "ConfigMap")  # the version-2 pin, hashed name
    assert canary["metadata"]["name"] == "exp1-tf-serving-canary"
    assert canary["spec"]["replicas"] == 2
    # same pod template (image, args, pinned config) apart from the track label
    for d in (stable, canary):
        assert d["metadata"]["annotations"][kr.VERSION_ANNOTATION] == "2"
    pod = dict(canary["spec"]["template"]["spec"])
    assert pod == stable["spec"]["template"]["spec"]
    canary_labels = canary["spec"]["template"]["metadata"]["labels"]
    stable_labels = stable["spec"]["template"]["metadata"]["labels"]
    assert (canary_labels[kr.TRACK_LABEL], stable_labels[kr.TRACK_LABEL]) == ("canary", "stable")
    # the selectors of the two Deployments never overlap; the main Service selects both
    stable_selector = stable["spec"]["selector"]["matchLabels"]
    canary_selector = canary["spec"]["selector"]["matchLabels"]
    assert not stable_selector.items() <= canary_labels.items()
    assert not canary_selector.items() <= stable_labels.items()
    main_selector = kr.one(release, "Service")["spec"]["selector"]
    assert main_selector.items() <= canary_labels.items()
    assert main_selector.items() <= stable_labels.items()
    # the canary Service reaches only canary pods
    assert service["metadata"]["name"] == "exp1-tf-serving-canary"
    assert service["spec"]["selector"].items() <= canary_labels.items()
    assert not service["spec"]["selector"].items() <= stable_labels.items()
    for obj in (canary, service):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


@pytest.mark.k8s
def test_release_record_round_trips_the_exact_render(export_base, tmp_path):
    config = _config(export_base, tmp_path, namespace="team-a")
    release = kr.render(config, MODEL_NAME, 2)
    record = kr.release_record(release, MODEL_NAME, 2, "team-a")
    assert record["metadata"]["name"] == kr.record_name(release) == "tf-serving-release"
    objects, version = kr.parse_record(record)
    assert (objects, version) == (release, 2)
    assert kr.parse_record(None) is None
    broken = {"metadata": {"name": "tf-serving-release"}, "data": {"version": "x"}}
    with pytest.raises(DeployError, match="release record ConfigMap tf-serving-release is "
                                          "unreadable"):
        kr.parse_record(broken)


def test_s3_model_store_is_refused_with_the_reason(export_base):
    from ampflow.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model_store must be a directory or gs://.*"
                                          r"tensorflow/serving#1963"):
        _config(export_base, "s3://bucket/models")


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
    for obj in kr.render(config, MODEL_NAME, 2):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


@pytest.mark.k8s
def test_render_missing_manifests_dir_raises_config_error(export_base, tmp_path, monkeypatch):
    from ampflow.errors import ConfigError

    monkeypatch.setenv("AMPFLOW_K8S_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"AMPFLOW_K8S_DIR.*Received: manifests_dir=.*nowhere"):
        kr.render(_config(export_base, tmp_path), MODEL_NAME, 2)
