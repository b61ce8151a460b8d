"""A pipeline train task with `train_workers > 1` on a cluster: the training runs as a TFJob.

The task does not train. It puts the prepared data on the shared training claim, creates a
Kubeflow `TFJob` (k8s/training/tfjob/tfjob.yaml is the template: same image, security context,
claim, restart policy) through the Kubernetes API, polls it to the end, says why it failed (the
job's condition and each failed pod's exit code and reason), and copies the chief's published
model into the task's Model artifact. The Training Operator sets TF_CONFIG; the workers run the
same `ampflow train` as everywhere else.

The job name is derived from the KFP run id (a placeholder the driver resolves only as a
whole value, see pipeline/backend_rules.py), so a KFP retry of the task finds its own job: a
running one is waited for, a failed one is replaced, and the new one resumes from the
checkpoint dir on the claim; another run never finds it. A key KFP left unresolved is refused.

The job does not outlive its run: it is owned by the run's Argo Workflow (the controller
owner of this task's pod), so deleting the run deletes it, and a cancelled task (SIGTERM)
deletes it before exiting, freeing its GPUs. Permissions: k8s/training/rbac (create/get/delete
tfjobs, read pods and their logs), bound to the pipeline runner's service account.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ampflow.errors import AmpflowError, ConfigError
from ampflow.files import check_volume_writable

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
# Where and with what a train pod runs by default; the one home of these defaults, which
# PipelineOptions (the compile/submit flags) spells as text: GPU feature discovery's node
# label, the usual GPU taint, and the requests/limits of one train task or TFJob worker.
GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_LABEL = ("nvidia.com/gpu.present", "true")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TRAIN_CPU = ("4", "8")  # request, limit
TRAIN_MEMORY = ("16G", "32G")
_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_POLL_S = 10.0


class TrainingJobError(AmpflowError):
    """The TFJob could not be created, or it failed; the message says which pod and why."""


class TaskCancelled(TrainingJobError):
    """The launching task got SIGTERM (a cancelled run): its TFJob was deleted."""


@dataclass(frozen=True)
class TFJobSettings:
    """Compile-time settings of the TFJob a distributed pipeline train task creates."""

    image: str
    workers: int = 2
    claim: str = "ampflow-training"
    mount: str = "/mnt/ampflow"
    gpu: bool = True
    accelerator_type: str = GPU_RESOURCE
    accelerator_count: int = 1
    node_selector: tuple[str, str] | None = GPU_NODE_LABEL
    # A Kubernetes toleration (key, operator, value?, effect): PipelineOptions.toleration.
    toleration: dict[str, str] | None = field(default_factory=lambda: dict(GPU_TOLERATION))
    cpu_request: str = TRAIN_CPU[0]
    memory_request: str = TRAIN_MEMORY[0]
    cpu_limit: str = TRAIN_CPU[1]
    memory_limit: str = TRAIN_MEMORY[1]
    timeout_s: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ConfigError(f"workers must be >= 2 for a TFJob. Received: workers={self.workers}")
        if not self.mount.startswith("/"):
            raise ConfigError(f"mount must be an absolute path. Received: mount={self.mount!r}")

    def to_json(self) -> str:
        """The form the pipeline passes to the component."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TFJobSettings:
        """Inverse of `to_json`; a clear error for anything else."""
        try:
            raw = json.loads(text)
            for key in ("node_selector",):
                if raw.get(key) is not None:
                    raw[key] = tuple(raw[key])
            return cls(**raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"tfjob settings must be TFJobSettings JSON. Received: {text[:200]!r}"
                              f" ({e})") from e


def job_name(run_key: str) -> str:
    """A DNS-1035 name stable for one KFP run + task (so a retry finds its job)."""
    return "ampflow-train-" + hashlib.sha256(run_key.encode()).hexdigest()[:10]


