"""`ampflow submit` checks what a run needs before it sends anything (pipeline/preflight.py).

No KFP backend and no Kubernetes API server run here: one loopback fake answers the KFP
healthz (`tag_name`, `multi_user`, as backend/src/apiserver/main.go@2.17.0 L465-490 writes
it) and the few Kubernetes reads the checks make, over real HTTP with the real `kubernetes`
client. It is neither KFP nor Kubernetes: each test says what exists and who may do what.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from ampflow.errors import PipelineError
from ampflow.files import yaml_documents
from ampflow.pipeline import preflight
from ampflow.pipeline import submit as submit_module
from ampflow.pipeline.submit import SubmitConfig, SubmitResult, submit

IMAGE = "registry.example/ampflow:1.2.3"
RUNNER = "system:serviceaccount:kubeflow:pipeline-runner"
KSERVE_SERVED = {"serving.kserve.io/v1beta1": ["inferenceservices", "inferenceservices/status"],
                 "serving.kserve.io/v1alpha1": ["servingruntimes", "inferencegraphs"]}


class FakeCluster:
    """KFP healthz + namespaces, claims, storage classes, API discovery and
    SelfSubjectAccessReviews."""

    def __init__(self, tag="2.17.0", multi_user=False, namespaces=("kubeflow",), claims=(),
                 allowed=None, default_class=None, impersonation=True, read_namespaces=True,
                 served=None):
        self.tag, self.multi_user = tag, multi_user
        self.namespaces, self.claims = set(namespaces), set(claims)  # claims: (ns, name)
        self.allowed = allowed  # None: everything; else {(user, ns, verb, resource)}
        self.default_class, self.impersonation = default_class, impersonation
        self.read_namespaces = read_namespaces  # False: GET namespace is 403 (a profile user)
        # discovery: {"group/version": [resource names]}; None: KServe's two kinds are served;
        # "forbidden": GET /apis/<group>/<version> is 403
        self.served = KSERVE_SERVED if served is None else served
        self.requests: list[tuple[str, str]] = []
        self.reviews: list[tuple[str, dict]] = []
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _missing(self):
                return self._send(404, {"kind": "Status", "apiVersion": "v1", "code": 404,
                                        "reason": "NotFound", "status": "Failure"})

            def do_GET(self):  # noqa: N802
                cluster.requests.append(("GET", self.path))
                parts = self.path.split("?")[0].strip("/").split("/")
                if self.path.startswith("/apis/v2beta1/healthz"):
                    return self._send(200, {"commit_sha": "x", "tag_name": cluster.tag,
                                            "multi_user": cluster.multi_user})
                if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4:
                    if not cluster.read_namespaces:
                        return self._send(403, {"kind": "Status", "apiVersion": "v1",
                                                "code": 403, "reason": "Forbidden"})
                    if parts[3] in cluster.namespaces:
                        return self._send(200, {"kind": "Namespace", "apiVersion": "v1",
                                                "metadata": {"name": parts[3]}})
                    return self._missing()
                if len(parts) == 6 and parts[4] == "persistentvolumeclaims":
                    if (parts[3], parts[5]) in cluster.claims:
                        return self._send(200, {"kind": "PersistentVolumeClaim",
                                                "apiVersion": "v1",
                                                "metadata": {"name": parts[5]}})
                    return self._missing()
                if len(parts) == 3 and parts[0] == "apis" and cluster.served == "forbidden":
                    return self._send(403, {"kind": "Status", "apiVersion": "v1",
                                            "code": 403, "reason": "Forbidden"})
                if len(parts) == 3 and parts[0] == "apis" and f"{parts[1]}/{parts[2]}" in (
                        cluster.served):
                    return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                            "groupVersion": f"{parts[1]}/{parts[2]}",
                                            "resources": [{"name": n, "namespaced": True}
                                                          for n in cluster.served[
                                                              f"{parts[1]}/{parts[2]}"]]})
                if self.path.startswith("/apis/storage.k8s.io/v1/storageclasses"):
                    items = [{"metadata": {"name": "slow"}, "provisioner": "p"}]
                    if cluster.default_class:
                        items.append({"metadata": {"name": cluster.default_class, "annotations": {
                            preflight.DEFAULT_CLASS_ANNOTATION: "true"}}, "provisioner": "p"})
                    return self._send(200, {"kind": "StorageClassList", "apiVersion": "v1",
                                            "metadata": {}, "items": items})
                return self._missing()

            def do_POST(self):  # noqa: N802
                cluster.requests.append(("POST", self.path))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/selfsubjectaccessreviews"):
                    user = self.headers.get("Impersonate-User")
                    if not cluster.impersonation:
                        return self._send(403, {"kind": "Status", "apiVersion": "v1",
                                                "code": 403, "reason": "Forbidden"})
                    attributes = body["spec"]["resourceAttributes"]
                    cluster.reviews.append((user, attributes))
                    allowed = cluster.allowed is None or (
                        user, attributes["namespace"], attributes["verb"],
                        attributes["resource"]) in cluster.allowed
                    body["status"] = {"allowed": allowed}
                    return self._send(201, body)
                return self._missing()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def kubeconfig(self, path):
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: u}}]\n")
        return str(path)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    clusters = []

    def make(**kwargs):
        clusters.append(FakeCluster(**kwargs))
        return clusters[-1]

    yield make
    for cluster in clusters:
        cluster.close()


@pytest.fixture
def sent(monkeypatch):
    """What would have been sent to KFP: the compiled package's documents and the arguments."""
    runs = []

    def create(config, package, arguments):
        runs.append((yaml_documents(open(package)), arguments))
        return SubmitResult(run_id="run-1", url=f"{config.host}/#/runs/details/run-1")

    monkeypatch.setattr(submit_module, "_create_run", create)
    return runs


