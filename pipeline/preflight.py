"""What a run needs from the cluster, checked by `ampflow submit` before it sends anything.

A stock KFP install (standalone or multi-user) lacks what some runs need: the claims the tasks
mount (a pod that mounts a missing claim stays Pending, with nothing in the run's log), the
Roles that let the runner's service account create a TFJob or deploy TF Serving or a KServe
InferenceService, KServe itself (its kinds in the API server's discovery), and on a 2.15 or
2.16 backend a storage class for the run's workspace. Each missing piece is one line that
says how to add it. What cannot be checked (no kubeconfig; not allowed to impersonate the
runner) is logged, and the run is sent anyway.

Who runs the pods (backend/src/apiserver/common/const.go@2.17.0 L59 and the multi-user
profile controller): standalone, `pipeline-runner` in `kubeflow`; multi-user, `default-editor`
in the profile namespace. The backend's version and mode come from its healthz endpoint
(`tag_name`, `multi_user`: backend/src/apiserver/main.go@2.17.0 L465-490).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ampflow.pipeline.backend_rules import backend_series

log = logging.getLogger(__name__)

STANDALONE_NAMESPACE = "kubeflow"
STANDALONE_RUNNER = "pipeline-runner"
PROFILE_RUNNER = "default-editor"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
SERVING_CLIENTS_LABEL = "ampflow.dev/serving-clients"  # k8s/base/networkpolicy.yaml
TRAIN_BUDGET = "ampflow-train"  # k8s/pipeline/pdb.yaml
KSERVE_RBAC_FILE = "kserve/rbac/rbac.yaml"  # under k8s/: what the kserve target's deploy needs
KSERVE_ROLE = "ampflow-kserve-deployer"
_DEADLINE_S = 10.0


@dataclass(frozen=True)
class Backend:
    """The KFP API server as its healthz endpoint describes it."""

    tag: str | None = None
    multi_user: bool = False

    @property
    def series(self) -> str | None:
        """'2.15', '2.16', '2.17' (newer counts as 2.17), None when unknown."""
        return backend_series(self.tag)


@dataclass(frozen=True)
class Access:
    """One permission the runner needs: `verb` on `group/resource` in `namespace`."""

    namespace: str
    verb: str
    group: str
    resource: str
    fix: str


@dataclass(frozen=True)
class Needs:
    """What one run needs from the cluster."""

    namespace: str
    runner: tuple[str, str]  # (namespace, service account)
    claims: tuple[tuple[str, str], ...] = ()  # (claim, how to create it)
    access: tuple[Access, ...] = ()
    problems: tuple[str, ...] = field(default=())  # found without asking the cluster
    served: tuple[tuple[str, str, str], ...] = ()  # (apiVersion, plural, how to get it served)


def read_backend(host: str, token: str | None, timeout_s: float) -> Backend:
    """GET /apis/v2beta1/healthz; an unreadable answer is an unknown backend, not an error."""
    request = urllib.request.Request(f"{host.rstrip('/')}/apis/v2beta1/healthz")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read() or b"{}")
    except (OSError, ValueError):
        return Backend()
    tag = body.get("tag_name") if isinstance(body, dict) else None
    return Backend(tag=None if tag in (None, "", "unknown") else str(tag),
                   multi_user=bool(isinstance(body, dict) and body.get("multi_user")))


def run_needs(options, arguments: dict, namespace: str, multi_user: bool,
              runner_service_account: str | None = None) -> Needs:
    """The claims and permissions a run of `options` with `arguments` needs in `namespace`."""
    from ampflow.pipeline.distributed_task import TRAINING_CLAIM

    runner = (namespace, runner_service_account or (
        PROFILE_RUNNER if multi_user else STANDALONE_RUNNER))
    claims, access, problems = [], [], []
    if options.train_workers > 1:
        claims.append((TRAINING_CLAIM, f"kubectl apply -n {namespace} -k k8s/training/common"))
        fix = f"kubectl apply -n {namespace} -k k8s/training/rbac" + (
            "" if runner == (STANDALONE_NAMESPACE, STANDALONE_RUNNER) else
            f" and bind Role ampflow-train-launcher to {runner[0]}:{runner[1]}")
        for verb in ("create", "get", "delete"):
            access.append(Access(namespace, verb, "kubeflow.org", "tfjobs", fix))
        access.append(Access(namespace, "get", "", "pods", fix))
    target = arguments.get("serving_target")
    if target in ("kubernetes", "kserve"):
        serving = options.serving_namespace or namespace
        _model_store_needs(options, arguments, serving, claims, problems)
        needs = _kserve_access if target == "kserve" else _kubernetes_access
        access += needs(serving, runner)
    return Needs(namespace=namespace, runner=runner, claims=tuple(claims),
                 access=tuple(access), problems=tuple(problems),
                 served=_kserve_kinds() if target == "kserve" else ())


def _model_store_needs(options, arguments: dict, serving: str, claims: list,
                       problems: list) -> None:
    """The model-store claim the deploy task mounts, or a gs:// store when it mounts none.

    A mounted claim is in the serving namespace: pipeline.py mounts none for another one.
    """
    from ampflow.components.deploy_serving.config import MODEL_STORE_MOUNT

    store = str(arguments.get("serving_model_store", MODEL_STORE_MOUNT))
    if options.model_store_pvc:
        claims.append((options.model_store_pvc,
                       f"kubectl apply -n {serving} -k k8s/model-store"))
    elif not store.startswith("gs://"):
        problems.append(
            f"serving_model_store={store!r} is a directory, but the deploy task mounts no "
            "model-store claim (model_store_pvc=None): use gs://bucket/path")


def _kubernetes_access(serving: str, runner: tuple[str, str]) -> list[Access]:
    """What the kubernetes target's deploy does: k8s/rbac's Role `ampflow-deployer`."""
    fix = {STANDALONE_NAMESPACE: "kubectl apply -k k8s/rbac-kubeflow",
           "ampflow": "kubectl apply -k k8s/rbac"}.get(  # k8s/rbac sets namespace ampflow
        serving, f"kubectl kustomize k8s/rbac | sed 's/namespace: ampflow$/namespace: "
                 f"{serving}/' | kubectl apply -f -")
    if runner not in ((STANDALONE_NAMESPACE, STANDALONE_RUNNER), (serving, "ampflow-deployer")):
        fix += (f" and kubectl -n {serving} create rolebinding ampflow-deployer-kfp "
                f"--role=ampflow-deployer --serviceaccount={runner[0]}:{runner[1]}")
    return [Access(serving, verb, group, resource, fix)
            for verb, group, resource in (("patch", "apps", "deployments"),
                                          ("create", "apps", "deployments"),
                                          ("watch", "apps", "deployments"),
                                          ("patch", "", "configmaps"),
                                          ("patch", "", "services"),
                                          ("patch", "networking.k8s.io", "networkpolicies"))]


def _kserve_access(serving: str, runner: tuple[str, str]) -> list[Access]:
    """What the kserve target's deploy does: every grant of k8s/kserve/rbac's Role.

    Read from the file itself, one source: tests/components/deploy_serving ties that Role to
    the requests the deploy makes.
    """
    from ampflow.components.deploy_serving.kserve_target import RBAC_FIX

    fix = RBAC_FIX.format(ns=serving)
    if runner not in ((STANDALONE_NAMESPACE, STANDALONE_RUNNER), (serving, "ampflow-deployer")):
        fix += (f" and kubectl -n {serving} create rolebinding {KSERVE_ROLE}-kfp "
                f"--role={KSERVE_ROLE} --serviceaccount={runner[0]}:{runner[1]}")
    return [Access(serving, verb, group, resource, fix)
            for group, resource, verb in kserve_role_rules()]


def _kserve_kinds() -> tuple[tuple[str, str, str], ...]:
    """KServe's two kinds the deploy applies, each served under its own API version."""
    from ampflow.components.deploy_serving.kserve_target import KIND_PLURALS

    return tuple((api_version, plural, f"install KServe in the cluster, whose CRDs define {kind} "
                                       "(docs/how-to/kserve.md)")
                 for kind, (api_version, plural) in KIND_PLURALS.items())


