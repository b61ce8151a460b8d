"""Talking to the cluster: connect, server-side apply, read, and kubectl's rollout status/undo.

Writes go through the Kubernetes Python client (server-side apply as field manager
`ampflow-deploy`). Waiting for a rollout and undoing one are what `kubectl rollout status` and
`kubectl rollout undo` already do, exactly as operators know them (the Deployment's own status
conditions and revision history), so the step runs kubectl for those instead of re-implementing
them; kubectl gets the same kubeconfig and context, or finds the in-cluster service account.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ampflow.components.deploy_serving.config import DeployConfig
from ampflow.components.deploy_serving.kubernetes_render import kubectl_path
from ampflow.errors import DeployError

log = logging.getLogger(__name__)

FIELD_MANAGER = "ampflow-deploy"
ROLLOUT_LOCK_SUFFIX = "-rollout-lock"  # ConfigMap <stable Deployment>-rollout-lock
_API_DEADLINE_S = 15.0
_RELEASED = {"holder": "", "version": "", "expires_at": "0"}  # a lock anyone may take over
_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_namespace(default: str, path: str = _NAMESPACE_FILE) -> str:
    """The namespace of the pod this runs in (its service account's), else `default`."""
    try:
        return Path(path).read_text().strip() or default
    except OSError:
        return default


class Cluster:
    """One API connection plus the kubectl arguments that reach the same cluster."""

    def __init__(self, config: DeployConfig) -> None:
        self.config = config
        self.namespace = config.namespace
        self.api_client, self.host, self.kubeconfig = connect(config)

    def close(self) -> None:
        """Release the client's thread pool (it would outlive the step otherwise)."""
        if hasattr(self.api_client, "close"):
            self.api_client.close()

    def check_reachable(self) -> None:
        """GET /version within connect_timeout_s, or fail naming the endpoint (nothing changed)."""
        check_reachable(self.api_client, self.host, self.config.connect_timeout_s)

    def apply(self, objects: list[dict[str, Any]]) -> None:
        """Server-side apply every object as field manager `ampflow-deploy`."""
        from kubernetes import dynamic

        with tempfile.TemporaryDirectory(prefix="ampflow-discovery-") as cache:
            # its own discovery cache: the default one is left in /tmp, keyed by the server URL
            dyn = dynamic.DynamicClient(self.api_client,
                                        cache_file=os.path.join(cache, "discovery.json"))
            for obj in objects:
                _apply_one(dyn, obj, self.namespace)

    def lock_rollout(self, deployment: str, version: int, ttl_s: float,
                     kind: str = "Deployment") -> None:
        """Hold the rollout of `deployment` (a `kind`) in ConfigMap `<deployment>-rollout-lock`.

        Creating an object that exists is refused by the API server (409 AlreadyExists), so of
        two deploys that start at the same moment one holds the lock and the other fails here,
        naming the holder, before it changes anything. The ConfigMap is never deleted (the
        Role grants no delete: a name prefix changes its name): a lock past its `expires_at`
        (released, or left by a deploy that died) is taken over by a PATCH carrying the
        resourceVersion read, so of two takers only one succeeds (409 Conflict for the other).
        """
        from kubernetes import client

        name = deployment + ROLLOUT_LOCK_SUFFIX
        core = client.CoreV1Api(self.api_client)
        holder = {"holder": f"{socket.gethostname()}:{os.getpid()}", "version": str(version),
                  "expires_at": str(int(time.time() + ttl_s))}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "data": holder,
                "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by":
                                                      FIELD_MANAGER}}}
        for _attempt in range(2):
            try:
                created = core.create_namespaced_config_map(self.namespace, body,
                                                            _request_timeout=_API_DEADLINE_S)
                return self._hold(name, created.metadata.resource_version, deployment)
            except client.ApiException as e:
                if e.status != 409:
                    raise _api_error(f"creating ConfigMap {self.namespace}/{name}", e) from e
            found = self._read("ConfigMap", name, core.read_namespaced_config_map)
            if found is None:
                continue  # deleted by hand meanwhile: create it again
            expires = (found.data or {}).get("expires_at", "")
            if not expires.isdigit() or int(expires) > time.time():
                break
            taken = self._patch_lock(core, name, found.metadata.resource_version, holder)
            if taken is None:
                break  # another deploy took it over first
            log.warning("took over the expired rollout lock %s/%s of %s", self.namespace, name,
                        (found.data or {}).get("holder"))
            return self._hold(name, taken, deployment)
        raise DeployError(self._lock_held_message(core, name, f"{kind} {self.namespace}/"
                                                              f"{deployment}"))

    def _hold(self, name: str, resource_version: str, deployment: str) -> None:
        self._lock = (name, resource_version)
        log.info("holding the rollout of %s/%s (ConfigMap %s)", self.namespace, deployment, name)

    def unlock_rollout(self) -> None:
        """Release the lock `lock_rollout` took, only if it is still ours.

        Best effort: it expires anyway. Its resourceVersion is the precondition: a deploy that
        outlived its TTL, whose lock another deploy has taken over since, leaves that one's
        lock alone.
        """
        from kubernetes import client

        held, self._lock = getattr(self, "_lock", None), None
        if held is None:
            return
        name, resource_version = held
        core = client.CoreV1Api(self.api_client)
        try:
            if self._patch_lock(core, name, resource_version, _RELEASED) is None:
                log.warning("the rollout lock %s/%s was taken over by another deploy after "
                            "ours expired; leaving it to that one", self.namespace, name)
        except Exception as e:  # noqa: BLE001 - the lock expires; keep the deploy's own result
            log.warning("could not release the rollout lock %s/%s (%s); it expires on its own",
                        self.namespace, name, e)

    def _patch_lock(self, core, name: str, resource_version: str,
                    data: dict[str, str]) -> str | None:
        """Set the lock's data if it is still at `resource_version`.

        Returns the new resourceVersion, or None when it changed (409 Conflict) or is gone.
        """
        from kubernetes import client

        patch = {"metadata": {"resourceVersion": resource_version}, "data": data}
        try:
            patched = core.patch_namespaced_config_map(name, self.namespace, patch,
                                                       _request_timeout=_API_DEADLINE_S)
        except client.ApiException as e:
            if e.status in (404, 409):
                return None
            raise _api_error(f"patching the rollout lock {self.namespace}/{name}", e) from e
        return patched.metadata.resource_version

    def _lock_held_message(self, core, name: str, what: str) -> str:
        found = self._read("ConfigMap", name, core.read_namespaced_config_map)
        data = (found.data or {}) if found is not None else {}
        return (f"another deploy is rolling out {what} right "
                f"now (version {data.get('version', '?')}, by {data.get('holder', '?')}; lock "
                f"ConfigMap {name} until {data.get('expires_at', '?')} epoch s). Nothing was "
                f"changed: rerun when it is done (if no deploy is running: kubectl delete "
                f"configmap {name} -n {self.namespace})")

    def read_config_map(self, name: str) -> dict[str, Any] | None:
        """The ConfigMap as a dict, or None if it does not exist."""
        from kubernetes import client

        found = self._read("ConfigMap", name, client.CoreV1Api(self.api_client)
                           .read_namespaced_config_map)
        if found is None:
            return None
        return {"metadata": {"name": found.metadata.name}, "data": found.data or {}}

    def deployment_annotations(self, name: str) -> dict[str, str] | None:
        """The live Deployment's annotations ({} if none); None if it does not exist."""
        from kubernetes import client

        deployment = self._read("Deployment", name, client.AppsV1Api(self.api_client)
                                .read_namespaced_deployment)
        return None if deployment is None else dict(deployment.metadata.annotations or {})

    def ready_replicas(self, name: str) -> int:
        """Ready replicas of Deployment `name` (0 if it does not exist)."""
        from kubernetes import client

        found = self._read("Deployment", name, client.AppsV1Api(self.api_client)
                           .read_namespaced_deployment_status)
        return 0 if found is None else int(found.status.ready_replicas or 0)

    def _read(self, kind: str, name: str, read):
        """`read(name, namespace)` (a kubernetes client call); None when the object is absent.

        Any other API failure is a DeployError naming the object.
        """
        from kubernetes import client

        try:
            return read(name, self.namespace, _request_timeout=_API_DEADLINE_S)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise _api_error(f"reading {kind} {self.namespace}/{name}", e) from e

    def rollout_status(self, name: str) -> None:
        """`kubectl rollout status` of Deployment `name`; DeployError with the pods' reasons."""
        timeout = self.config.rollout_timeout_s
        proc = self._kubectl(["rollout", "status", f"deployment/{name}", "--watch=true",
                              f"--timeout={int(max(1, round(timeout)))}s"], timeout + 30)
        if proc.returncode != 0:
            why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            raise DeployError(f"rollout of Deployment {self.namespace}/{name} did not complete "
                              f"within {timeout:g}s: {why[-1] if why else 'kubectl failed'}"
                              f"{self.pod_problems(name)}")
        log.info("rollout of %s/%s complete", self.namespace, name)

    def rollout_undo(self, name: str, to_revision: str | None = None) -> None:
        """`kubectl rollout undo`: the Deployment back to a ReplicaSet's template.

        `to_revision` picks the revision (kubectl's default: the one before the current).
        """
        revision = [f"--to-revision={to_revision}"] if to_revision else []
        proc = self._kubectl(["rollout", "undo", f"deployment/{name}", *revision], 60)
        if proc.returncode != 0:
            raise DeployError(f"kubectl rollout undo deployment/{name} failed: "
                              f"{proc.stderr.strip() or proc.stdout.strip()}")
        log.info("%s", proc.stdout.strip())

    def pod_problems(self, name: str) -> str:
        """A short list of why the Deployment's pods are not ready (best effort)."""
        from kubernetes import client

        try:
            deployment = client.AppsV1Api(self.api_client).read_namespaced_deployment(
                name, self.namespace, _request_timeout=_API_DEADLINE_S)
            labels = deployment.spec.selector.match_labels or {}
            pods = client.CoreV1Api(self.api_client).list_namespaced_pod(
                self.namespace, label_selector=",".join(f"{k}={v}" for k, v in labels.items()),
                _request_timeout=_API_DEADLINE_S)
        except Exception:  # only a diagnostic: never hide the real error behind this one
            return ""
        problems = []
        for pod in pods.items:
            for cs in pod.status.container_statuses or []:
                state = cs.state.waiting or cs.state.terminated
                if state is not None and not cs.ready:
                    problems.append(f"{pod.metadata.name}: {state.reason} {state.message or ''}")
        return ("; pods: " + "; ".join(p.strip() for p in problems)) if problems else ""

    def _kubectl(self, args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
        cmd = [kubectl_path(), "--namespace", self.namespace,
               f"--request-timeout={int(max(1, round(_API_DEADLINE_S)))}s"]
        if self.kubeconfig is not None:
            cmd += ["--kubeconfig", str(self.kubeconfig)]
        if self.config.context:
            cmd += ["--context", self.config.context]
        try:
            return subprocess.run(cmd + args, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as e:
            raise DeployError(f"kubectl {' '.join(args[:2])} did not return in "
                              f"{e.timeout:g}s") from e


def connect(config: DeployConfig):
    """(ApiClient, host, kubeconfig file or None) for the configured cluster.

    From --kubeconfig/--context, $KUBECONFIG, ~/.kube/config or the in-cluster service account.
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
    return client.ApiClient(configuration), configuration.host, kubeconfig


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


def _api_error(what: str, e) -> DeployError:
    """A DeployError for an ApiException, with a hint for the usual causes."""
    hint = {
        403: " (RBAC: apply k8s/rbac in this namespace; its RoleBinding names the KFP runner's "
             "service account, pipeline-runner or a profile's default-editor, and "
             "ampflow-deployer for a workstation)",
        404: " (does the namespace exist? kubectl create namespace ...)",
    }.get(e.status, "")
    return DeployError(f"{what} failed: {e.status} {e.reason}{hint}")