def build_tfjob(name: str, settings: TFJobSettings, train_argv: list[str],
                template: dict | None = None) -> dict:
    """The TFJob for `train_argv` (`ampflow train` flags), from k8s/training/tfjob's manifest."""
    job = copy.deepcopy(template or load_template())
    job["metadata"]["name"] = name
    job["metadata"].setdefault("labels", {})["ampflow.dev/train-job"] = name
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    worker["replicas"] = settings.workers
    pod = worker["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "tensorflow")
    container["image"] = settings.image
    container["args"] = ["train", *train_argv]
    resources = {"requests": {"cpu": settings.cpu_request, "memory": settings.memory_request},
                 "limits": {"cpu": settings.cpu_limit, "memory": settings.memory_limit}}
    if settings.gpu:
        for part in resources.values():
            part[settings.accelerator_type] = str(settings.accelerator_count)
        pod["nodeSelector"] = dict([settings.node_selector]) if settings.node_selector else {}
        pod["tolerations"] = [dict(settings.toleration)] if settings.toleration else []
    else:
        pod.pop("nodeSelector", None)
        pod.pop("tolerations", None)
    container["resources"] = resources
    for volume in pod["volumes"]:
        if "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] = settings.claim
    for mount in container["volumeMounts"]:
        if mount["name"] == "training":
            mount["mountPath"] = settings.mount
    return job


def load_template() -> dict:
    """k8s/training/tfjob/tfjob.yaml (from $AMPFLOW_K8S_DIR in the image)."""
    from ampflow.files import k8s_manifests_dir

    path = k8s_manifests_dir() / "training" / "tfjob" / "tfjob.yaml"
    return yaml.safe_load(path.read_text())


def run_training_job(config, settings: TFJobSettings, run_key: str, api_client=None,
                     namespace: str | None = None):
    """Run `config` (a TrainConfig) as a TFJob and publish the chief's model in its output dir."""
    from ampflow.artifacts.model_dir import METADATA_FILE
    from ampflow.components.train.clusters.launcher import config_to_argv
    from ampflow.components.train.step import TrainResult
    from ampflow.files import ensure_writable_dir, read_json

    check_run_key(run_key)
    name = job_name(run_key)
    check_volume_writable(settings.mount, f"the training claim {settings.claim}")
    root = Path(settings.mount) / "runs" / name
    shared = dataclasses.replace(
        config, data_dir=root / "data", output_dir=root / "model", workers=1,
        launcher_port=None, cpus_per_worker=None,
        checkpoint_dir=config.checkpoint_dir or str(root / "checkpoints"))
    _stage_data(Path(config.data_dir), root / "data")
    if str(config.model).endswith(".keras"):  # a fine-tune: the workers read it from the claim
        shared = dataclasses.replace(shared, model=str(_stage_file(Path(config.model),
                                                                   root / "base_model.keras")))
    elif config.model_spec.kind == "checkpoint":  # a pretrained checkpoint dir: the same
        shared = dataclasses.replace(shared, model=str(_stage_dir(Path(config.model),
                                                                  root / "base_model")))
    if config.weights:  # an ImageNet weights file (an imported one is in this pod only)
        shared = dataclasses.replace(shared, weights=str(_stage_file(Path(config.weights),
                                                                     root / "weights.h5")))
    api_client = api_client or _in_cluster_client()
    namespace = namespace or _own_namespace()
    job = build_tfjob(name, settings, config_to_argv(shared))
    owner = owner_reference(api_client, namespace)
    if owner is not None:
        job["metadata"]["ownerReferences"] = [owner]
    with _delete_on_sigterm(api_client, namespace, name):
        _create_or_reuse(api_client, namespace, job)
        _wait(api_client, namespace, name, settings.timeout_s)
    published = root / "model"
    if not (published / METADATA_FILE).is_file():
        raise TrainingJobError(f"TFJob {namespace}/{name} succeeded but its chief published no "
                               f"model in {published}")
    output_dir = ensure_writable_dir(config.output_dir, "output_dir")
    for item in published.iterdir():
        target = output_dir / item.name
        if item.is_dir():
            shutil.copytree(item, target, dirs_exist_ok=True)
        elif item.name != METADATA_FILE:
            shutil.copy2(item, target)
    shutil.copy2(published / METADATA_FILE, output_dir / METADATA_FILE)  # last: publishes
    metadata = read_json(output_dir / METADATA_FILE)
    metadata["kubeflow_job"] = {"kind": "TFJob", "name": name, "namespace": namespace}
    return TrainResult(output_dir=output_dir, metadata=metadata)


def check_run_key(run_key: str) -> None:
    """A key with a placeholder left in it would name the same job in every run: refuse it."""
    if not run_key or "{{" in run_key:
        raise ConfigError(
            "run_key must be the run id KFP resolved (the whole-value placeholder "
            "{{$.pipeline_job_uuid}}); a placeholder left in it would give every run the same "
            f"TFJob. Received: run_key={run_key!r}")


def owner_reference(api_client, namespace: str) -> dict | None:
    """The ownerReference that ties the TFJob to this KFP run: the Workflow owning our pod.

    Falls back to the pod itself when it has no controller owner; None outside a pod (no
    HOSTNAME) or when the pod cannot be read (the job then lives until it is deleted).
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    pod_name = os.environ.get("HOSTNAME")
    if not pod_name:
        return None
    try:
        pod = client.CoreV1Api(api_client).read_namespaced_pod(pod_name, namespace)
    except ApiException as e:
        log.warning("cannot read this pod %s/%s (HTTP %s): the TFJob gets no owner and is "
                    "deleted only on SIGTERM or by hand", namespace, pod_name, e.status)
        return None
    for ref in pod.metadata.owner_references or []:
        if ref.controller:
            return {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name,
                    "uid": ref.uid}
    return {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
            "uid": pod.metadata.uid}


class _delete_on_sigterm:  # noqa: N801 - used as a context manager
    """While inside: SIGTERM (a cancelled run, Argo's stop) deletes the TFJob, then fails."""

    def __init__(self, api_client, namespace: str, name: str) -> None:
        self.api_client, self.namespace, self.name = api_client, namespace, name
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    def _on_sigterm(self, signum, frame) -> None:
        from kubernetes import client

        signal.signal(signal.SIGTERM, self.previous or signal.SIG_DFL)
        self.previous = None
        log.warning("SIGTERM: deleting TFJob %s/%s so that its pods and GPUs are freed",
                    self.namespace, self.name)
        try:
            _delete(client.CustomObjectsApi(self.api_client), self.namespace, self.name,
                    wait_s=0)
        except TrainingJobError as e:
            raise TaskCancelled(f"cancelled; deleting TFJob {self.namespace}/{self.name} "
                                f"failed: {e}") from e
        raise TaskCancelled(f"cancelled: TFJob {self.namespace}/{self.name} deleted")


def _stage_data(source: Path, target: Path) -> None:
    """Copy the prepared dataset onto the claim once (a retried task reuses it)."""
    if not (target / "dataset_info.json").is_file():
        _stage_dir(source, target)


def _stage_dir(source: Path, target: Path) -> Path:
    """Copy a directory onto the claim once, through a temp name (a retry reuses it whole)."""
    if not target.is_dir():
        staging = target.with_name(target.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging)
        os.replace(staging, target)
    return target


def _stage_file(source: Path, target: Path) -> Path:
    """Copy one file onto the claim once (through a temp name: a retry never sees half of it)."""
    if not target.is_file():
        staging = target.with_name(target.name + ".staging")
        shutil.copy2(source, staging)
        os.replace(staging, target)
    return target


def _create_or_reuse(api_client, namespace: str, job: dict) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)
    name = job["metadata"]["name"]
    try:
        existing = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as e:
        if e.status != 404:
            raise TrainingJobError(_api_error(e, f"read TFJob {namespace}/{name}")) from e
        existing = None
    if existing is not None:
        state, _ = job_state(existing)
        if state == "Failed":  # a retry of the task: replace the job, which then resumes
            log.info("TFJob %s/%s failed before; replacing it (it resumes from its "
                     "checkpoints)", namespace, name)
            _delete(api, namespace, name)
        else:
            log.info("TFJob %s/%s exists (%s): waiting for it", namespace, name, state)
            return
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    except ApiException as e:
        raise TrainingJobError(_api_error(e, f"create TFJob {namespace}/{name}")) from e
    log.info("created TFJob %s/%s with %d workers", namespace, name,
             job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"])


def _delete(api, namespace: str, name: str, wait_s: float = 300) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                            propagation_policy="Foreground")
    except ApiException as e:
        if e.status != 404:
            raise TrainingJobError(_api_error(e, f"delete TFJob {namespace}/{name}")) from e
    deadline = time.monotonic() + wait_s
    if wait_s <= 0:
        return
    while time.monotonic() < deadline:
        try:
            api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return
            raise TrainingJobError(_api_error(e, f"read TFJob {namespace}/{name}")) from e
        time.sleep(_POLL_S / 5)
    raise TrainingJobError(f"TFJob {namespace}/{name} was not deleted within {wait_s:g} s")


def job_state(job: dict) -> tuple[str, str]:
    """(state, message) from a TFJob's status: the last true condition of the operator's set."""
    conditions = (job.get("status") or {}).get("conditions") or []
    true = [c for c in conditions if str(c.get("status")) == "True"]
    for terminal in ("Failed", "Succeeded"):
        for c in true:
            if c.get("type") == terminal:
                return terminal, f"{c.get('reason', '')}: {c.get('message', '')}".strip(": ")
    if true:
        last = true[-1]
        return last.get("type", "Unknown"), last.get("message", "")
    return "Pending", "no status yet"


def _wait(api_client, namespace: str, name: str, timeout_s: float) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            job = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            raise TrainingJobError(_api_error(e, f"read TFJob {namespace}/{name}")) from e
        state, message = job_state(job)
        if (state, message) != last:
            log.info("TFJob %s/%s: %s %s", namespace, name, state, message)
            last = (state, message)
        if state == "Succeeded":
            return
        if state == "Failed":
            raise TrainingJobError(f"TFJob {namespace}/{name} failed: {message}"
                                   + _pod_failures(api_client, namespace, name))
        if time.monotonic() > deadline:
            raise TrainingJobError(f"TFJob {namespace}/{name} did not finish within "
                                   f"{timeout_s:g} s (last state: {state} {message})")
        time.sleep(_POLL_S)


def _pod_failures(api_client, namespace: str, name: str) -> str:
    """'; worker-1: exit 2 (Error): <last log line>' for each failed pod of the job."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    try:
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"training.kubeflow.org/job-name={name}").items
    except ApiException as e:
        return f" (pods unreadable: {e.reason})"
    parts = []
    for pod in pods:
        for status in (pod.status.container_statuses or []):
            terminated = (status.state and status.state.terminated) or (
                status.last_state and status.last_state.terminated)
            if terminated and terminated.exit_code:
                parts.append(f"{pod.metadata.name}: exit {terminated.exit_code} "
                             f"({terminated.reason})" + _log_tail(core, namespace, pod))
    return ("; " + "; ".join(parts)) if parts else ""


def _log_tail(core, namespace: str, pod) -> str:
    try:
        text = core.read_namespaced_pod_log(pod.metadata.name, namespace,
                                            container="tensorflow", tail_lines=20)
    except Exception:  # the log is a nicety; the exit code is already in the message
        return ""
    errors = [line for line in str(text).splitlines() if ": error: " in line]
    return f": {errors[-1].split(': error: ', 1)[1]}" if errors else ""


def _api_error(e, what: str) -> str:
    if e.status == 403:
        return (f"not allowed to {what} (HTTP 403): apply k8s/training/rbac in this namespace "
                "(its RoleBinding names the runner's service account: pipeline-runner, or "
                "default-editor in a Kubeflow profile)")
    if e.status == 404 and "create" in what:
        return (f"cannot {what} (HTTP 404): is the Kubeflow Training Operator (TFJob CRD, "
                "kubeflow.org/v1) installed?")
    return f"cannot {what}: HTTP {e.status} {e.reason}"


def _in_cluster_client():
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except kube_config.ConfigException as e:
        raise TrainingJobError(f"a TFJob needs the in-cluster Kubernetes API: {e}") from e
    return client.ApiClient(configuration)


def _own_namespace() -> str:
    try:
        return Path(_NAMESPACE_FILE).read_text().strip()
    except OSError:
        return "default"