def kserve_role_rules() -> list[tuple[str, str, str]]:
    """(group, resource, verb) of each grant of k8s/kserve/rbac's Role, in the file's order."""
    import yaml

    from ampflow.errors import ConfigError
    from ampflow.files import k8s_manifests_dir, yaml_documents

    path = k8s_manifests_dir() / KSERVE_RBAC_FILE
    try:
        documents = yaml_documents(path.read_text())
        (role,) = [d for d in documents if d and d.get("kind") == "Role"
                   and d["metadata"]["name"] == KSERVE_ROLE]
    except (OSError, yaml.YAMLError, ValueError, KeyError) as e:
        raise ConfigError(f"$AMPFLOW_K8S_DIR (or the repo's k8s/) must hold {KSERVE_RBAC_FILE} "
                          f"with Role {KSERVE_ROLE}. Received: {path} ({e})") from e
    return [(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]]


def kube_client(kubeconfig: str | os.PathLike | None = None, context: str | None = None):
    """An ApiClient for the cluster KFP runs on; None when no configuration is found.

    From --kubeconfig/--context, $KUBECONFIG, ~/.kube/config or the in-cluster account.
    """
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    path = kubeconfig or next((c for c in (os.environ.get("KUBECONFIG", "").split(os.pathsep)[0],
                                            str(Path("~/.kube/config").expanduser()))
                               if c and Path(c).is_file()), None)
    try:
        if path:
            kube_config.load_kube_config(config_file=str(path), context=context,
                                         client_configuration=configuration,
                                         persist_config=False)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            return None
    except kube_config.ConfigException as e:
        from ampflow.errors import ConfigError

        raise ConfigError(f"kubeconfig must point at the KFP cluster. Received: "
                          f"{path or 'in-cluster'} ({e})") from e
    configuration.retries = 0
    return client.ApiClient(configuration)