def _config(cluster, tmp_path, **kwargs):
    return SubmitConfig(host=cluster.url, image=IMAGE, connect_timeout_s=30,
                        kubeconfig=cluster.kubeconfig(tmp_path / "kubeconfig"), **kwargs)


def test_submit_missing_claims_and_rbac_are_one_line_each_and_nothing_is_sent(fake, tmp_path,
                                                                             sent):
    cluster = fake(allowed=set())
    with pytest.raises(PipelineError) as raised:
        submit(_config(cluster, tmp_path, train_workers=2),
               {"serving_target": "kubernetes"})
    lines = str(raised.value).splitlines()
    assert lines[0].startswith(f"not submitted: the run would fail on {cluster.url} "
                               "(KFP 2.17.0, namespace kubeflow)")
    assert lines[1:] == [
        "  - claim ampflow-training does not exist in namespace kubeflow (a pod that mounts it "
        "would stay Pending): kubectl apply -n kubeflow -k k8s/training/common",
        "  - claim tf-serving-models does not exist in namespace kubeflow (a pod that mounts it "
        "would stay Pending): kubectl apply -n kubeflow -k k8s/model-store",
        "  - kubeflow:pipeline-runner (the service account the run's pods use) may not create "
        "tfjobs.kubeflow.org, get tfjobs.kubeflow.org, delete tfjobs.kubeflow.org, get pods in "
        "namespace kubeflow: kubectl apply -n kubeflow -k k8s/training/rbac",
        "  - kubeflow:pipeline-runner (the service account the run's pods use) may not patch "
        "deployments.apps, create deployments.apps, watch deployments.apps, patch configmaps, "
        "patch services, patch networkpolicies.networking.k8s.io in namespace kubeflow: "
        "kubectl apply -k k8s/rbac-kubeflow",
    ]
    assert {user for user, _ in cluster.reviews} == {RUNNER}  # as the runner, not as us
    assert sent == []


def test_submit_with_everything_in_place_sends_the_run(fake, tmp_path, sent):
    cluster = fake(claims={("kubeflow", "ampflow-training"), ("kubeflow", "tf-serving-models")})
    result = submit(_config(cluster, tmp_path, train_workers=2),
                    {"serving_target": "kubernetes"})
    assert result.run_id == "run-1"
    (docs, arguments), = sent
    assert arguments == {"serving_target": "kubernetes"}
    assert docs[1]["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["kubernetes"][
        "pvcSpecPatch"] == {"accessModes": ["ReadWriteOnce"]}  # 2.17: the default class


