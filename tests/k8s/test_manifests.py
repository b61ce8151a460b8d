"""The k8s/ kustomizations: they render, validate against the schemas, and keep our policies.

The policy tests here are the essentials checked without any external tool (so they always
run); test_checkov_* runs the full checkov policy set on top when checkov is installed.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
from k8s_helpers import TARGETS, one, pod_specs, require_tool, validate_builtin

pytestmark = pytest.mark.k8s

SERVING = ("overlays/cpu", "overlays/gpu")
TF_SERVING_TAG = "2.20.0"
# Flags of tensorflow_model_server, checked in tensorflow_serving/model_servers/main.cc at the
# 2.20.0 tag (the pinned image). A typo there would make the server exit at start.
TF_SERVING_FLAGS = {
    "port",
    "grpc_socket_path",
    "rest_api_port",
    "rest_api_num_threads",
    "rest_api_timeout_in_ms",
    "enable_batching",
    "batching_parameters_file",
    "model_config_file",
    "model_config_file_poll_wait_seconds",
    "model_name",
    "model_base_path",
    "num_load_threads",
    "file_system_poll_wait_seconds",
    "tensorflow_intra_op_parallelism",
    "tensorflow_inter_op_parallelism",
    "monitoring_config_file",
    "grpc_max_threads",
    "enable_model_warmup",
    "enable_grpc_healthcheck_service",
}


@pytest.mark.parametrize("k8s_version", ["1.30.0", "1.37.0"])
@pytest.mark.parametrize("target", TARGETS)
def test_kustomization_renders_and_validates_strict(render, target, k8s_version):
    _, objects = render(target)
    assert objects
    for obj in objects:
        # strict: an unknown (misspelt) field is an error, not silently dropped by the server
        validate_builtin(obj, k8s_version)


@pytest.mark.parametrize("target", SERVING)
def test_serving_overlay_has_every_object(render, target):
    _, objects = render(target)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "NetworkPolicy",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount",
        ]
    )
    assert {o["metadata"]["namespace"] for o in objects} == {"ampflow"}


def test_gpu_overlay_has_gpu_image_limit_node_selector_toleration(render):
    _, objects = render("overlays/gpu")
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["image"] == f"tensorflow/serving:{TF_SERVING_TAG}-gpu"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_cpu_overlay_has_pinned_cpu_image_and_no_gpu(render):
    text, objects = render("overlays/cpu")
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"tensorflow/serving:{TF_SERVING_TAG}"
    assert "nvidia.com/gpu" not in text


def security_context_problems(objects: list[dict]) -> list[str]:
    """What breaks the restricted profile, per container ("" list when none)."""
    problems = []
    for name, spec in pod_specs(objects):
        pod = spec.get("securityContext", {})
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: service account token mounted")
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc, where = c.get("securityContext", {}), f"{name}/{c['name']}"
            caps = sc.get("capabilities", {})
            seccomp = sc.get("seccompProfile", pod.get("seccompProfile", {}))
            checks = {
                "runAsNonRoot": sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is True,
                "runAsUser > 0": sc.get("runAsUser", pod.get("runAsUser", 0)) > 0,  # image: root
                "readOnlyRootFilesystem": sc.get("readOnlyRootFilesystem") is True,
                "allowPrivilegeEscalation false": sc.get("allowPrivilegeEscalation") is False,
                "not privileged": sc.get("privileged", False) is False,
                "drop ALL": caps.get("drop") == ["ALL"] and not caps.get("add"),
                "seccomp RuntimeDefault": seccomp.get("type") == "RuntimeDefault",
            }
            problems += [f"{where}: {check}" for check, ok in checks.items() if not ok]
    return problems


@pytest.mark.parametrize("target", SERVING)
def test_every_container_has_restricted_security_context(render, target):
    _, objects = render(target)
    assert pod_specs(objects)
    assert security_context_problems(objects) == []


def test_security_context_check_catches_a_root_container(render):
    objects = copy.deepcopy(render("overlays/cpu")[1])
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    del spec["securityContext"]["runAsUser"]
    del spec["containers"][0]["securityContext"]["runAsUser"]
    spec["containers"][0]["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    assert security_context_problems(objects) == [
        "tf-serving/tf-serving: runAsUser > 0",
        "tf-serving/tf-serving: drop ALL",
    ]


def test_strict_validation_catches_a_misspelt_field(render):
    deployment = copy.deepcopy(one(render("overlays/cpu")[1], "Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFilesytem"] = True
    validate_builtin(copy.deepcopy(one(render("overlays/cpu")[1], "Deployment")))
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFilesytem"):
        validate_builtin(deployment)  # its schemas read once: the second call sees them too


@pytest.mark.parametrize("target", SERVING)
def test_every_container_has_requests_and_limits(render, target):
    _, objects = render(target)
    for name, spec in pod_specs(objects):
        for c in spec["containers"]:
            resources = c["resources"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[kind]), f"{name}/{c['name']} {kind}"


@pytest.mark.parametrize("target", SERVING)
def test_rolling_update_drops_no_request(render, target):
    _, objects = render(target)
    deployment = one(objects, "Deployment")
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    assert "replicas" not in deployment["spec"]  # the HPA owns it
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sleep >= 10  # longer than endpoint removal takes to propagate
    request_deadline_s = 10  # the canary's and the client's per-call deadline
    assert spec["terminationGracePeriodSeconds"] > sleep + request_deadline_s


@pytest.mark.parametrize("target", SERVING)
def test_probes_use_grpc_health_service_of_tf_serving(render, target):
    _, objects = render(target)
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--enable_grpc_healthcheck_service=true" in container["args"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == 8500, probe
    # the services TF Serving registers with the health service (server.cc)
    assert container["readinessProbe"]["grpc"]["service"] == "PredictionService"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # time to load


@pytest.mark.parametrize("target", SERVING)
def test_tf_serving_args_are_real_flags_and_files_exist(render, target):
    _, objects = render(target)
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["command"] == ["/usr/bin/tensorflow_model_server"]
    flags = dict(re.fullmatch(r"--(\w+)=(.*)", a).groups() for a in container["args"])
    assert set(flags) <= TF_SERVING_FLAGS, set(flags) - TF_SERVING_FLAGS
    config_map = one(objects, "ConfigMap")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    for flag in ("model_config_file", "batching_parameters_file"):
        directory, filename = flags[flag].rsplit("/", 1)
        assert directory == mount["mountPath"] and filename in config_map["data"], flag
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]  # hashed name


@pytest.mark.parametrize("target", SERVING)
def test_selectors_pick_the_serving_pods(render, target):
    _, objects = render(target)
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selectors = {
        "Deployment": deployment["spec"]["selector"]["matchLabels"],
        "Service": one(objects, "Service")["spec"]["selector"],
        "PodDisruptionBudget": one(objects, "PodDisruptionBudget")["spec"]["selector"][
            "matchLabels"
        ],
        "NetworkPolicy": one(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    }
    for kind, selector in selectors.items():
        assert selector and selector.items() <= pod_labels.items(), kind
    hpa = one(objects, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["minReplicas"] >= 2  # with the PDB's minAvailable 1, a drain keeps one up


def test_service_exposes_grpc_8500_and_rest_8501(render):
    _, objects = render("overlays/cpu")
    ports = {p["name"]: p["port"] for p in one(objects, "Service")["spec"]["ports"]}
    assert ports == {"grpc": 8500, "http": 8501}


def test_network_policy_admits_only_labelled_clients(render):
    _, objects = render("overlays/cpu")
    ingress = one(objects, "NetworkPolicy")["spec"]["ingress"]
    assert len(ingress) == 1
    client = {
        "matchExpressions": [
            {"key": "ampflow.dev/serving-client", "operator": "In", "values": ["true"]}
        ]
    }
    # not matchLabels: kustomize would add the app labels to it and admit only the servers;
    # every peer needs the client label (a namespaceSelector alone would admit whole namespaces)
    peers = ingress[0]["from"]
    assert all(peer["podSelector"] == client for peer in peers)
    assert sorted(p["port"] for p in ingress[0]["ports"]) == [8500, 8501]


def _admits(policy: dict, namespace: str, namespace_labels: dict, pod_labels: dict) -> bool:
    """NetworkPolicy peer semantics (podSelector alone: the policy's namespace; with a
    namespaceSelector: namespaces it selects), for the matchExpressions `In` our policy uses."""

    def selects(selector: dict, labels: dict) -> bool:
        return all(labels.get(e["key"]) in e["values"] and e["operator"] == "In"
                   for e in selector.get("matchExpressions", [])) and all(
            labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())

    labels = {"kubernetes.io/metadata.name": namespace, **namespace_labels}
    for peer in policy["spec"]["ingress"][0]["from"]:
        if "namespaceSelector" in peer:
            in_namespace = selects(peer["namespaceSelector"], labels)
        else:
            in_namespace = namespace == policy["metadata"]["namespace"]
        if in_namespace and selects(peer["podSelector"], pod_labels):
            return True
    return False


def test_network_policy_admits_the_kfp_deploy_task_from_the_run_namespace(render):
    """The pipeline's deploy pod (label serving-client) checks the canary from the namespace
    KFP runs in: the serving namespace itself, standalone `kubeflow`, or a labelled profile."""
    policy = one(render("overlays/cpu")[1], "NetworkPolicy")
    client = {"ampflow.dev/serving-client": "true"}
    assert _admits(policy, "ampflow", {}, client)
    assert _admits(policy, "kubeflow", {}, client)  # standalone KFP's pipeline-runner pods
    assert _admits(policy, "kubeflow-user-example-com", {"ampflow.dev/serving-clients": "true"},
                   client)
    assert not _admits(policy, "kubeflow-user-example-com", {}, client)
    assert not _admits(policy, "kubeflow", {}, {})  # unlabelled pods stay out
    assert not _admits(policy, "other", {}, client)


def test_rbac_is_least_privilege_and_covers_what_deploy_applies(render):
    _, rbac = render("rbac")
    _, serving = render("overlays/cpu")
    assert {o["kind"] for o in rbac} == {"ServiceAccount", "Role", "RoleBinding"}  # no Cluster*
    rules = one(rbac, "Role")["rules"]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        # no rule narrowed to names: a --name-prefix renames every object, the rollout lock too
        assert "resourceNames" not in rule, rule
        assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} & set(
            rule["verbs"]
        )
        assert not {"secrets", "pods/exec", "roles", "rolebindings"} & set(rule["resources"])
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    plural = {
        "NetworkPolicy": "networkpolicies",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    }
    for obj in serving:
        group = obj["apiVersion"].rpartition("/")[0]
        resource = plural.get(obj["kind"], obj["kind"].lower() + "s")
        assert {"get", "create", "patch"} <= granted.get((group, resource), set()), obj["kind"]
    # what kubectl rollout status/undo and the canary's share need, and nothing more
    assert granted[("apps", "deployments")] == {"get", "list", "watch", "create", "patch"}
    assert granted[("apps", "replicasets")] == {"get", "list"}
    # the rollout lock is created, taken over and released with these: never deleted
    assert granted[("", "configmaps")] == {"get", "create", "patch"}
    assert granted[("apps", "deployments/status")] == {"get", "list"}
    binding = one(rbac, "RoleBinding")
    # the workstation identity, and the account standalone KFP's pods run as (the pipeline's
    # deploy task): backend/src/apiserver/common/const.go@2.17.0 L59
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ampflow-deployer", "namespace": "ampflow"},
        {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"},
    ]


def test_rbac_for_serving_in_the_standalone_kfp_namespace(render):
    _, objects = render("rbac-kubeflow")
    assert {o["metadata"]["namespace"] for o in objects} == {"kubeflow"}
    assert one(objects, "RoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": "ampflow-deployer", "namespace": "kubeflow"},
        {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"},
    ]


def test_model_store_claim_is_the_one_the_serving_base_and_the_pipeline_use(render):
    from ampflow.pipeline.pipeline import PipelineOptions

    (claim,) = render("model-store")[1]
    assert claim["kind"] == "PersistentVolumeClaim"
    assert claim["metadata"]["name"] == PipelineOptions().model_store_pvc
    served = one(render("overlays/cpu")[1], "PersistentVolumeClaim")
    assert served["spec"] == claim["spec"]


def _checkov() -> str | None:
    """$CHECKOV, else the tools venv the Makefile makes (.venv-tools), else PATH."""
    candidates = [
        os.environ.get("CHECKOV"),
        str(Path(__file__).resolve().parents[2] / ".venv-tools" / "bin" / "checkov"),
        shutil.which("checkov"),
    ]
    return next((c for c in candidates if c and Path(c).is_file()), None)


@pytest.mark.slow  # checkov, an external checker: seconds
def test_checkov_passes_with_only_justified_exceptions(render, tmp_path):
    checkov = require_tool(_checkov(), "checkov", "make .venv-tools (pip install checkov)")
    for target in ("overlays/cpu", "overlays/gpu", "rbac"):
        (tmp_path / (target.replace("/", "-") + ".yaml")).write_text(render(target)[0])
    proc = subprocess.run(
        [
            checkov,
            "-d",
            str(tmp_path),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(proc.stdout)
    summary = report["summary"]
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert summary["failed"] == 0 and proc.returncode == 0, failed
    assert summary["passed"] > 50
    skipped_ids = {c["check_id"] for c in report["results"]["skipped_checks"]}
    assert skipped_ids == {"CKV_K8S_43", "CKV_K8S_15"}  # digest pin, pull policy: see deployment
    for skipped in report["results"]["skipped_checks"]:
        # each exception carries its reason in the manifest (checkov.io/skipN: ID=reason)
        assert len(skipped["check_result"].get("suppress_comment", "")) > 40, skipped["check_id"]


def test_pipeline_train_pods_are_covered_by_a_disruption_budget(render):
    """A drained node's pods are evicted (deleted), and KFP does not retry a deleted pod: the
    budget (no voluntary disruption) selects the label the pipeline puts on its train pods."""
    from ampflow.pipeline.distributed_task import TRAIN_POD_LABEL

    pdb = one(render("pipeline")[1], "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 0
    assert pdb["spec"]["selector"]["matchLabels"] == dict([TRAIN_POD_LABEL])
