"""Deploy to KServe: the `ampflow` ServingRuntime and one InferenceService, with a canary share.

The objects are `kubectl kustomize k8s/kserve` made specific to the deployed model in Python
(namespace, prefix, image, storage URI, version, canary percent). Checks run before anything
changes; a rollout lock keeps two deploys of one InferenceService apart; a revision that never
becomes Ready for this spec, or answers wrongly, is rolled back to the spec that was live. The
steps, TFLite and bfloat16 versions: docs/explanation/design-notes.md, "kserve_target.py".
"""

from __future__ import annotations

import contextlib
import copy
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

from ampflow.components.deploy_serving import model_store
from ampflow.components.deploy_serving.config import DeployConfig, DeployResult, Payload
from ampflow.components.deploy_serving.kubernetes_cluster import FIELD_MANAGER, Cluster
from ampflow.components.deploy_serving.kubernetes_render import (
    NAME_ANNOTATION,
    VERSION_ANNOTATION,
    kubectl_path,
    one,
)
from ampflow.errors import ConfigError, DeployError
from ampflow.files import k8s_manifests_dir, yaml_documents
from ampflow.serving.model_format import parse_version_name

log = logging.getLogger(__name__)

GROUP = "serving.kserve.io"
ISVC_API, ISVC_KIND, ISVC_PLURAL = f"{GROUP}/v1beta1", "InferenceService", "inferenceservices"
RUNTIME_API, RUNTIME_KIND, RUNTIME_PLURAL = f"{GROUP}/v1alpha1", "ServingRuntime", "servingruntimes"
KIND_PLURALS = {ISVC_KIND: (ISVC_API, ISVC_PLURAL), RUNTIME_KIND: (RUNTIME_API, RUNTIME_PLURAL)}
MANIFESTS_SUBDIR = "kserve"
IMAGE_NAME = "ghcr.io/ampflow/ampflow"  # the image name k8s/kserve's runtime uses
SERVER_MODEL_DIR = "/mnt/models"  # where KServe mounts the storage URI in the predictor pod
RBAC_FIX = "kubectl apply -n {ns} -k k8s/kserve/rbac"
_POLL_S = 2.0
_API_DEADLINE_S = 15.0
_KUSTOMIZE_TIMEOUT_S = 60


def deploy(config: DeployConfig, model_name: str, version: int,
           spec: model_store.SignatureSpec, payload: Payload | None = None) -> DeployResult:
    """The kserve target of `run_deploy` (see the module docstring for the order).

    `payload`: what is published (default: the exported SavedModel); a TFLite variant is
    served by the same runtime under KServe's model format `tflite`, and checked with its own
    expected answers.
    """
    payload = payload or Payload(config.saved_model_dir)
    examples = None
    if config.server_address:  # read before anything changes: a missing file is one line
        from ampflow.components.deploy_serving import canary

        examples = payload.expected or canary.recorded_examples(config.saved_model_dir)
    cluster, claims = Cluster(config), contextlib.ExitStack()
    try:
        cluster.check_reachable()
        check_kserve_served(cluster.api_client)
        if not model_store.is_uri(str(config.model_store)):
            from ampflow.files import check_volume_writable

            check_volume_writable(config.model_store, f"the model store {config.model_store}")
        config = claims.enter_context(config.claimed(payload.source))
        version = config.resolved_version
        objects = release(render_manifests(config), config, model_name, version,
                          model_format=payload.model_format)
        isvc = one(objects, ISVC_KIND)
        # two deploys of one InferenceService at once would both read `before`, and a failing
        # one's restore would re-apply its stale `before` over the other's good version
        cluster.lock_rollout(isvc["metadata"]["name"], version, _lock_ttl_s(config),
                             kind=ISVC_KIND)
        try:
            before = read_inference_service(cluster.api_client, config.namespace,
                                            isvc["metadata"]["name"])
            dest = f"{str(config.model_store).rstrip('/')}/{model_name}/{version}"
            _push(config, dest, payload.source)
            for obj in objects:
                apply(cluster.api_client, obj, config.namespace)
            try:
                status = wait_ready(cluster.api_client, config.namespace,
                                    isvc["metadata"]["name"], config.rollout_timeout_s)
                served = version
                if examples is not None:
                    served = canary.check_version_served(
                        config.server_address, model_name, version, spec, examples,
                        timeout_s=config.canary_timeout_s, atol=config.canary_atol)
            except DeployError as e:
                _restore(cluster.api_client, config.namespace, before, e)
                raise
        finally:
            cluster.unlock_rollout()
    finally:
        cluster.close()
        claims.close()  # the version's claim, if taken
    previous = _version_of(before)
    share = latest_share(status)
    url = status.get("url") or (status.get("address") or {}).get("url")
    log.info("InferenceService %s/%s is Ready at %s: version %d has %s of the traffic",
             config.namespace, isvc["metadata"]["name"], url, version,
             "an unknown share" if share is None else f"{100 * share:.0f}%")
    return DeployResult(
        target="kserve", model_name=model_name, version=version, model_path=dest,
        endpoint=url, served_version=served, previous_version=previous, canary_share=share,
        promoted=share is not None and share >= 1.0, tflite_variant=payload.tflite_variant)


