"""Deploy to Kubernetes: render the k8s/ overlay, server-side apply it, wait, canary, roll back.

The served version is pinned in the model ConfigMap (`model_version_policy { specific }`), whose
name carries kustomize's content hash. So a new version is a new pod template: the Deployment
rolls (maxUnavailable 0, new pods Ready only once the model is AVAILABLE), and going back is
applying the previous render again, which Kubernetes recognises as the previous ReplicaSet.

Nothing is copied or applied before the API server has answered within `connect_timeout_s`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from ampflow.components.deploy_serving import model_store
from ampflow.components.deploy_serving.config import DeployConfig, DeployResult
from ampflow.errors import ConfigError, DeployError

log = logging.getLogger(__name__)

FIELD_MANAGER = "ampflow-deploy"
BASE_NAME = "tf-serving"
VERSION_ANNOTATION = "ampflow.dev/model-version"
NAME_ANNOTATION = "ampflow.dev/model-name"
SERVER_VOLUME_BASE = "/models"  # where the Deployment mounts the model PVC
_POLL_S = 2.0
_KUSTOMIZE_TIMEOUT_S = 60
_API_DEADLINE_S = 15.0


def default_manifests_dir() -> Path:
    """$AMPFLOW_K8S_DIR (set in the image), else the repo's k8s/ (an editable install)."""
    if os.environ.get("AMPFLOW_K8S_DIR"):
        return Path(os.environ["AMPFLOW_K8S_DIR"])
    return Path(__file__).resolve().parents[2] / "k8s"


def deploy(
    config: DeployConfig, model_name: str, version: int, spec: model_store.SignatureSpec
) -> DeployResult:
    """The kubernetes target of `run_deploy` (see the module docstring for the order)."""
    api_client, host = connect(config)
    try:
        return _deploy_with(api_client, host, config, model_name, version, spec)
    finally:
        if hasattr(api_client, "close"):
            api_client.close()  # its thread pool would outlive the step otherwise


def _deploy_with(
    api_client, host: str, config: DeployConfig, model_name: str, version: int, spec
) -> DeployResult:
    """Check, render, push, apply, wait, canary; roll back on a failure after the push."""
    check_reachable(api_client, host, config.connect_timeout_s)
    objects = render(config, model_name, version)  # render errors also precede any change
    deployment = _object(objects, "Deployment")
    name = deployment["metadata"]["name"]
    previous = live_version(api_client, config.namespace, name)
    dest = f"{config.model_store.rstrip('/')}/{model_name}/{version}"
    _push(config, dest)
    endpoint = config.server_address or _service_address(config, objects)
    try:
        apply(api_client, objects, config.namespace)  # a partial apply is rolled back too
        wait_rollout(api_client, config.namespace, name, config.rollout_timeout_s)
        from ampflow.components.deploy_serving import canary

        served = canary.check_version_served(
            endpoint, model_name, version, spec, timeout_s=config.canary_timeout_s
        )
    except DeployError as e:
        _roll_back(config, api_client, name, previous, (model_name, version), e)
        raise
    except Exception as e:  # client/transport errors (unknown kind, urllib3 timeouts) too
        error = DeployError(f"deploying version {version} failed: {type(e).__name__}: {e}")
        _roll_back(config, api_client, name, previous, (model_name, version), error)
        raise error from e
    return DeployResult(
        target="kubernetes",
        model_name=model_name,
        version=version,
        model_path=dest,
        endpoint=endpoint,
        served_version=served,
        previous_version=previous[1] if previous else None,
    )