def test_submit_the_default_run_needs_no_claim_and_no_role(fake, tmp_path, sent, caplog):
    cluster = fake(allowed=set())  # nothing granted, nothing created: the default run needs none
    with caplog.at_level(logging.WARNING):
        submit(_config(cluster, tmp_path))
    assert len(sent) == 1 and cluster.reviews == []
    # but without k8s/pipeline's budget a drain would delete a train pod: said, not refused
    assert "no PodDisruptionBudget ampflow-train in namespace kubeflow" in caplog.text


@pytest.mark.parametrize("tag", ["2.15.0", "2.16.1"])
def test_submit_to_215_216_names_the_clusters_default_storage_class(fake, tmp_path, sent, tag):
    """2.15/2.16 refuse a workspace PVC without storageClassName (argo.go); a stock API server
    has no default spec to take it from."""
    cluster = fake(tag=tag, default_class="standard-rwo")
    submit(_config(cluster, tmp_path))
    (docs, _), = sent
    assert docs[1]["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["kubernetes"][
        "pvcSpecPatch"] == {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard-rwo"}


def test_submit_to_216_without_a_default_class_says_what_to_pass(fake, tmp_path, sent):
    cluster = fake(tag="2.16.0")
    with pytest.raises(PipelineError, match=r"KFP 2.16.0 refuses a workspace PVC without "
                                            r"storageClassName .* pass --workspace-storage-class"):
        submit(_config(cluster, tmp_path))
    assert sent == []


def test_submit_multi_user_needs_a_namespace_and_checks_the_profiles_runner(fake, tmp_path,
                                                                           sent):
    cluster = fake(multi_user=True, namespaces={"team-a"}, allowed=set())
    with pytest.raises(PipelineError, match="multi-user install: pass --namespace"):
        submit(_config(cluster, tmp_path))
    with pytest.raises(PipelineError) as raised:
        submit(_config(cluster, tmp_path, namespace="team-a"), {"serving_target": "kubernetes"})
    text = str(raised.value)
    assert "claim tf-serving-models does not exist in namespace team-a" in text
    assert ("team-a:default-editor (the service account the run's pods use) may not patch "
            "deployments.apps") in text
    assert ("kubectl kustomize k8s/rbac | sed 's/namespace: ampflow$/namespace: team-a/' | "
            "kubectl apply -f - and kubectl -n team-a create rolebinding ampflow-deployer-kfp "
            "--role=ampflow-deployer --serviceaccount=team-a:default-editor") in text
    assert {user for user, _ in cluster.reviews} == {"system:serviceaccount:team-a:default-editor"}
    assert sent == []


def test_submit_to_a_namespace_that_does_not_exist_is_one_line(fake, tmp_path, sent):
    cluster = fake(multi_user=True, namespaces=set())
    with pytest.raises(PipelineError, match=r"namespace team-b does not exist: pass --namespace"):
        submit(_config(cluster, tmp_path, namespace="team-b"))


def test_submit_when_it_may_not_impersonate_the_runner_logs_and_sends(fake, tmp_path, sent,
                                                                     caplog):
    cluster = fake(claims={("kubeflow", "ampflow-training")}, impersonation=False)
    with caplog.at_level(logging.WARNING):
        submit(_config(cluster, tmp_path, train_workers=2))
    assert len(sent) == 1
    assert f"RBAC of {RUNNER} not checked: you may not impersonate it" in caplog.text


def test_submit_serving_elsewhere_needs_an_object_store(fake, tmp_path, sent):
    cluster = fake()
    with pytest.raises(PipelineError, match=r"serving_model_store='/models' is a directory, but "
                                            r"the deploy task mounts no model-store claim"):
        submit(_config(cluster, tmp_path, serving_namespace="ampflow"),
               {"serving_target": "kubernetes"})
    submit(_config(cluster, tmp_path, serving_namespace="ampflow"),
           {"serving_target": "kubernetes", "serving_model_store": "gs://bucket/models"})
    assert {a["namespace"] for _, a in cluster.reviews} == {"ampflow"}  # the Role is there
    assert len(sent) == 1


def test_submit_without_a_kubeconfig_says_the_cluster_was_not_checked(fake, tmp_path, sent,
                                                                     monkeypatch, caplog):
    cluster = fake()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with caplog.at_level(logging.WARNING):
        submit(SubmitConfig(host=cluster.url, image=IMAGE, connect_timeout_s=30,
                            train_workers=2))
    assert "were not checked" in caplog.text and len(sent) == 1


def test_submit_by_a_user_who_may_not_read_namespaces_still_checks_the_claims(fake, tmp_path,
                                                                             sent, caplog):
    cluster = fake(multi_user=True, namespaces={"team-a"}, read_namespaces=False)
    with caplog.at_level(logging.WARNING), pytest.raises(
            PipelineError, match="claim ampflow-training does not exist in namespace team-a"):
        submit(_config(cluster, tmp_path, namespace="team-a", train_workers=2))
    assert "namespace team-a not checked: you may not read it (HTTP 403)" in caplog.text


# ---- serving_target=kserve ---------------------------------------------------------------


def _kserve_role_grants() -> set[tuple[str, str, str]]:
    """(group, resource, verb) the Role of `kubectl kustomize k8s/kserve/rbac` grants."""
    import subprocess

    from ampflow.components.deploy_serving.kubernetes_render import kubectl_path
    from ampflow.files import k8s_manifests_dir

    rendered = subprocess.run([kubectl_path(), "kustomize", str(k8s_manifests_dir() / "kserve"
                                                                 / "rbac")],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    (role,) = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] == "Role"]
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_submit_kserve_without_claim_role_or_kserve_is_one_line_each_and_nothing_is_sent(
        fake, tmp_path, sent):
    cluster = fake(allowed=set(), served={})
    with pytest.raises(PipelineError) as raised:
        submit(_config(cluster, tmp_path), {"serving_target": "kserve"})
    assert str(raised.value).splitlines()[1:] == [
        "  - claim tf-serving-models does not exist in namespace kubeflow (a pod that mounts it "
        "would stay Pending): kubectl apply -n kubeflow -k k8s/model-store",
        "  - the API server does not serve inferenceservices (serving.kserve.io/v1beta1): install "
        "KServe in the cluster, whose CRDs define InferenceService (docs/how-to/kserve.md)",
        "  - the API server does not serve servingruntimes (serving.kserve.io/v1alpha1): install "
        "KServe in the cluster, whose CRDs define ServingRuntime (docs/how-to/kserve.md)",
        "  - kubeflow:pipeline-runner (the service account the run's pods use) may not get "
        "inferenceservices.serving.kserve.io, create inferenceservices.serving.kserve.io, patch "
        "inferenceservices.serving.kserve.io, create servingruntimes.serving.kserve.io, patch "
        "servingruntimes.serving.kserve.io, get configmaps, create configmaps, patch configmaps "
        "in namespace kubeflow: "
        "kubectl apply -n kubeflow -k k8s/kserve/rbac",
    ]
    assert sent == []


