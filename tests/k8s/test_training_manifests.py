"""k8s/training: the TFJob and Trainer v2 manifests render, validate against the upstream CRDs'
OpenAPI schemas (tests/k8s/crds, version and source in SOURCES.md), and agree with the code that
runs inside them (the `ampflow train` flags, the TF_CONFIG a Trainer v2 pod builds).

Kubernetes itself does not reject unknown fields of a custom resource (it prunes them), so the
schemas are made strict here: every object schema that does not preserve unknown fields gets
`additionalProperties: false`, which turns a misspelt field into a test failure.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from k8s_helpers import K8S_DIR, ManifestValidator
from test_manifests import security_context_problems

pytestmark = pytest.mark.k8s

CRDS = Path(__file__).with_name("crds")
TARGETS = ("training/tfjob", "training/trainer-v2", "training/rbac")
SCHEMAS = {  # (apiVersion, kind) -> CRD file
    ("kubeflow.org/v1", "TFJob"): "kubeflow.org_tfjobs.yaml.gz",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml.gz",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"):
        "trainer.kubeflow.org_clustertrainingruntimes.yaml.gz",
}
# kubeflow/trainer v2.3.0 pkg/constants/constants.go
TRAINER_NODE = "node"
TRAINER_ANCESTOR_LABEL = ("trainer.kubeflow.org/trainjob-ancestor-step", "trainer")
JOB_COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# kubeflow/training-operator release-1.9 pkg/apis/kubeflow.org/v1/tensorflow_types.go
TFJOB_CONTAINER, TFJOB_PORT_NAME, TFJOB_PORT = "tensorflow", "tfjob-port", 2222


VALIDATE = ManifestValidator(CRDS, SCHEMAS)
crd_validator, validate = VALIDATE.crd_validator, VALIDATE


def one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def tfjob_pod(objects) -> dict:
    return one(objects, "TFJob")["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]


def runtime_job(objects) -> dict:
    (job,) = one(objects, "ClusterTrainingRuntime")["spec"]["template"]["spec"]["replicatedJobs"]
    return job


def as_workloads(objects) -> list[dict]:
    """The pod specs of the training kinds, shaped as Deployments for the shared policy check."""
    pods = []
    for obj in objects:
        if obj["kind"] == "TFJob":
            pods.append(("tfjob", tfjob_pod(objects)))
        elif obj["kind"] == "ClusterTrainingRuntime":
            pods.append(("runtime", runtime_job(objects)["template"]["spec"]["template"]["spec"]))
    return [{"kind": "Deployment", "metadata": {"name": name},
             "spec": {"template": {"spec": spec}}} for name, spec in pods]


@pytest.mark.parametrize("target", TARGETS)
def test_training_kustomizations_render_and_validate_against_the_crds(render, target):
    _, objects = render(target)
    assert objects
    for obj in objects:
        validate(obj)


def test_crd_validation_catches_a_misspelt_field(render):
    job = copy.deepcopy(one(render("training/tfjob")[1], "TFJob"))
    job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicys"] = "Never"
    with pytest.raises(AssertionError, match="restartPolicys"):
        validate(job)
    trainjob = copy.deepcopy(one(render("training/trainer-v2")[1], "TrainJob"))
    trainjob["spec"]["trainer"]["numNode"] = 2
    with pytest.raises(AssertionError, match="numNode"):
        validate(trainjob)


@pytest.mark.parametrize("target", ["training/tfjob", "training/trainer-v2"])
def test_training_pods_have_the_restricted_security_context(render, target):
    workloads = as_workloads(render(target)[1])
    assert workloads
    assert security_context_problems(workloads) == []


def _parse_train_flags(argv: list[str]):
    from ampflow.cli import build_parser
    from ampflow.cliutil import config_from_args
    from ampflow.components.train import TrainConfig

    args = build_parser(("ampflow.components.train.cli",)).parse_args(argv)
    return config_from_args(TrainConfig, args)


def test_tfjob_runs_ampflow_train_on_the_claim_with_the_operators_port_and_gpus(render):
    objects = render("training/tfjob")[1]
    job = one(objects, "TFJob")
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] >= 2 and worker["restartPolicy"] == "ExitCode"
    pod = tfjob_pod(objects)
    (container,) = pod["containers"]
    assert container["name"] == TFJOB_CONTAINER
    assert {"name": TFJOB_PORT_NAME, "containerPort": TFJOB_PORT, "protocol": "TCP"} in \
        container["ports"]
    config = _parse_train_flags(container["command"][1:] + container["args"])
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    for path in (config.data_dir, config.output_dir, Path(config.checkpoint_dir)):
        assert str(path).startswith(mount["mountPath"] + "/")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_trainer_v2_runtime_has_the_names_the_trainer_looks_for(render):
    objects = render("training/trainer-v2")[1]
    runtime = one(objects, "ClusterTrainingRuntime")
    assert set(runtime["spec"]["mlPolicy"]) == {"numNodes"}  # PlainML: no framework policy
    job = runtime_job(objects)
    assert job["name"] == TRAINER_NODE
    key, value = TRAINER_ANCESTOR_LABEL
    assert job["template"]["metadata"]["labels"][key] == value
    assert job["template"]["spec"]["completionMode"] == "Indexed"
    (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == TRAINER_NODE
    env = {e["name"]: e for e in container["env"]}
    assert env["AMPFLOW_WORKER_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        JOB_COMPLETION_INDEX_FIELD
    trainjob = one(objects, "TrainJob")
    assert trainjob["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]


def test_trainer_v2_pods_build_the_tf_config_of_their_jobset(render):
    """Every pod of the example TrainJob, with what the trainer and Kubernetes give it,
    builds the same cluster, names itself in it, and runs flags `ampflow train` accepts."""
    import json

    from ampflow.components.train.clusters.tf_config import read_tf_config

    objects = render("training/trainer-v2")[1]
    trainjob = one(objects, "TrainJob")
    name, nodes = trainjob["metadata"]["name"], trainjob["spec"]["trainer"]["numNodes"]
    (container,) = runtime_job(objects)["template"]["spec"]["template"]["spec"]["containers"]
    port = container["ports"][0]["containerPort"]
    clusters = []
    for index in range(nodes):
        env = {"HOSTNAME": f"{name}-{TRAINER_NODE}-0-{index}"}  # JobSet <name>-<job>-0-<i>
        for var in container["env"] + trainjob["spec"]["trainer"]["env"]:
            env[var["name"]] = str(index) if "valueFrom" in var else var["value"]
        spec = read_tf_config(env)
        assert spec.worker_id == index and spec.num_workers == nodes
        clusters.append(json.loads(env["TF_CONFIG"])["cluster"])
    assert all(c == clusters[0] for c in clusters)
    assert clusters[0]["worker"][0] == f"{name}-{TRAINER_NODE}-0-0.{name}:{port}"
    config = _parse_train_flags(container["command"][1:] + trainjob["spec"]["trainer"]["args"])
    assert config.checkpoint_dir.startswith("/mnt/ampflow/")


def test_python_built_tfjob_validates_and_keeps_the_manifests_policies(render):
    """The TFJob a distributed pipeline task creates (components/train/clusters/kubeflow_job.py)."""
    from ampflow.components.train.clusters.kubeflow_job import TFJobSettings, build_tfjob

    template = one(render("training/tfjob")[1], "TFJob")
    for gpu in (True, False):
        settings = TFJobSettings(image="registry.example/ampflow:1.2.3", workers=4, gpu=gpu,
                                 claim="my-claim", mount="/data")
        job = build_tfjob("ampflow-train-0123456789", settings,
                          ["--data-dir", "/data/x", "--output-dir", "/data/y"], template)
        validate(job)
        pod = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
        assert job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 4
        assert pod["containers"][0]["image"] == "registry.example/ampflow:1.2.3"
        assert pod["containers"][0]["args"][:2] == ["train", "--data-dir"]
        assert ("nvidia.com/gpu" in pod["containers"][0]["resources"]["limits"]) is gpu
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "my-claim"
        workloads = [{"kind": "Deployment", "metadata": {"name": "job"},
                      "spec": {"template": {"spec": pod}}}]
        assert security_context_problems(workloads) == []


def test_launcher_rbac_is_least_privilege(render):
    objects = render("training/rbac")[1]
    role = one(objects, "Role")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"])
             for r in role["rules"]}
    assert rules == {
        (("kubeflow.org",), ("tfjobs",)): {"create", "get", "delete"},
        (("",), ("pods",)): {"get", "list"},
        (("",), ("pods/log",)): {"get"},
    }
    binding = one(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # bound to the account KFP's pods really run as (standalone: kubeflow:pipeline-runner,
    # backend/src/apiserver/common/const.go@2.17.0 L59), not to an account no pod uses
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}]
    assert {o["kind"] for o in objects} == {"Role", "RoleBinding"}


def test_tfjob_workers_are_kept_from_the_cluster_autoscaler(render):
    tfjob = one(render("training/tfjob")[1], "TFJob")
    template = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    assert template["metadata"]["annotations"][
        "cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


@pytest.mark.parametrize("target", ["training/tfjob", "training/trainer-v2"])
def test_training_pods_take_their_image_from_the_kustomization(render, kubectl, target,
                                                                tmp_path):
    """The image is set in one place, kustomize `images:`; no unpullable placeholder is baked in.

    It was `ghcr.io/ampflow/ampflow:0.1.0` in each manifest, an image nobody can pull.
    """
    def images(objects):
        return sorted({c["image"] for o in objects for c in _containers(o)})

    assert images(render(target)[1]) == ["ampflow:local"]  # `docker build -t ampflow:local .`
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(K8S_DIR / target, overlay)],
        "images": [{"name": "ampflow", "newName": "registry.example/ampflow",
                    "newTag": "1.2.3"}]}))
    proc = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert images([d for d in yaml.safe_load_all(proc.stdout) if d]) == [
        "registry.example/ampflow:1.2.3"]


def _containers(obj):
    """Every container spec anywhere in `obj` (a TFJob's, a runtime's nested pod template)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict) and "image" in c)
            else:
                yield from _containers(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _containers(item)
