"""`deploy --target kserve` on the wire: the fake API server (fake_apiserver.py, `kserve=True`
stands for KServe's CRDs and controller), real kubectl kustomize of k8s/kserve, a real model
store. What is tested is our side: the two server-side applies as the API server receives them,
the canary percent and the pinned version, waiting for Ready for *this* spec, the URL reported,
and the clear errors (no KServe, RBAC, a revision that never gets ready)."""

from __future__ import annotations

import pytest
from deploy_helpers import MODEL_NAME
from fake_apiserver import FakeApiServer

from ampflow.cli import main
from ampflow.components.deploy_serving import DeployConfig, kserve_target, run_deploy
from ampflow.errors import ConfigError, DeployError
from ampflow.serving.testing import ServeProcess

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(120)]

NAMESPACE = "team-a"
ISVC_PATH = f"/apis/serving.kserve.io/v1beta1/namespaces/{NAMESPACE}/inferenceservices/digits"
RUNTIME_PATH = f"/apis/serving.kserve.io/v1alpha1/namespaces/{NAMESPACE}/servingruntimes/ampflow"
NOT_INSTALLED = ("KServe is not installed in the cluster (serving.kserve.io/v1beta1 "
                 "InferenceService not found)")


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    """Re-read the InferenceService every 0.05 s, not a cluster's 2 s: the fake controller
    counts reads (`isvc_lag`), not seconds, so each test waits for the same states."""
    monkeypatch.setattr(kserve_target, "_POLL_S", 0.05)


def _config(api: FakeApiServer, tmp_path, export_base, version: int = 1, **kwargs):
    api.kubeconfig(tmp_path / "kubeconfig")
    return DeployConfig(saved_model_dir=export_base / MODEL_NAME / str(version), target="kserve",
                        model_store=str(tmp_path / "store"), kubeconfig=tmp_path / "kubeconfig",
                        namespace=NAMESPACE, **kwargs)


def _isvc(api: FakeApiServer) -> dict:
    return api.objects[ISVC_PATH]


def test_first_deploy_applies_the_runtime_and_the_inference_service_and_reports_its_url(
        export_base, tmp_path):
    with FakeApiServer(kserve=True) as api:
        result = run_deploy(_config(api, tmp_path, export_base, canary_traffic_percent=10))
        patches = list(api.patches)
    assert [p["path"] for p in patches] == [RUNTIME_PATH, ISVC_PATH]
    for patch in patches:  # server-side apply, as the Deployment target does it
        assert patch["content_type"] == "application/apply-patch+yaml"
        assert patch["query"]["fieldManager"] == ["ampflow-deploy"]
        assert patch["query"]["force"] == ["true"]
    isvc = patches[1]["body"]
    predictor = isvc["spec"]["predictor"]
    assert predictor["canaryTrafficPercent"] == 10
    assert predictor["model"]["runtime"] == "ampflow"
    assert predictor["model"]["storageUri"] == "pvc://tf-serving-models/digits"
    assert predictor["model"]["args"] == ["--model-name=digits", "--version-policy=specific",
                                          "--versions=1"]
    assert isvc["metadata"]["annotations"]["ampflow.dev/model-version"] == "1"
    assert result.endpoint == f"http://digits.{NAMESPACE}.example.com"
    assert (result.target, result.served_version, result.previous_version) == ("kserve", 1, None)
    assert result.canary_share == 1.0 and result.promoted  # nothing before it: all the traffic
    assert (tmp_path / "store" / MODEL_NAME / "1" / "saved_model.pb").is_file()


def test_new_version_is_a_canary_revision_with_the_percent_and_reports_the_previous(
        export_base, tmp_path):
    with FakeApiServer(kserve=True) as api:
        run_deploy(_config(api, tmp_path, export_base, 1))
        result = run_deploy(_config(api, tmp_path, export_base, 2, canary_traffic_percent=25))
        generation = _isvc(api)["metadata"]["generation"]
    assert (result.served_version, result.previous_version) == (2, 1)
    assert result.canary_share == 0.25 and result.promoted is False
    assert generation == 2  # a second spec: a second revision
    assert (tmp_path / "store" / MODEL_NAME / "2" / "saved_model.pb").is_file()