def connect(config: DeployConfig):
    """An ApiClient from --kubeconfig/--context, $KUBECONFIG, ~/.kube/config or in-cluster.

    Retries are off: a down API server must fail in `connect_timeout_s`, not after urllib3's
    three silent retries.
    """
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    kubeconfig = config.kubeconfig or _default_kubeconfig()
    try:
        if kubeconfig is not None:
            kube_config.load_kube_config(
                config_file=str(kubeconfig),
                context=config.context,
                client_configuration=configuration,
                persist_config=False,
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            raise DeployError(
                "no Kubernetes configuration found: tried --kubeconfig, $KUBECONFIG, "
                "~/.kube/config and the in-cluster service account. Point at a cluster with "
                "--kubeconfig PATH [--context NAME]."
            )
    except kube_config.ConfigException as e:
        raise DeployError(
            f"cannot load Kubernetes configuration from {kubeconfig or 'in-cluster'}: {e}. "
            "Point at a cluster with --kubeconfig PATH [--context NAME]."
        ) from e
    configuration.retries = 0
    return client.ApiClient(configuration), configuration.host


def _default_kubeconfig() -> Path | None:
    """$KUBECONFIG (first entry) or ~/.kube/config, if present."""
    env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    for candidate in (env, os.path.expanduser("~/.kube/config")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def check_reachable(api_client, host: str, timeout_s: float) -> None:
    """GET /version within `timeout_s`, or fail naming the endpoint and how to change it."""
    from kubernetes import client

    try:
        # raw response: any 200 proves reachability; no need to parse the version model
        client.VersionApi(api_client).get_code(_request_timeout=timeout_s, _preload_content=False)
    except client.ApiException as e:
        if e.status in (401, 403):
            raise DeployError(
                f"the Kubernetes API server at {host} refused our credentials "
                f"({e.status} {e.reason}); check --kubeconfig/--context. Nothing was changed."
            ) from e
        raise DeployError(
            f"the Kubernetes API server at {host} answered {e.status} {e.reason}"
        ) from e
    except Exception as e:  # urllib3/socket errors: connection refused, timeout, DNS, TLS
        reason = getattr(e, "reason", None) or e
        raise DeployError(
            f"cannot reach the Kubernetes API server at {host} within {timeout_s:g}s "
            f"({type(reason).__name__}: {reason}). Nothing was changed. Point at a reachable "
            "cluster with --kubeconfig PATH and --context NAME (or run inside the cluster)."
        ) from e


def render(config: DeployConfig, model_name: str, version: int) -> list[dict[str, Any]]:
    """`kubectl kustomize` the overlay with namespace, prefix, image and the pinned version."""
    manifests = Path(config.manifests_dir or default_manifests_dir())
    overlay = manifests / "overlays" / config.overlay
    if not (overlay / "kustomization.yaml").is_file():
        raise ConfigError(
            "manifests_dir (or $AMPFLOW_K8S_DIR) must hold overlays/<overlay>/kustomization.yaml."
            f" Received: manifests_dir={str(manifests)!r} (no {config.overlay} overlay there)"
        )
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if kubectl is None:
        raise DeployError(
            "rendering needs `kubectl` (with its built-in kustomize): put it on PATH or set "
            "$KUBECTL. Received: not found. Nothing was changed."
        )
    with tempfile.TemporaryDirectory(prefix="ampflow-render-") as tmp:
        _write_kustomization(Path(tmp), config, manifests, model_name, version)
        try:
            proc = subprocess.run(
                [kubectl, "kustomize", tmp],
                capture_output=True,
                text=True,
                timeout=_KUSTOMIZE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise DeployError(f"kubectl kustomize did not finish in {e.timeout}s") from e
    if proc.returncode != 0:
        raise DeployError(f"kubectl kustomize {overlay} failed: {proc.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def server_model_base(config: DeployConfig) -> str:
    """Where the servers find the store: the URI itself, or the PVC's mount point."""
    if config.server_model_base:
        return config.server_model_base.rstrip("/")
    store = str(config.model_store)
    return store.rstrip("/") if model_store.is_uri(store) else SERVER_VOLUME_BASE


def models_config(name: str, base_path: str, version: int) -> str:
    """The ModelServerConfig text proto that serves exactly `version` of `name`."""
    return (
        "# Written by ampflow deploy: serves exactly one version (a rollback re-pins the old).\n"
        "model_config_list {\n"
        "  config {\n"
        f'    name: "{name}"\n'
        f'    base_path: "{base_path}/{name}"\n'
        '    model_platform: "tensorflow"\n'
        f"    model_version_policy {{ specific {{ versions: {version} }} }}\n"
        "  }\n"
        "}\n"
    )


def _write_kustomization(
    tmp: Path, config: DeployConfig, manifests: Path, model_name: str, version: int
) -> None:
    """A throw-away overlay on top of the chosen one; only the models.config file is new."""
    (tmp / "models.config").write_text(
        models_config(model_name, server_model_base(config), version)
    )
    rel = os.path.relpath(manifests.resolve(), tmp.resolve())
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": config.namespace,
        "resources": [f"{rel}/overlays/{config.overlay}"],
        "configMapGenerator": [
            {"name": "tf-serving-config", "behavior": "merge", "files": ["models.config"]}
        ],
        "patches": [
            {
                "target": {"kind": "Deployment", "name": BASE_NAME},
                "patch": yaml.safe_dump(
                    [
                        _annotate(VERSION_ANNOTATION, str(version)),
                        _annotate(NAME_ANNOTATION, model_name),
                    ]
                ),
            }
        ],
    }
    if config.name_prefix:
        kustomization["namePrefix"] = config.name_prefix
    if model_store.is_uri(str(config.model_store)):
        kustomization["components"] = [f"{rel}/components/object-store"]
    if config.image:
        kustomization["images"] = [_image_override(config.image)]
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))


def _annotate(key: str, value: str) -> dict[str, Any]:
    """A JSON-patch op adding one Deployment annotation ('/' escaped as '~1')."""
    return {"op": "add", "path": f"/metadata/annotations/{key.replace('/', '~1')}", "value": value}


def _image_override(image: str) -> dict[str, str]:
    """Kustomize `images:` entry replacing tensorflow/serving with `image` (tag or digest)."""
    entry = {"name": "tensorflow/serving"}
    if "@" in image:
        entry["newName"], entry["digest"] = image.split("@", 1)
    elif ":" in image.rsplit("/", 1)[-1]:
        entry["newName"], entry["newTag"] = image.rsplit(":", 1)
    else:
        entry["newName"] = image
    return entry


def _object(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one rendered object of `kind`."""
    found = [o for o in objects if o.get("kind") == kind]
    if len(found) != 1:
        raise DeployError(f"expected one {kind} in the rendered manifests. Received: {len(found)}")
    return found[0]


def _service_address(config: DeployConfig, objects: list[dict[str, Any]]) -> str:
    """The in-cluster gRPC address of the rendered Service."""
    service = _object(objects, "Service")
    return f"{service['metadata']['name']}.{config.namespace}.svc:8500"


def live_version(api_client, namespace: str, name: str) -> tuple[str, int] | None:
    """(model name, version) the live Deployment serves now, from our annotations; or None."""
    from kubernetes import client

    try:
        deployment = client.AppsV1Api(api_client).read_namespaced_deployment(
            name, namespace, _request_timeout=_API_DEADLINE_S
        )
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise _api_error(f"reading Deployment {namespace}/{name}", e) from e
    annotations = deployment.metadata.annotations or {}
    version = annotations.get(VERSION_ANNOTATION, "")
    model = annotations.get(NAME_ANNOTATION)
    return (model, int(version)) if model and version.isdigit() else None


def apply(api_client, objects: list[dict[str, Any]], namespace: str) -> None:
    """Server-side apply every object as field manager `ampflow-deploy`."""
    from kubernetes import dynamic

    with tempfile.TemporaryDirectory(prefix="ampflow-discovery-") as cache:
        # its own discovery cache: the default one is left in /tmp, keyed by the server URL
        dyn = dynamic.DynamicClient(api_client, cache_file=os.path.join(cache, "discovery.json"))
        for obj in objects:
            _apply_one(dyn, obj, namespace)


def _apply_one(dyn, obj: dict[str, Any], namespace: str) -> None:
    """Server-side apply one object (force: we own the fields we set, e.g. after kubectl edit)."""
    from kubernetes import client

    kind, name = obj["kind"], obj["metadata"]["name"]
    try:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=kind)
        dyn.server_side_apply(
            resource,
            body=obj,
            namespace=namespace if resource.namespaced else None,
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            _request_timeout=_API_DEADLINE_S,
        )
    except client.ApiException as e:
        raise _api_error(f"applying {kind} {namespace}/{name}", e) from e
    log.info("applied %s %s/%s", kind, namespace, name)


def wait_rollout(api_client, namespace: str, name: str, timeout_s: float) -> None:
    """Wait until every replica runs the new template and is available, or fail with why."""
    from kubernetes import client

    apps = client.AppsV1Api(api_client)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            deployment = apps.read_namespaced_deployment_status(
                name, namespace, _request_timeout=_API_DEADLINE_S
            )
        except client.ApiException as e:
            raise _api_error(f"reading Deployment {namespace}/{name}", e) from e
        done, why = rollout_state(deployment)
        if done:
            log.info("rollout of %s/%s complete", namespace, name)
            return
        if why.startswith("ProgressDeadlineExceeded") or time.monotonic() >= deadline:
            raise DeployError(
                f"rollout of Deployment {namespace}/{name} did not complete within "
                f"{timeout_s:g}s: {why}{_pod_problems(api_client, namespace, deployment)}"
            )
        time.sleep(_POLL_S)


def rollout_state(deployment) -> tuple[bool, str]:
    """(complete?, what is missing) from a Deployment's status, as `kubectl rollout status`."""
    status, want = deployment.status, deployment.spec.replicas or 0
    for condition in status.conditions or []:
        if condition.type == "Progressing" and condition.reason == "ProgressDeadlineExceeded":
            return False, f"ProgressDeadlineExceeded: {condition.message}"
    if (status.observed_generation or 0) < (deployment.metadata.generation or 0):
        return False, "the controller has not seen the new spec yet"
    updated, total = status.updated_replicas or 0, status.replicas or 0
    available = status.available_replicas or 0
    if updated < want:
        return False, f"{updated}/{want} replicas updated"
    if total > updated:
        return False, f"{total - updated} old replicas still running"
    if available < updated:
        return False, f"{available}/{updated} updated replicas available"
    return True, "complete"


def _pod_problems(api_client, namespace: str, deployment) -> str:
    """A short list of why the Deployment's pods are not ready (best effort)."""
    from kubernetes import client

    labels = deployment.spec.selector.match_labels or {}
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    try:
        pods = client.CoreV1Api(api_client).list_namespaced_pod(
            namespace, label_selector=selector, _request_timeout=_API_DEADLINE_S
        )
    except Exception:  # only a diagnostic: never hide the real error behind this one
        return ""
    problems = []
    for pod in pods.items:
        for cs in pod.status.container_statuses or []:
            state = cs.state.waiting or cs.state.terminated
            if state is not None and not cs.ready:
                problems.append(f"{pod.metadata.name}: {state.reason} {state.message or ''}")
    return ("; pods: " + "; ".join(p.strip() for p in problems)) if problems else ""


def _roll_back(
    config: DeployConfig,
    api_client,
    name: str,
    previous: tuple[str, int] | None,
    new: tuple[str, int],
    error: DeployError,
) -> None:
    """Re-apply the previous version's render, so the previous version keeps serving."""
    if previous is None or previous == new:
        log.error("deploy failed and there is no previous version to roll back to: %s", error)
        return
    log.error("deploy of %s version %d failed; rolling back to version %d", *new, previous[1])
    try:
        apply(api_client, render(config, *previous), config.namespace)
        wait_rollout(api_client, config.namespace, name, config.rollout_timeout_s)
    except Exception as e:  # noqa: BLE001 (report any rollback failure, keep the first error)
        error.args = (f"{error}; and the rollback to version {previous[1]} failed too: {e}",)
        return
    error.args = (f"{error}; rolled back: version {previous[1]} is serving",)


def _push(config: DeployConfig, dest: str) -> None:
    """Copy the version into the model store (atomic on a volume, .pb last in a bucket)."""
    record = config.to_dict()
    if model_store.is_uri(dest):
        model_store.push_uri(config.saved_model_dir, dest, record)
    else:
        model_store.push_local(config.saved_model_dir, Path(dest), record)


def _api_error(what: str, e) -> DeployError:
    """A DeployError for an ApiException, with a hint for the usual causes."""
    hint = {
        403: " (RBAC: apply k8s/rbac and run as the ampflow-deployer ServiceAccount)",
        404: " (does the namespace exist? kubectl create namespace ...)",
    }.get(e.status, "")
    return DeployError(f"{what} failed: {e.status} {e.reason}{hint}")