def test_submit_kserve_checks_exactly_what_k8s_kserve_rbac_grants_and_sends(fake, tmp_path,
                                                                            sent):
    """The runner is asked for each grant of the Role (which tests/components/deploy_serving
    ties to the requests a kserve deploy makes), as itself, in the serving namespace; none of
    the kubernetes target's permissions are asked for."""
    cluster = fake(claims={("kubeflow", "tf-serving-models")})
    submit(_config(cluster, tmp_path), {"serving_target": "kserve"})
    assert len(sent) == 1
    asked = {(a["group"], a["resource"], a["verb"]) for _, a in cluster.reviews}
    assert asked == _kserve_role_grants() == {
        ("serving.kserve.io", "inferenceservices", verb) for verb in ("get", "create", "patch")
    } | {("serving.kserve.io", "servingruntimes", verb) for verb in ("create", "patch")
         } | {("", "configmaps", verb) for verb in ("get", "create", "patch")}  # rollout lock
    assert {(user, a["namespace"]) for user, a in cluster.reviews} == {(RUNNER, "kubeflow")}
    assert ("GET", "/apis/serving.kserve.io/v1beta1") in cluster.requests
    assert ("GET", "/apis/serving.kserve.io/v1alpha1") in cluster.requests


@pytest.mark.parametrize("discovery, missing", [
    ({"serving.kserve.io/v1beta1": ["inferenceservices"]}, "servingruntimes"),  # no v1alpha1
    ({"serving.kserve.io/v1beta1": ["inferenceservices"],
      "serving.kserve.io/v1alpha1": ["inferencegraphs"]}, "servingruntimes"),  # kind not listed
    ({"serving.kserve.io/v1alpha1": ["servingruntimes"]}, "inferenceservices"),
])
def test_submit_kserve_names_the_one_kind_the_api_server_does_not_serve(fake, tmp_path, sent,
                                                                         discovery, missing):
    cluster = fake(claims={("kubeflow", "tf-serving-models")}, served=discovery)
    with pytest.raises(PipelineError) as raised:
        submit(_config(cluster, tmp_path), {"serving_target": "kserve"})
    (line,) = str(raised.value).splitlines()[1:]
    assert line.startswith(f"  - the API server does not serve {missing} (serving.kserve.io/")
    assert "install KServe" in line and sent == []


