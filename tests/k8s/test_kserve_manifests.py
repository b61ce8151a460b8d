"""k8s/kserve: the ServingRuntime and InferenceService render, validate strictly against KServe's
CRD schemas (tests/k8s/crds/kserve, version and source in its SOURCES.md), run flags `ampflow
serve` accepts, probe the Open Inference Protocol's health endpoints, and give a predictor pod
that meets the restricted Pod Security Standard (checked on the pod KServe builds from the two,
since checkov does not read KServe's kinds).

Strict as the training manifests' test is: KServe's CRDs are structural schemas, so the API
server would silently prune an unknown (misspelt) field; here it is an error instead.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from k8s_helpers import ManifestValidator, one, require_tool, validate_builtin
from ports import free_port
from test_manifests import _checkov, security_context_problems

from ampflow.components.deploy_serving import kserve_target
from ampflow.components.deploy_serving.config import DeployConfig

pytestmark = pytest.mark.k8s

TARGET = "kserve"
CRDS = Path(__file__).with_name("crds") / "kserve"
SCHEMAS = {  # (apiVersion, kind) -> CRD file (KServe v0.19.0, config/crd/full/)
    (kserve_target.RUNTIME_API, kserve_target.RUNTIME_KIND):
        "serving.kserve.io_servingruntimes.yaml.gz",
    (kserve_target.ISVC_API, kserve_target.ISVC_KIND):
        "serving.kserve.io_inferenceservices.yaml.gz",
}
# KServe v0.19.0 pkg/constants/constants.go: InferenceServiceProtocol values
KSERVE_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
# the container KServe merges the InferenceService's model spec into (constants.go)
KSERVE_CONTAINER = "kserve-container"
V2_LIVE, V2_READY = "/v2/health/live", "/v2/health/ready"  # Open Inference Protocol REST

# What Knative Serving (KServe's Serverless mode) accepts in a pod with its default features,
# knative/serving tag knative-v1.23.0: pkg/apis/serving/fieldmask.go (PodSpecMask,
# SecurityContextMask, PodSecurityContextMask), pkg/apis/config/features.go (defaults: emptyDir
# volumes on; pod securityContext, PVCs, node selector, tolerations ... off) and
# k8s_validation.go (one port, reserved ports). A field outside these is a rejected revision.
KNATIVE_POD_FIELDS = {"serviceAccountName", "containers", "volumes", "imagePullSecrets",
                      "enableServiceLinks", "automountServiceAccountToken"}
KNATIVE_CONTAINER_SECURITY = {"capabilities", "readOnlyRootFilesystem", "runAsUser", "runAsGroup",
                              "runAsNonRoot", "allowPrivilegeEscalation", "seccompProfile",
                              "privileged"}
KNATIVE_VOLUME_SOURCES = {"secret", "configMap", "projected", "emptyDir"}
KNATIVE_RESERVED_PORTS = {8012, 8013, 8022, 9090, 9091, 8008}  # queue-proxy, metrics, profiling


VALIDATE = ManifestValidator(CRDS, SCHEMAS)
crd_validator, validate = VALIDATE.crd_validator, VALIDATE


def predictor_pod(objects: list[dict]) -> dict:
    """The predictor pod KServe builds, as a Deployment (for the shared policy checks).

    As KServe v0.19.0 does it (pkg/controller/v1beta1/inferenceservice/utils/utils.go): the
    runtime container strategic-merged with spec.predictor.model, args concatenated, `{{.Name}}`
    replaced; the pod takes the runtime's volumes and the predictor's pod fields; the storage
    URI is mounted read-only at /mnt/models (storage_initializer_injector.go).
    """
    runtime, isvc = one(objects, "ServingRuntime"), one(objects, "InferenceService")
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    (container,) = copy.deepcopy(runtime["spec"]["containers"])
    for field, value in model.items():
        if field not in ("modelFormat", "runtime", "storageUri", "protocolVersion", "args"):
            container[field] = value
    container["args"] = container["args"] + model.get("args", [])
    container = json.loads(json.dumps(container).replace("{{.Name}}", isvc["metadata"]["name"]))
    container.setdefault("volumeMounts", []).append(
        {"name": "kserve-pvc-source", "mountPath": kserve_target.SERVER_MODEL_DIR,
         "readOnly": True})
    pod = {k: v for k, v in predictor.items()
           if k not in ("model", "canaryTrafficPercent", "minReplicas", "maxReplicas")}
    pod["containers"] = [container]
    pod["volumes"] = copy.deepcopy(runtime["spec"].get("volumes", []))
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": isvc["metadata"]["name"] + "-predictor",
                         "namespace": isvc["metadata"]["namespace"]},
            "spec": {"selector": {"matchLabels": {"app": "isvc"}},
                     "template": {"metadata": {"labels": {"app": "isvc"}}, "spec": pod}}}


def knative_problems(deployment: dict) -> list[str]:
    """What Knative's default features would reject in the predictor pod ([] when none)."""
    spec = deployment["spec"]["template"]["spec"]
    problems = [f"pod field {k}" for k in sorted(set(spec) - KNATIVE_POD_FIELDS)]
    if spec.get("automountServiceAccountToken", False) is not False:
        problems.append("automountServiceAccountToken may only be false")
    for volume in spec.get("volumes", []):
        problems += [f"volume source {k}" for k in set(volume) - {"name"} - KNATIVE_VOLUME_SOURCES]
    (container,) = spec["containers"]
    security = container.get("securityContext", {})
    problems += [f"container securityContext.{k}"
                 for k in sorted(set(security) - KNATIVE_CONTAINER_SECURITY)]
    if security.get("privileged", False) is not False or security.get("capabilities", {}).get(
            "add"):
        problems.append("privileged or added capabilities")
    ports = container.get("ports", [])
    if len(ports) > 1:
        problems.append("more than one container port")
    problems += [f"reserved port {p['containerPort']}" for p in ports
                 if p["containerPort"] in KNATIVE_RESERVED_PORTS]
    return problems