def _lock_ttl_s(config: DeployConfig) -> float:
    """How long the rollout lock holds: longer than any deploy of this config can take."""
    return 2 * config.rollout_timeout_s + config.canary_timeout_s + 300


# ---- the objects ---------------------------------------------------------------------------


def render_manifests(config: DeployConfig) -> list[dict[str, Any]]:
    """`kubectl kustomize <manifests>/kserve`, exactly as a person would render it."""
    directory = Path(config.manifests_dir or k8s_manifests_dir()) / MANIFESTS_SUBDIR
    if not (directory / "kustomization.yaml").is_file():
        raise ConfigError("manifests_dir (or $AMPFLOW_K8S_DIR) must hold kserve/"
                          f"kustomization.yaml. Received: no such file in {str(directory)!r}")
    try:
        proc = subprocess.run([kubectl_path(), "kustomize", str(directory)], capture_output=True,
                              text=True, timeout=_KUSTOMIZE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise DeployError(f"kubectl kustomize did not finish in {e.timeout}s") from e
    if proc.returncode != 0:
        raise DeployError(f"kubectl kustomize {directory} failed: {proc.stderr.strip()}")
    return [doc for doc in yaml_documents(proc.stdout) if doc]


def release(rendered: list[dict[str, Any]], config: DeployConfig, model_name: str,
            version: int, model_format: str = "tensorflow") -> list[dict[str, Any]]:
    """[ServingRuntime, InferenceService] of `rendered`, made to serve `version` of the model.

    `model_format`: the InferenceService's modelFormat, one the runtime lists (`tflite` for a
    version holding a TFLite variant; KServe refuses a runtime that does not list it).

    The claim k8s/kserve also renders is left out: it must exist already (this step writes the
    version into it), and leaving it out keeps the deploy step's Role to the two KServe kinds.
    """
    runtime = copy.deepcopy(one(rendered, RUNTIME_KIND))
    isvc = copy.deepcopy(one(rendered, ISVC_KIND))
    for obj in (runtime, isvc):
        obj["metadata"]["namespace"] = config.namespace
        obj["metadata"]["name"] = config.name_prefix + obj["metadata"]["name"]
    isvc["metadata"]["name"] = config.inference_service_name
    if config.image:
        for container in runtime["spec"]["containers"]:
            if container["image"].split("@")[0].rsplit(":", 1)[0] == IMAGE_NAME:
                container["image"] = config.image
    isvc["metadata"].setdefault("annotations", {}).update(
        {NAME_ANNOTATION: model_name, VERSION_ANNOTATION: str(version)})
    predictor = isvc["spec"]["predictor"]
    predictor["canaryTrafficPercent"] = config.canary_traffic_percent
    model = predictor["model"]
    model["runtime"] = runtime["metadata"]["name"]
    model["modelFormat"] = _supported_format(runtime, model_format)
    model["storageUri"] = storage_uri(config, model_name)
    model["args"] = [f"--model-name={model_name}", "--version-policy=specific",
                     f"--versions={version}"]
    if config.compute_precision != "float32":  # appended to the runtime's args by KServe
        model["args"].append(f"--compute-precision={config.compute_precision}")
        require_node_labels(predictor, config.bfloat16_node_selector)
    return [runtime, isvc]


def require_node_labels(pod: dict[str, Any], labels: tuple[tuple[str, str], ...]) -> None:
    """Let `pod` (a PodSpec, or KServe's predictor) run only on nodes with one of `labels`.

    Why: a bfloat16 version passed its parity gate on a CPU with native bfloat16, and only
    there is it fast; elsewhere `ampflow serve --compute-precision bfloat16` refuses to start.
    A required node affinity, one term per label: the scheduler ORs the terms (a nodeSelector
    can only AND). Terms the manifest already holds (an operator's own) still hold: each is
    combined with each of ours, so a node must meet one of theirs and one of ours.
    """
    if not labels:
        return
    ours = [{"key": key, "operator": "In", "values": [value]} for key, value in labels]
    required = (pod.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}))
    theirs = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchExpressions": [*term.get("matchExpressions", []), expression]}
        for term in theirs for expression in ours]