def test_submit_kserve_multi_user_says_how_to_bind_the_role_to_the_profiles_runner(
        fake, tmp_path, sent):
    cluster = fake(multi_user=True, namespaces={"team-a"}, claims={("team-a", "tf-serving-models")},
                   allowed=set())
    with pytest.raises(PipelineError) as raised:
        submit(_config(cluster, tmp_path, namespace="team-a"), {"serving_target": "kserve"})
    (line,) = str(raised.value).splitlines()[1:]
    assert line.startswith("  - team-a:default-editor (the service account the run's pods use) "
                           "may not get inferenceservices.serving.kserve.io")
    assert line.endswith("in namespace team-a: kubectl apply -n team-a -k k8s/kserve/rbac and "
                         "kubectl -n team-a create rolebinding ampflow-kserve-deployer-kfp "
                         "--role=ampflow-kserve-deployer --serviceaccount=team-a:default-editor")


def test_submit_kserve_in_another_namespace_needs_an_object_store_and_its_role_there(
        fake, tmp_path, sent):
    cluster = fake(namespaces={"kubeflow", "serving"})
    with pytest.raises(PipelineError, match=r"serving_model_store='/models' is a directory, but "
                                            r"the deploy task mounts no model-store claim"):
        submit(_config(cluster, tmp_path, serving_namespace="serving"),
               {"serving_target": "kserve"})
    submit(_config(cluster, tmp_path, serving_namespace="serving"),
           {"serving_target": "kserve", "serving_model_store": "gs://bucket/models"})
    assert {a["namespace"] for _, a in cluster.reviews} == {"serving"}
    assert len(sent) == 1


def test_submit_kserve_without_the_rbac_manifest_is_one_config_line(fake, tmp_path, sent,
                                                                    monkeypatch):
    from ampflow.errors import ConfigError

    cluster = fake(claims={("kubeflow", "tf-serving-models")})
    monkeypatch.setenv("AMPFLOW_K8S_DIR", str(tmp_path / "no-k8s"))
    with pytest.raises(ConfigError, match=r"must hold kserve/rbac/rbac.yaml with Role "
                                          r"ampflow-kserve-deployer\. Received: "):
        submit(_config(cluster, tmp_path), {"serving_target": "kserve"})
    assert sent == []


def test_submit_kserve_by_a_user_who_may_not_read_discovery_logs_and_sends(fake, tmp_path, sent,
                                                                           caplog):
    cluster = fake(claims={("kubeflow", "tf-serving-models")}, served="forbidden")
    with caplog.at_level(logging.WARNING):
        submit(_config(cluster, tmp_path), {"serving_target": "kserve"})
    assert len(sent) == 1
    assert ("the API server's serving.kserve.io/v1beta1 kinds not checked: you may not read "
            "them (HTTP 403)") in caplog.text