def serve_config(container: dict):
    """The `ampflow serve` config the container's command line gives (real flags only)."""
    from ampflow.cli import build_parser
    from ampflow.serving.cli import serve_config_from_args

    assert container["command"] == ["ampflow"] and container["args"][0] == "serve"
    args = build_parser(("ampflow.serving.cli",)).parse_args(container["args"])
    return serve_config_from_args(args)


def settled_on_the_claim(version_dir: Path) -> None:
    """Date the version's files an hour back, as a model on the claim before the pod starts.

    The server loads at start only a version whose files are older than its settle period
    (the poll wait, 30 s in these args); a just-written one would cost a 30 s sleep.
    """
    an_hour_ago = time.time() - 3600
    for path in [version_dir, *version_dir.rglob("*")]:
        os.utime(path, (an_hour_ago, an_hour_ago))


def test_kserve_kustomization_renders_and_validates_against_the_crds(render):
    _, objects = render(TARGET)
    assert sorted(o["kind"] for o in objects) == [
        "InferenceService", "PersistentVolumeClaim", "ServingRuntime"]
    for obj in objects:
        validate(obj)


def test_crd_validation_catches_misspelt_fields(render):
    objects = render(TARGET)[1]
    isvc = copy.deepcopy(one(objects, "InferenceService"))
    isvc["spec"]["predictor"]["canaryTrafficPercnt"] = 10
    with pytest.raises(AssertionError, match="canaryTrafficPercnt"):
        validate(isvc)
    runtime = copy.deepcopy(one(objects, "ServingRuntime"))
    runtime["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = V2_READY
    with pytest.raises(AssertionError, match="paht"):
        validate(runtime)
    runtime = copy.deepcopy(one(objects, "ServingRuntime"))
    runtime["spec"]["protocolVersion"] = ["v2"]  # the field is protocolVersions
    with pytest.raises(AssertionError, match="protocolVersion"):
        validate(runtime)


def test_runtime_serves_both_protocols_and_both_formats_and_is_never_auto_selected(render):
    runtime = one(render(TARGET)[1], "ServingRuntime")
    protocols = runtime["spec"]["protocolVersions"]
    assert {"v2", "grpc-v2"} <= set(protocols) <= KSERVE_PROTOCOLS
    formats = {f["name"]: f for f in runtime["spec"]["supportedModelFormats"]}
    # KServe's format names for what `ampflow serve --model-format auto` loads (a version dir
    # holding a SavedModel or a .tflite file): every format the server knows, and only those
    from ampflow.serving.model_format import MODEL_FORMATS

    kserve_names = {"saved_model": "tensorflow", "tflite": "tflite"}
    choices = ("auto", "prefer_tflite")  # which of the two formats a dir's files make it
    assert set(formats) == {kserve_names[f] for f in MODEL_FORMATS if f not in choices}
    assert "--model-format" not in " ".join(runtime["spec"]["containers"][0]["args"])  # auto
    assert not any(f.get("autoSelect") for f in formats.values())
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == KSERVE_CONTAINER


def test_predictor_runs_real_ampflow_serve_flags_on_kserves_ports(render):
    objects = render(TARGET)[1]
    container = predictor_pod(objects)["spec"]["template"]["spec"]["containers"][0]
    config = serve_config(container)
    isvc = one(objects, "InferenceService")
    (model,) = config.models
    assert model.name == isvc["metadata"]["annotations"]["ampflow.dev/model-name"]
    assert str(model.base_path) == kserve_target.SERVER_MODEL_DIR
    assert model.version_policy == "specific"
    pinned = int(isvc["metadata"]["annotations"]["ampflow.dev/model-version"])
    assert list(model.versions) == [pinned]
    assert config.host == "0.0.0.0"
    assert config.rest_api_port == container["ports"][0]["containerPort"] == 8080
    assert config.port == 9000  # gRPC, KServe's usual grpc port (its TF Serving runtime's)


def test_one_server_process_per_core_of_the_cpu_limit(render):
    """`--workers` (issue 42): one Python server process uses about one core, so the runtime
    runs as many as its CPU limit gives it whole cores, and no more."""
    container = predictor_pod(render(TARGET)[1])["spec"]["template"]["spec"]["containers"][0]
    cpu = str(container["resources"]["limits"]["cpu"])
    cores = int(cpu[:-1]) // 1000 if cpu.endswith("m") else int(float(cpu))
    assert serve_config(container).workers == max(1, cores) > 1


def test_the_queue_proxy_on_loopback_is_not_capped_as_one_client(render):
    """In Serverless mode every REST connection reaches the container from Knative's
    queue-proxy on 127.0.0.1: one client address. The per-address cap (default 128) would
    refuse the 129th concurrent request long before the total cap; it must be the total."""
    from ampflow.serving.config import ConnectionLimits

    pod = predictor_pod(render(TARGET)[1])
    limits = serve_config(pod["spec"]["template"]["spec"]["containers"][0]).connection_limits
    assert limits.max_connections_per_address == limits.max_connections
    assert limits.max_connections_per_address >= ConnectionLimits().max_connections


def test_probes_use_the_v2_health_endpoints_on_the_rest_port(render):
    runtime = one(render(TARGET)[1], "ServingRuntime")
    (container,) = runtime["spec"]["containers"]
    rest_port = container["ports"][0]["containerPort"]
    assert container["readinessProbe"]["httpGet"] == {"path": V2_READY, "port": rest_port}
    assert container["livenessProbe"]["httpGet"] == {"path": V2_LIVE, "port": rest_port}


def test_storage_uri_is_the_model_store_claim_and_the_served_model(render):
    objects = render(TARGET)[1]
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == DeployConfig.__dataclass_fields__[
        "model_store_claim"].default  # the deploy step's default claim is this one
    isvc = one(objects, "InferenceService")
    model_name = isvc["metadata"]["annotations"]["ampflow.dev/model-name"]
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == \
        f"pvc://{claim['metadata']['name']}/{model_name}"
    assert isvc["spec"]["predictor"]["model"]["runtime"] == \
        one(objects, "ServingRuntime")["metadata"]["name"]
    assert 0 <= isvc["spec"]["predictor"]["canaryTrafficPercent"] <= 100


def test_predictor_pod_meets_the_restricted_profile_and_has_resources(render):
    pod = predictor_pod(render(TARGET)[1])
    validate(pod)  # the merged pod is a valid Kubernetes pod spec
    assert security_context_problems([pod]) == []
    (container,) = pod["spec"]["template"]["spec"]["containers"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts  # the root filesystem is read-only


def test_the_security_check_catches_a_token_and_a_root_user(render):
    objects = copy.deepcopy(render(TARGET)[1])
    del one(objects, "InferenceService")["spec"]["predictor"]["automountServiceAccountToken"]
    del one(objects, "ServingRuntime")["spec"]["containers"][0]["securityContext"]["runAsUser"]
    assert security_context_problems([predictor_pod(objects)]) == [
        "ampflow-predictor: service account token mounted",
        "ampflow-predictor/kserve-container: runAsUser > 0"]


@pytest.mark.parametrize("target", [TARGET, "deploy step"])
def test_predictor_pod_is_one_knative_accepts_with_its_default_features(render, target):
    objects = render(TARGET)[1]
    if target == "deploy step":
        config = DeployConfig(saved_model_dir=Path("/x/digits/3"), target="kserve",
                              model_store="/models")
        objects = kserve_target.release(objects, config, "digits", 3)
    assert knative_problems(predictor_pod(objects)) == []


def test_knative_check_catches_a_pod_security_context_and_a_second_port(render):
    """A pod-level securityContext (what a Deployment would carry) is a rejected revision."""
    objects = copy.deepcopy(render(TARGET)[1])
    one(objects, "InferenceService")["spec"]["predictor"]["securityContext"] = {
        "runAsNonRoot": True}
    container = one(objects, "ServingRuntime")["spec"]["containers"][0]
    container["ports"].append({"name": "h2c", "containerPort": 9000, "protocol": "TCP"})
    assert knative_problems(predictor_pod(objects)) == [
        "pod field securityContext", "more than one container port"]


def test_deploy_step_release_validates_and_keeps_the_policies(render):
    """What `ampflow deploy --target kserve` applies, built from the same render."""
    objects = render(TARGET)[1]
    config = DeployConfig(saved_model_dir=Path("/x/digits/3"), target="kserve",
                          model_store="/models", namespace="team-a", name_prefix="exp-",
                          image="registry.example/ampflow:1.2.3", canary_traffic_percent=20)
    released = kserve_target.release(objects, config, "digits", 3)
    assert [o["kind"] for o in released] == ["ServingRuntime", "InferenceService"]
    for obj in released:
        validate(obj)
        assert obj["metadata"]["namespace"] == "team-a"
    pod = predictor_pod(released)
    assert security_context_problems([pod]) == []
    model = serve_config(pod["spec"]["template"]["spec"]["containers"][0]).models[0]
    assert (model.name, list(model.versions)) == ("digits", [3])


def test_a_bfloat16_deploy_asks_the_runtime_for_bfloat16_in_its_model_args(render, tmp_path):
    """`deploy --target kserve --compute-precision bfloat16`: KServe appends the model's args
    to the runtime's, so the predictor runs `ampflow serve --compute-precision bfloat16`; a
    float32 deploy adds nothing (the server's default)."""
    objects = render(TARGET)[1]
    served = {}
    for precision in ("float32", "bfloat16"):
        config = DeployConfig(saved_model_dir=Path("/x/digits/3"), target="kserve",
                              model_store="/models", compute_precision=precision,
                              data_dir=tmp_path)
        pod = predictor_pod(kserve_target.release(objects, config, "digits", 3))
        container = pod["spec"]["template"]["spec"]["containers"][0]
        served[precision] = serve_config(container).models[0].compute_precision
        assert sum("--compute-precision" in a for a in container["args"]) == (
            precision == "bfloat16")
    assert served == {"float32": "float32", "bfloat16": "bfloat16"}


# Node labels as Node Feature Discovery publishes them (cpu-cpuid.<flag>=true) on the CPU kinds
# ampflow's hosts include: AVX2 only, Zen 4 (AVX512_BF16, no AMX), Sapphire Rapids (both)
NFD = "feature.node.kubernetes.io/cpu-cpuid."
NODES = {"avx2-only": {f"{NFD}AVX2": "true", "kubernetes.io/arch": "amd64"},
         "zen4": {f"{NFD}AVX2": "true", f"{NFD}AVX512BF16": "true", "kubernetes.io/arch": "amd64"},
         "sapphire-rapids": {f"{NFD}AVX512BF16": "true", f"{NFD}AMXBF16": "true",
                             f"{NFD}AMXTILE": "true", "kubernetes.io/arch": "amd64"},
         "amx-labelled-only": {f"{NFD}AMXBF16": "true", "kubernetes.io/arch": "amd64"}}


def schedulable_on(deployment: dict) -> set[str]:
    """The NODES the scheduler may put the pod on: its nodeSelector (ANDed) and its required
    node affinity (terms ORed, a term's expressions ANDed), as Kubernetes reads them."""
    spec = deployment["spec"]["template"]["spec"]
    required = (spec.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))

    def meets(expression: dict, labels: dict) -> bool:
        value, operator = labels.get(expression["key"]), expression["operator"]
        return {"In": lambda: value in expression["values"],
                "NotIn": lambda: value not in expression["values"],
                "Exists": lambda: value is not None,
                "DoesNotExist": lambda: value is None}[operator]()

    def fits(labels: dict) -> bool:
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return False
        return required is None or any(
            all(meets(e, labels) for e in term.get("matchExpressions", []))
            for term in required["nodeSelectorTerms"])

    return {name for name, labels in NODES.items() if fits(labels)}


def _bf16_release(objects: list[dict], tmp_path, **overrides) -> list[dict]:
    config = DeployConfig(saved_model_dir=Path("/x/digits/3"), target="kserve",
                          model_store="/models", data_dir=tmp_path, **overrides)
    return kserve_target.release(objects, config, "digits", 3)


def test_a_bfloat16_predictor_runs_only_on_nodes_with_bf16_units(render, tmp_path):
    """The gate's measurements hold, and bfloat16 is fast, only on a CPU with AVX512_BF16 or
    AMX-BF16: a bfloat16 deploy requires a node Node Feature Discovery labels with either (a
    node affinity: a nodeSelector cannot say "either"); a float32 one may run anywhere."""
    objects = render(TARGET)[1]
    float32 = _bf16_release(objects, tmp_path)
    bfloat16 = _bf16_release(objects, tmp_path, compute_precision="bfloat16")
    for obj in bfloat16:
        validate(obj)  # the affinity is a field KServe's CRD has, spelt as it has it
    assert schedulable_on(predictor_pod(float32)) == set(NODES)
    assert schedulable_on(predictor_pod(bfloat16)) == {"zen4", "sapphire-rapids",
                                                       "amx-labelled-only"}
    # Knative (Serverless mode) takes an affinity only with kubernetes.podspec-affinity on
    # (docs/how-to/serve-and-query.md says so); nothing else of the pod changes
    assert knative_problems(predictor_pod(bfloat16)) == ["pod field affinity"]
    assert security_context_problems([predictor_pod(bfloat16)]) == []


def test_the_bf16_node_labels_are_the_operators_to_change(render, tmp_path):
    """--bfloat16-node-labels: other labels (a cluster labelling its bf16 pool itself), none
    (no constraint), and an affinity already in the manifest still holds beside ours."""
    objects = render(TARGET)[1]
    own = _bf16_release(objects, tmp_path, compute_precision="bfloat16",
                        bfloat16_node_labels=f"{NFD}AMXBF16=true")
    assert schedulable_on(predictor_pod(own)) == {"sapphire-rapids", "amx-labelled-only"}
    anywhere = _bf16_release(objects, tmp_path, compute_precision="bfloat16",
                             bfloat16_node_labels="none")
    assert "affinity" not in one(anywhere, "InferenceService")["spec"]["predictor"]
    assert schedulable_on(predictor_pod(anywhere)) == set(NODES)

    manifest = copy.deepcopy(objects)  # an operator's own rule: no amx-labelled-only node
    one(manifest, "InferenceService")["spec"]["predictor"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": f"{NFD}AVX2", "operator": "Exists"}]},
            {"matchExpressions": [{"key": f"{NFD}AMXTILE", "operator": "Exists"}]}]}}}
    both = _bf16_release(manifest, tmp_path, compute_precision="bfloat16")
    validate(one(both, "InferenceService"))
    assert schedulable_on(predictor_pod(both)) == {"zen4", "sapphire-rapids"}