def test_a_ready_condition_left_from_the_previous_spec_is_not_taken_for_the_new_one(
        export_base, tmp_path):
    """Right after the apply, the status still says Ready (for version 1's spec): the step
    waits until the controller has observed the new generation."""
    with FakeApiServer(kserve=True, isvc_lag=2) as api:
        run_deploy(_config(api, tmp_path, export_base, 1))
        result = run_deploy(_config(api, tmp_path, export_base, 2, canary_traffic_percent=25))
    assert result.canary_share == 0.25  # the new revision's share, not the old status's 100 %


def test_name_prefix_and_image_reach_both_objects(export_base, tmp_path):
    with FakeApiServer(kserve=True) as api:
        run_deploy(_config(api, tmp_path, export_base, name_prefix="exp-",
                           image="registry.example/ampflow:9.9"))
        runtime, isvc = (p["body"] for p in api.patches)
    assert runtime["metadata"]["name"] == "exp-ampflow"
    assert runtime["spec"]["containers"][0]["image"] == "registry.example/ampflow:9.9"
    assert isvc["metadata"]["name"] == "exp-digits"
    assert isvc["spec"]["predictor"]["model"]["runtime"] == "exp-ampflow"


def test_cluster_without_kserve_is_one_line_and_nothing_changes(export_base, tmp_path, capsys):
    with FakeApiServer() as api:  # no serving.kserve.io group: the CRDs are not installed
        config = _config(api, tmp_path, export_base)
        with pytest.raises(DeployError) as info:
            run_deploy(config)
        code = main(["deploy", "--target", "kserve", "--saved-model-dir",
                     str(config.saved_model_dir), "--model-store", str(config.model_store),
                     "--kubeconfig", str(config.kubeconfig), "--namespace", NAMESPACE])
        assert api.patches == []
    assert str(info.value).startswith(NOT_INSTALLED)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith(f"ampflow deploy: error: {NOT_INSTALLED}")
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "store").exists()  # the version was not copied either


def test_forbidden_apply_names_the_missing_permission_and_the_fix(export_base, tmp_path):
    with FakeApiServer(kserve=True, forbid={("PATCH", "inferenceservices")}) as api:
        with pytest.raises(DeployError) as info:
            run_deploy(_config(api, tmp_path, export_base))
    message = str(info.value)
    assert message.startswith(f"applying InferenceService {NAMESPACE}/digits failed: 403 "
                              "Forbidden: this identity may not patch "
                              f"inferenceservices.serving.kserve.io in namespace {NAMESPACE}")
    assert f"kubectl apply -n {NAMESPACE} -k k8s/kserve/rbac" in message


def test_forbidden_read_names_the_get_permission(export_base, tmp_path):
    with FakeApiServer(kserve=True, forbid={("GET", "inferenceservices")}) as api:
        with pytest.raises(DeployError, match=r"may not get inferenceservices\.serving\.kserve"):
            run_deploy(_config(api, tmp_path, export_base))
        assert api.patches == []  # read before anything is applied


def test_revision_never_ready_times_out_and_re_applies_the_previous_version(
        export_base, tmp_path):
    with FakeApiServer(kserve=True, isvc_stall={("digits", "2")}) as api:
        run_deploy(_config(api, tmp_path, export_base, 1))
        with pytest.raises(DeployError) as info:
            run_deploy(_config(api, tmp_path, export_base, 2, rollout_timeout_s=1))
        isvc = _isvc(api)
    message = str(info.value)
    assert message.startswith(f"InferenceService {NAMESPACE}/digits was not Ready within 1s: "
                              "RevisionMissing: ")
    assert "rolled back: the spec of version 1 was re-applied" in message
    assert isvc["metadata"]["annotations"]["ampflow.dev/model-version"] == "1"
    assert isvc["spec"]["predictor"]["model"]["args"][-1] == "--versions=1"