def _supported_format(runtime: dict[str, Any], name: str) -> dict[str, str]:
    """The runtime's supportedModelFormats entry `name` as a modelFormat; ConfigError if absent."""
    for entry in runtime["spec"].get("supportedModelFormats") or []:
        if entry.get("name") == name:
            return {k: entry[k] for k in ("name", "version") if k in entry}
    listed = [e.get("name") for e in runtime["spec"].get("supportedModelFormats") or []]
    raise ConfigError(f"the ServingRuntime {runtime['metadata']['name']} in k8s/kserve must list "
                      f"the model format {name!r}. Received: {listed}")


def storage_uri(config: DeployConfig, model_name: str) -> str:
    """Where KServe finds `<model_name>/`: in the bucket, or on the model store's claim."""
    store = str(config.model_store).rstrip("/")
    if model_store.is_uri(store):
        return f"{store}/{model_name}"
    return f"pvc://{config.model_store_claim}/{model_name}"


# ---- the API -------------------------------------------------------------------------------


def check_kserve_served(api_client) -> None:
    """Both KServe kinds are served by the API server; else one line saying KServe is missing.

    Read from discovery (/apis/<group>/<version>), which every authenticated user may read, so
    a missing CRD is told apart from missing permissions before anything is copied or applied.
    """
    for kind, (api_version, plural) in KIND_PLURALS.items():
        try:
            found = _call(api_client, "GET", f"/apis/{api_version}")
        except _ApiFailure as e:
            if e.status == 404:
                raise DeployError(_not_installed(api_version, kind)) from e
            raise DeployError(f"reading the API server's {api_version} kinds failed: "
                              f"{e.status} {e.reason}") from e
        if plural not in {r.get("name") for r in found.get("resources", [])}:
            raise DeployError(_not_installed(api_version, kind))


def _not_installed(api_version: str, kind: str) -> str:
    return (f"KServe is not installed in the cluster ({api_version} {kind} not found); "
            "install it first (docs/how-to/kserve.md). Nothing was changed.")