@pytest.mark.slow  # checkov, an external checker: seconds
def test_checkov_passes_on_the_predictor_pod(render, tmp_path):
    """checkov reads no KServe kind (it finds 0 resources in the render), so it checks the pod
    KServe builds from them, with the base Deployment's two justified exceptions and two more:
    no NetworkPolicy ships here, because a KServe predictor's traffic comes through the
    cluster's Knative activator and ingress gateway (their namespaces and queue-proxy port
    depend on the install; docs/how-to/kserve.md says what to admit), and the security context
    is the container's alone, because Knative refuses a pod-level one by default."""
    checkov = require_tool(_checkov(), "checkov", "make .venv-tools (pip install checkov)")
    pod = predictor_pod(render(TARGET)[1])
    pod["metadata"]["annotations"] = {
        "checkov.io/skip1": "CKV_K8S_43=The image is pinned to a release tag; pin a digest at "
                            "release time with kustomize edit set image.",
        "checkov.io/skip2": "CKV_K8S_15=The tag is immutable by policy, so IfNotPresent gives "
                            "the same image as Always.",
        "checkov.io/skip3": "CKV2_K8S_6=Traffic arrives through Knative's activator and ingress "
                            "gateway, whose namespaces depend on the install (docs/how-to).",
        "checkov.io/skip4": "CKV_K8S_29=Knative rejects a pod-level securityContext by default "
                            "(kubernetes.podspec-securitycontext); the container sets it all.",
    }
    (tmp_path / "predictor.yaml").write_text(yaml.safe_dump(pod))
    proc = subprocess.run([checkov, "-d", str(tmp_path), "--framework", "kubernetes", "--output",
                           "json", "--skip-download"], capture_output=True, text=True,
                          timeout=300, check=False)
    report = json.loads(proc.stdout)
    failed = [(c["check_id"], c["check_name"]) for c in report["results"]["failed_checks"]]
    assert report["summary"]["failed"] == 0, failed
    assert report["summary"]["passed"] > 30
    skipped = {c["check_id"] for c in report["results"]["skipped_checks"]}
    assert skipped == {"CKV_K8S_43", "CKV_K8S_15", "CKV2_K8S_6", "CKV_K8S_29"}