def test_first_deploy_never_ready_says_nothing_served_before(export_base, tmp_path):
    with FakeApiServer(kserve=True, isvc_stall={("digits", "1")}) as api:
        with pytest.raises(DeployError, match=r"not Ready within 1s.*this was its first deploy"):
            run_deploy(_config(api, tmp_path, export_base, 1, rollout_timeout_s=1))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"canary_traffic_percent": 101}, r"canary_traffic_percent must be in 0\.\.100"),
    ({"model_name": "my_model"}, r"InferenceService is named <name_prefix><model_name>.*"
                                 r"Received: 'my_model'"),
    ({"name_prefix": "9-"}, r"must start with a lower-case letter.*Received: '9-digits'"),
    ({"model_store_claim": "Models"}, r"model_store_claim must be a PVC name"),
    ({"bfloat16_node_labels": "AVX512BF16"}, r"bfloat16_node_labels must be KEY=VALUE node "
                                             r"labels.*Received: .*'AVX512BF16'"),
    ({"bfloat16_node_labels": "a=true,cpu flags=AMX"}, r"bfloat16_node_labels must be KEY="),
])
def test_kserve_config_refuses_what_kserve_would(export_base, tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", target="kserve",
                     model_store=str(tmp_path), **kwargs)


def test_kserve_target_with_a_bucket_reads_the_bucket(export_base, tmp_path):
    from ampflow.components.deploy_serving import kserve_target

    config = DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", target="kserve",
                          model_store="gs://bucket/models/")
    assert kserve_target.storage_uri(config, "digits") == "gs://bucket/models/digits"


def test_every_request_of_a_deploy_is_granted_by_k8s_kserve_rbac(export_base, tmp_path):
    """The Role in k8s/kserve/rbac grants exactly the API requests a deploy (and its rollback)
    makes: each one is allowed, and nothing is granted that no request uses."""
    import subprocess
    from urllib.parse import urlparse

    import yaml

    from ampflow.components.deploy_serving.kubernetes_render import kubectl_path
    from ampflow.files import k8s_manifests_dir

    with FakeApiServer(kserve=True, isvc_stall={("digits", "2")}) as api:
        run_deploy(_config(api, tmp_path, export_base, 1))
        with pytest.raises(DeployError):
            run_deploy(_config(api, tmp_path, export_base, 2, rollout_timeout_s=2))
        requests = list(api.requests)
    # an apply of a new object creates; POST: the rollout lock's create
    verbs = {"GET": {"get"}, "PATCH": {"patch", "create"}, "POST": {"create"}}
    needed = set()
    for method, url in requests:
        parts = urlparse(url).path.split("/")
        if "namespaces" in parts[:-2]:
            plural = parts[parts.index("namespaces") + 2]
            group = "" if parts[1] == "api" else parts[2]  # /api/v1/...: the core group
            needed |= {(group, plural, verb) for verb in verbs[method]}
    assert ("serving.kserve.io", "inferenceservices", "get") in needed  # the Ready wait
    assert ("", "configmaps", "get") in needed  # the second deploy read the released lock
    rendered = subprocess.run([kubectl_path(), "kustomize", str(k8s_manifests_dir() / "kserve"
                                                                 / "rbac")],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    (role,) = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] == "Role"]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert needed == granted


@pytest.fixture
def predictor(tmp_path):
    """(model store, gRPC address): `ampflow serve` over the store, as a predictor pod serves
    the version its args pin (here every version, so the check's exact-version ask decides)."""
    store = tmp_path / "store"
    (store / MODEL_NAME).mkdir(parents=True)
    with ServeProcess(MODEL_NAME, store / MODEL_NAME, tmp_path / "predictor.log",
                      "--version-policy", "all", "--wait-for-base-path",  # empty until a deploy
                      "--file-system-poll-wait-seconds", "0.5") as served:
        yield store, served.address