def default_storage_class(api_client) -> str | None:
    """The cluster's default StorageClass (the annotated one), or None."""
    from kubernetes import client

    classes = client.StorageV1Api(api_client).list_storage_class(
        _request_timeout=_DEADLINE_S).items
    for storage_class in classes:
        if (storage_class.metadata.annotations or {}).get(DEFAULT_CLASS_ANNOTATION) == "true":
            return storage_class.metadata.name
    return None


def check_cluster(api_client, needs: Needs) -> list[str]:
    """One line per missing prerequisite of `needs` (namespace, claims, kinds, runner's RBAC)."""
    from kubernetes import client

    problems = list(needs.problems)
    core = client.CoreV1Api(api_client)
    if _exists(lambda: core.read_namespace(needs.namespace, _request_timeout=_DEADLINE_S),
               f"namespace {needs.namespace}") is False:
        return problems + [f"namespace {needs.namespace} does not exist: pass --namespace "
                           "with the namespace KFP runs in (a Kubeflow profile's namespace "
                           "in a multi-user install)"]
    for claim, fix in needs.claims:
        if _exists(lambda c=claim: core.read_namespaced_persistent_volume_claim(
                c, needs.namespace, _request_timeout=_DEADLINE_S),
                f"claim {needs.namespace}/{claim}") is False:
            problems.append(f"claim {claim} does not exist in namespace {needs.namespace} (a "
                            f"pod that mounts it would stay Pending): {fix}")
    problems += _served_problems(api_client, needs)
    problems += _access_problems(api_client, needs)
    _warn_without_disruption_budget(api_client, needs.namespace)
    return problems


def _served_problems(api_client, needs: Needs) -> list[str]:
    """One line per kind the API server does not serve.

    Read from discovery (/apis/<group>/<version>), which every authenticated user may read.
    """
    problems = []
    for api_version, plural, fix in needs.served:
        listed = _discovered(api_client, api_version)
        if listed is not None and plural not in listed:
            problems.append(f"the API server does not serve {plural} ({api_version}): {fix}")
    return problems


def _discovered(api_client, api_version: str) -> set[str] | None:
    """The resources the API server lists under `api_version`; None when we may not look."""
    from kubernetes.client.exceptions import ApiException

    try:
        response = api_client.call_api(
            f"/apis/{api_version}", "GET", header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=_DEADLINE_S)
    except ApiException as e:
        if e.status == 404:
            return set()
        if e.status in (401, 403):
            log.warning("the API server's %s kinds not checked: you may not read them (HTTP %s)",
                        api_version, e.status)
            return None
        raise
    try:
        body = json.loads(response[0].data or b"{}")
    except ValueError:
        body = {}
    return {r.get("name") for r in body.get("resources") or [] if isinstance(r, dict)}


def _warn_without_disruption_budget(api_client, namespace: str) -> None:
    """A drain deletes train pods, which KFP does not retry: say so if k8s/pipeline is absent."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.PolicyV1Api(api_client).read_namespaced_pod_disruption_budget(
            TRAIN_BUDGET, namespace, _request_timeout=_DEADLINE_S)
    except ApiException as e:
        if e.status == 404:
            log.warning("no PodDisruptionBudget %s in namespace %s: a node drain would delete a "
                        "running train pod, which KFP does not retry (kubectl apply -n %s -k "
                        "k8s/pipeline)", TRAIN_BUDGET, namespace, namespace)


def _exists(read, what: str) -> bool | None:
    """True/False; None when we may not look (logged: that check is skipped, not failed)."""
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return False
        if e.status in (401, 403):
            log.warning("%s not checked: you may not read it (HTTP %s)", what, e.status)
            return None
        raise
    return True


def _access_problems(api_client, needs: Needs) -> list[str]:
    """SelfSubjectAccessReviews as the runner (impersonated, as `kubectl auth can-i --as`)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    if not needs.access:
        return []
    user = f"system:serviceaccount:{needs.runner[0]}:{needs.runner[1]}"
    impersonating = client.ApiClient(api_client.configuration)
    impersonating.set_default_header("Impersonate-User", user)
    api = client.AuthorizationV1Api(impersonating)
    denied: dict[tuple[str, str], list[str]] = {}  # (namespace, fix) -> ["create tfjobs..."]
    try:
        for access in needs.access:
            review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    namespace=access.namespace, verb=access.verb, group=access.group,
                    resource=access.resource)))
            try:
                answer = api.create_self_subject_access_review(review,
                                                               _request_timeout=_DEADLINE_S)
            except ApiException as e:
                if e.status in (401, 403):
                    log.warning("RBAC of %s not checked: you may not impersonate it (HTTP %s); "
                                "`kubectl auth can-i --as %s` needs the same right", user,
                                e.status, user)
                    return []
                raise
            if not answer.status.allowed:
                kind = f"{access.resource}.{access.group}" if access.group else access.resource
                denied.setdefault((access.namespace, access.fix), []).append(
                    f"{access.verb} {kind}")
    finally:
        impersonating.close()
    return [f"{needs.runner[0]}:{needs.runner[1]} (the service account the run's pods use) may "
            f"not {', '.join(what)} in namespace {namespace}: {fix}"
            for (namespace, fix), what in denied.items()]