def test_kserve_rbac_is_least_privilege_and_bound_like_k8s_rbac(render):
    objects = render("kserve/rbac")[1]
    for obj in objects:
        validate_builtin(obj)
    assert sorted(o["kind"] for o in objects) == ["Role", "RoleBinding", "ServiceAccount"]
    # exactly the deploy step's requests (test_deploy_kserve.py checks them on the wire)
    assert one(objects, "Role")["rules"] == [
        {"apiGroups": [kserve_target.GROUP], "resources": [kserve_target.ISVC_PLURAL],
         "verbs": ["get", "create", "patch"]},
        {"apiGroups": [kserve_target.GROUP], "resources": [kserve_target.RUNTIME_PLURAL],
         "verbs": ["create", "patch"]},
        # the rollout lock: created, taken over and released by patches, never deleted
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]}]
    binding = one(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == one(objects, "Role")["metadata"]["name"]
    assert binding["subjects"] == one(render("rbac")[1], "RoleBinding")["subjects"]
    assert one(objects, "ServiceAccount") == one(render("rbac")[1], "ServiceAccount")


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.timeout(300)
def test_the_predictor_command_line_serves_and_its_probes_answer(render, tmp_path):
    """The predictor's own command line (the runtime's args plus the InferenceService's), run
    as `ampflow serve` over a store holding the pinned version: the readiness and liveness
    probes' paths answer 200 on the port the probes use. Only what cannot run here is changed:
    loopback instead of 0.0.0.0, free ports, the store's path instead of /mnt/models."""
    import urllib.error
    import urllib.request

    from ampflow.serving.testing import ServeProcess, write_model_version

    objects = render(TARGET)[1]
    container = predictor_pod(objects)["spec"]["template"]["spec"]["containers"][0]
    isvc = one(objects, "InferenceService")
    model_name = isvc["metadata"]["annotations"]["ampflow.dev/model-name"]
    store = tmp_path / "mnt-models"
    version_dir = write_model_version(
        store, int(isvc["metadata"]["annotations"]["ampflow.dev/model-version"]),
        model_name=model_name)
    settled_on_the_claim(version_dir)
    rest_port = free_port()  # the server binds it later: never one the kernel hands out
    probe_port = container["readinessProbe"]["httpGet"]["port"]
    local = {"--host=0.0.0.0": "--host=127.0.0.1", "--port=9000": "--port=0",
             f"--rest-api-port={probe_port}": f"--rest-api-port={rest_port}",
             f"--model-base-path={kserve_target.SERVER_MODEL_DIR}": f"--model-base-path={store}"}
    flags = [local.get(a, a) for a in container["args"][1:]]
    assert len(set(flags) - set(container["args"])) == len(local)  # each one was there
    with ServeProcess(model_name, store, tmp_path / "server.log", *flags):
        answers = {}
        for probe in ("readinessProbe", "livenessProbe"):
            url = f"http://127.0.0.1:{rest_port}{container[probe]['httpGet']['path']}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        answers[probe] = response.status
                        break
                except urllib.error.HTTPError as e:
                    if e.code != 503 or time.monotonic() > deadline:  # 503: not ready yet
                        answers[probe] = e.code
                        break
                    time.sleep(0.5)
                except (urllib.error.URLError, ConnectionError):  # not listening yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/v2/models/{model_name}",
                                    timeout=5) as response:
            metadata = json.loads(response.read())
    assert answers == {"readinessProbe": 200, "livenessProbe": 200}
    assert metadata["name"] == model_name and metadata["versions"] == ["1"]