@pytest.mark.slow
@pytest.mark.serving
def test_with_a_server_address_the_new_version_must_give_the_recorded_answers(
        export_base, tmp_path, predictor):
    store, address = predictor
    with FakeApiServer(kserve=True) as api:
        result = run_deploy(_config(api, tmp_path, export_base, 1, server_address=address,
                                    canary_timeout_s=60))
    assert result.served_version == 1  # the version the server's Predict answer names
    assert (store / MODEL_NAME / "1" / "saved_model.pb").is_file()


@pytest.mark.slow
@pytest.mark.serving
def test_wrong_answers_re_apply_the_previous_version(export_base, tmp_path, predictor):
    import shutil

    import numpy as np

    store, address = predictor
    wrong = tmp_path / "x" / MODEL_NAME / "2"  # version 2 whose recorded answers are not its own
    shutil.copytree(export_base / MODEL_NAME / "2", wrong)
    with np.load(wrong / "ampflow_canary.npz") as data:
        arrays = dict(data)
    arrays["class_ids"] = (arrays["class_ids"] + 1) % 10
    arrays["probabilities"] = np.roll(arrays["probabilities"], 1, axis=1)
    with open(wrong / "ampflow_canary.npz", "wb") as f:
        np.savez(f, **arrays)
    with FakeApiServer(kserve=True) as api:
        run_deploy(_config(api, tmp_path, export_base, 1, server_address=address,
                           canary_timeout_s=60))
        api.kubeconfig(tmp_path / "kubeconfig")
        with pytest.raises(DeployError) as info:
            run_deploy(DeployConfig(saved_model_dir=wrong, target="kserve",
                                    model_store=str(store), kubeconfig=tmp_path / "kubeconfig",
                                    namespace=NAMESPACE, server_address=address,
                                    canary_timeout_s=60))
        isvc = _isvc(api)
    message = str(info.value)
    assert "does not give the recorded answers on 6 real examples" in message
    assert "rolled back: the spec of version 1 was re-applied" in message
    assert isvc["metadata"]["annotations"]["ampflow.dev/model-version"] == "1"


def test_kfp_component_deploys_to_kserve_and_records_the_url(export_base, tmp_path, monkeypatch):
    """The KFP component (called as the local runner calls it) with target="kserve"."""
    import json
    import shutil

    from kfp import dsl

    from ampflow.components.deploy_serving.component import deploy_serving

    artifact = tmp_path / "exported"
    shutil.copytree(export_base / MODEL_NAME / "1", artifact / MODEL_NAME / "1")
    with FakeApiServer(kserve=True) as api:
        api.kubeconfig(tmp_path / "kubeconfig")
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
        endpoint = dsl.Artifact(uri=str(tmp_path / "endpoint"))
        deploy_serving(saved_model=dsl.Model(uri=str(artifact)), endpoint=endpoint,
                       target="kserve", model_store=str(tmp_path / "store"), namespace=NAMESPACE,
                       canary_traffic_percent=30)
        isvc = _isvc(api)
    recorded = json.loads((tmp_path / "endpoint").read_text())
    assert recorded["target"] == "kserve" and recorded["version"] == 1
    assert recorded["endpoint"] == f"http://digits.{NAMESPACE}.example.com"
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 30


def test_component_and_pipeline_defaults_are_the_configs():
    """One home: the component's kserve defaults are DeployConfig's; the pipeline's
    serving_target takes every deploy target."""
    import dataclasses
    import inspect

    from ampflow.components.deploy_serving.component import deploy_serving
    from ampflow.components.deploy_serving.config import TARGETS
    from ampflow.pipeline.parameters import SERVING_TARGETS

    fields = {f.name: f.default for f in dataclasses.fields(DeployConfig)}
    signature = inspect.signature(deploy_serving).parameters
    for name in ("canary_traffic_percent", "model_store_claim", "overlay"):
        assert signature[name].default == fields[name], name
    assert SERVING_TARGETS == ("none", *TARGETS)