def apply(api_client, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """Server-side apply one KServe object as field manager `ampflow-deploy` (force)."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    api_version, plural = KIND_PLURALS[kind]
    path = f"/apis/{api_version}/namespaces/{namespace}/{plural}/{name}"
    try:
        stored = _call(api_client, "PATCH", path, body=obj,
                       query={"fieldManager": FIELD_MANAGER, "force": "true"},
                       content_type="application/apply-patch+yaml")
    except _ApiFailure as e:
        raise _kserve_error(f"applying {kind} {namespace}/{name}", e, "patch", plural,
                            namespace, api_version, kind) from e
    log.info("applied %s %s/%s", kind, namespace, name)
    return stored


def read_inference_service(api_client, namespace: str, name: str) -> dict[str, Any] | None:
    """The live InferenceService (with status), or None when there is none."""
    path = f"/apis/{ISVC_API}/namespaces/{namespace}/{ISVC_PLURAL}/{name}"
    try:
        return _call(api_client, "GET", path)
    except _ApiFailure as e:
        if e.status == 404:
            return None
        raise _kserve_error(f"reading InferenceService {namespace}/{name}", e, "get",
                            ISVC_PLURAL, namespace, ISVC_API, ISVC_KIND) from e


def wait_ready(api_client, namespace: str, name: str, timeout_s: float) -> dict[str, Any]:
    """The InferenceService's status once it is Ready for its current spec; else DeployError."""
    deadline = time.monotonic() + timeout_s
    while True:
        isvc = read_inference_service(api_client, namespace, name) or {}
        status = isvc.get("status") or {}
        generation = (isvc.get("metadata") or {}).get("generation")
        current = generation is None or status.get("observedGeneration") == generation
        ready = condition(status, "Ready")
        if current and ready.get("status") == "True":
            return status
        if time.monotonic() >= deadline:
            why = (f"{ready.get('reason') or 'no reason given'}: {ready.get('message') or ''}"
                   if ready else "no Ready condition yet")
            stale = "" if current else " (the controller has not seen the new spec yet)"
            raise DeployError(f"InferenceService {namespace}/{name} was not Ready within "
                              f"{timeout_s:g}s{stale}: {why.strip().rstrip(':')}")
        time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    """The status condition of type `kind` ({} when absent)."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def latest_share(status: dict[str, Any]) -> float | None:
    """The latest revision's share of the predictor's traffic (None when KServe gives none)."""
    traffic = ((status.get("components") or {}).get("predictor") or {}).get("traffic") or []
    for target in traffic:
        if target.get("latestRevision"):
            return float(target.get("percent", 0)) / 100.0
    return None


def _restore(api_client, namespace: str, before: dict[str, Any] | None,
             error: DeployError) -> None:
    """After a timeout: the InferenceService back to the spec that was live before."""
    if before is None:
        error.args = (f"{error}; this was its first deploy, so nothing served before and the "
                      "InferenceService is left for you to inspect (kubectl describe "
                      "inferenceservice)",)
        return
    previous = {"apiVersion": ISVC_API, "kind": ISVC_KIND,
                "metadata": {"name": before["metadata"]["name"], "namespace": namespace,
                             "annotations": before["metadata"].get("annotations") or {}},
                "spec": before["spec"]}
    try:
        apply(api_client, previous, namespace)
    except DeployError as e:
        error.args = (f"{error}; and re-applying the previous spec failed too: {e}",)
        return
    error.args = (f"{error}; rolled back: the spec of version {_version_of(before)} was "
                  "re-applied (its ready revision kept serving meanwhile)",)


def _version_of(isvc: dict[str, Any] | None) -> int | None:
    value = ((isvc or {}).get("metadata", {}).get("annotations") or {}).get(VERSION_ANNOTATION)
    return parse_version_name(value) if value else None


def _push(config: DeployConfig, dest: str, source: Path) -> None:
    """Copy the version into the model store (atomic on a volume, .pb last in a bucket)."""
    if model_store.is_uri(dest):
        model_store.push_uri(source, dest, config.to_dict())
    else:
        model_store.push_local(source, Path(dest), config.to_dict())


class _ApiFailure(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def _call(api_client, method: str, path: str, body: Any = None,
          query: dict[str, str] | None = None, content_type: str | None = None) -> dict:
    """One API request through the configured client (auth, TLS); JSON in, JSON out."""
    import json

    from kubernetes import client

    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    try:
        response = api_client.call_api(
            path, method, query_params=list((query or {}).items()), header_params=headers,
            body=body, auth_settings=["BearerToken"], _preload_content=False,
            _request_timeout=_API_DEADLINE_S)
    except client.ApiException as e:
        message = e.reason or ""
        try:
            message = json.loads(e.body or "{}").get("message") or message
        except ValueError:
            pass
        raise _ApiFailure(e.status, e.reason or "", message) from e
    except Exception as e:  # urllib3/socket errors: refused, timed out, reset
        reason = getattr(e, "reason", None) or e
        raise DeployError(f"{method} {path}: the Kubernetes API server did not answer "
                          f"({type(reason).__name__}: {reason})") from e
    return json.loads(response[0].data or b"{}")


def _kserve_error(what: str, e: _ApiFailure, verb: str, plural: str, namespace: str,
                  api_version: str, kind: str) -> DeployError:
    """A DeployError for a failed KServe request, naming the missing permission or kind."""
    if e.status == 403:
        return DeployError(
            f"{what} failed: 403 Forbidden: this identity may not {verb} {plural}.{GROUP} in "
            f"namespace {namespace} (RBAC: the deploy step needs get, create, patch on "
            f"{ISVC_PLURAL} and create, patch on {RUNTIME_PLURAL}: "
            f"{RBAC_FIX.format(ns=namespace)})")
    if e.status == 404 and verb != "get":
        return DeployError(f"{what} failed: 404 Not Found ({e.message}): does namespace "
                           f"{namespace} exist, and does the cluster serve {api_version} {kind}?")
    return DeployError(f"{what} failed: {e.status} {e.reason}: {e.message}")