def _component_deploy(tmp_path, export_dir, run: str, api: FakeApiServer, monkeypatch) -> dict:
    """One pipeline run's deploy task: its own artifact holding version 1, as export writes it."""
    import json
    import shutil

    from kfp import dsl

    from ampflow.components.deploy_serving.component import deploy_serving

    artifact = tmp_path / run
    shutil.copytree(export_dir, artifact / MODEL_NAME / "1")
    api.kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    deploy_serving(saved_model=dsl.Model(uri=str(artifact)),
                   endpoint=dsl.Artifact(uri=str(tmp_path / f"{run}.json")), target="kserve",
                   model_store=str(tmp_path / "store"), namespace=NAMESPACE)
    return json.loads((tmp_path / f"{run}.json").read_text())


def test_successive_pipeline_runs_deploy_to_kserve_as_versions_1_and_2(
        export_base, tmp_path, monkeypatch):
    """Every run exports version 1 into its own artifact; a mounted store gives the second
    run the next number (before: run 2 pushed to <store>/digits/1, 'already holds a different
    model')."""
    with FakeApiServer(kserve=True) as api:
        first = _component_deploy(tmp_path, export_base / MODEL_NAME / "1", "run1", api,
                                  monkeypatch)
        second = _component_deploy(tmp_path, export_base / MODEL_NAME / "2", "run2", api,
                                   monkeypatch)
        isvc = _isvc(api)
    assert (first["version"], second["version"]) == (1, 2)
    assert isvc["metadata"]["annotations"]["ampflow.dev/model-version"] == "2"
    base = tmp_path / "store" / MODEL_NAME
    from ampflow.components.deploy_serving import model_store
    assert model_store.dir_digest(base / "2") == model_store.dir_digest(export_base / MODEL_NAME
                                                                        / "2")
    assert not list(base.glob(".*.claimed"))


def test_a_deploy_that_fails_before_copying_leaves_no_claim(export_base, tmp_path, monkeypatch):
    """No KServe in the cluster: the deploy fails before push_local; its claimed number is
    given back (before: `.1.claimed` stayed, and every later run skipped that number)."""
    with FakeApiServer() as api:
        with pytest.raises(DeployError):
            _component_deploy(tmp_path, export_base / MODEL_NAME / "1", "run1", api, monkeypatch)
    base = tmp_path / "store" / MODEL_NAME
    assert not list(base.glob(".*.claimed"))
    assert not (base / "1").exists()


def test_a_deploy_while_another_holds_the_inference_service_changes_nothing(export_base,
                                                                            tmp_path):
    """Two KServe deploys at once: the second fails before it reads or applies anything
    (before: both read `before` and applied, and a failing one's restore re-applied its stale
    `before` over the other's good version)."""
    from ampflow.components.deploy_serving.kubernetes_cluster import Cluster

    with FakeApiServer(kserve=True) as api:
        run_deploy(_config(api, tmp_path, export_base, 1))
        applied = len(api.patches)
        other = Cluster(_config(api, tmp_path, export_base, 2))
        try:
            other.lock_rollout("digits", 2, ttl_s=600, kind="InferenceService")
            with pytest.raises(DeployError) as info:
                run_deploy(_config(api, tmp_path, export_base, 2))
            assert len(api.patches) == applied  # nothing applied
            other.unlock_rollout()
        finally:
            other.close()
        result = run_deploy(_config(api, tmp_path, export_base, 2))  # free again
    assert str(info.value).startswith(f"another deploy is rolling out InferenceService "
                                      f"{NAMESPACE}/digits right now (version 2")
    assert "Nothing was changed" in str(info.value)
    assert result.served_version == 2
