"""Compile and submit the pipeline to a Kubeflow Pipelines endpoint with `kfp.Client`.

Before anything is sent: the endpoint answers and accepts us; the compiled IR passes the
backend's own rules for the version it reports (pipeline/backend_rules.py; on 2.15/2.16 the
workspace gets the cluster's default storage class when none was given); and, where a
kubeconfig reaches the cluster, the run's namespace, the claims its tasks mount and the
runner's RBAC exist (pipeline/preflight.py). Every missing piece is one line of the error.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from ampflow.errors import ConfigError, PipelineError
from ampflow.pipeline import preflight
from ampflow.pipeline.backend_rules import ir_problems
from ampflow.pipeline.parameters import check_arguments
from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline, options_from

log = logging.getLogger(__name__)
TOKEN_ENV = "KFP_TOKEN"


@dataclass(frozen=True, kw_only=True)
class SubmitConfig(PipelineOptions):
    """Where to submit, and as what run; the compile-time options are PipelineOptions' own."""

    host: str = field(metadata={"help": "KFP API endpoint, e.g. http://localhost:8080 after "
                                        "`kubectl port-forward svc/ml-pipeline-ui 8080:80`."})
    namespace: str | None = field(default=None, metadata={
        "help": "Kubeflow profile namespace the run goes into (multi-user installs)."})
    experiment: str = field(default="ampflow", metadata={"help": "Experiment name."})
    run_name: str | None = field(default=None, metadata={"help": "Run name (default: KFP's)."})
    kubeconfig: str | None = field(default=None, metadata={
        "help": "kubeconfig of the KFP cluster, to check the run's prerequisites (namespace, "
                "claims, RBAC) first; default $KUBECONFIG or ~/.kube/config."})
    context: str | None = field(default=None, metadata={"help": "kubeconfig context."})
    runner_service_account: str | None = field(default=None, metadata={
        "help": "Service account the run's pods use (default: pipeline-runner, or "
                "default-editor in a multi-user install)."})
    check_cluster: bool = field(default=True, metadata={
        "help": "Check the run's prerequisites in the cluster before submitting."})
    connect_timeout_s: float = field(default=5.0, metadata={
        "help": "Give up reaching the endpoint after this many seconds."})

    def __post_init__(self) -> None:
        super().__post_init__()
        parsed = urlparse(self.host)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"host must be an http(s) URL. Received: host={self.host!r}")


@dataclass(frozen=True)
class SubmitResult:
    """The submitted run."""

    run_id: str
    url: str


def submit(config: SubmitConfig, arguments: dict | None = None) -> SubmitResult:
    """Compile with `config`'s options and create a run; clear errors if unreachable/refused.

    The token comes from $KFP_TOKEN if set; otherwise kfp.Client uses in-cluster service-account
    credentials or the local kubeconfig, as it does by default.
    """
    arguments = dict(arguments or {})
    check_arguments(arguments, config)  # a misspelt --param fails here, before anything is sent
    checked = config.check_base_model_for_cluster()
    if checked:
        log.info("base model: %s", checked)
    weights = config.check_weights_for_cluster()
    if weights:
        log.info("ImageNet weights: %s", weights)
    options = options_from(config)
    _probe(config)
    backend = preflight.read_backend(config.host, os.environ.get(TOKEN_ENV),
                                     config.connect_timeout_s)
    if backend.multi_user and not config.namespace:
        raise PipelineError(f"KFP at {config.host} is a multi-user install: pass --namespace "
                            "with your Kubeflow profile's namespace")
    namespace = config.namespace or preflight.STANDALONE_NAMESPACE
    api_client = preflight.kube_client(config.kubeconfig, config.context) \
        if config.check_cluster else None
    if config.check_cluster and api_client is None:
        log.warning("no kubeconfig: the run's cluster prerequisites (namespace, claims, RBAC) "
                    "were not checked")
    try:
        options = _storage_class_for(backend, options, api_client)
        with tempfile.TemporaryDirectory() as tmp:
            package = compile_pipeline(Path(tmp) / "ampflow.yaml", options)
            problems = ir_problems(package, backend.series or "2.17")  # 2.17's if unknown
            if api_client is not None:
                needs = preflight.run_needs(options, arguments, namespace, backend.multi_user,
                                            config.runner_service_account)
                problems += preflight.check_cluster(api_client, needs)
            if problems:
                raise PipelineError(
                    f"not submitted: the run would fail on {config.host} "
                    f"(KFP {backend.tag or 'version unknown'}, namespace {namespace}):\n  - "
                    + "\n  - ".join(problems))
            return _create_run(config, package, arguments)
    finally:
        if api_client is not None:
            api_client.close()


def _storage_class_for(backend, options, api_client):
    """On KFP 2.15/2.16 the workspace needs a named class: the cluster's default one."""
    if (backend.series not in ("2.15", "2.16") or options.checkpoints != "workspace"
            or options.workspace_storage_class):
        return options
    found = preflight.default_storage_class(api_client) if api_client is not None else None
    if found is None:
        raise PipelineError(
            f"not submitted: KFP {backend.tag} refuses a workspace PVC without storageClassName "
            "(argo.go@2.16.0 L578) and no default StorageClass was found in the cluster: pass "
            "--workspace-storage-class NAME (kubectl get storageclass), or --checkpoints none")
    log.info("KFP %s needs the workspace's storage class: using the cluster's default, %s",
             backend.tag, found)
    return dataclasses.replace(options, workspace_storage_class=found)


def _create_run(config: SubmitConfig, package: str, arguments: dict) -> SubmitResult:
    import kfp

    try:
        client = kfp.Client(host=config.host, namespace=config.namespace or "kubeflow",
                            existing_token=os.environ.get(TOKEN_ENV))
        run = client.create_run_from_pipeline_package(
            package, arguments=arguments, run_name=config.run_name,
            experiment_name=config.experiment, namespace=config.namespace)
    except Exception as e:  # kfp raises ApiException, urllib3 and auth errors alike
        raise PipelineError(f"KFP at {config.host} refused the run: "
                            f"{_first_line(e)}") from e
    url = f"{config.host.rstrip('/')}/#/runs/details/{run.run_id}"
    return SubmitResult(run_id=run.run_id, url=url)


def _probe(config: SubmitConfig) -> None:
    """Fail in seconds, not after kfp's long retries, when the host is unreachable or refuses.

    kfp.Client retries its health check 5 times, 5 s apart, even on a 401/403 that no retry
    can change.
    """
    parsed = urlparse(config.host)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=config.connect_timeout_s).close()
    except OSError as e:
        raise PipelineError(
            f"cannot reach the KFP endpoint {config.host} ({e.strerror or e}); check --host, "
            "or port-forward the KFP UI/API service first"
        ) from e
    _check_not_refused(config)


def _check_not_refused(config: SubmitConfig) -> None:
    """A 401/403 from KFP's health endpoint is final: say so now.

    Anything else (an older KFP without the endpoint, a proxy's quirk) is left for kfp.Client.
    """
    import urllib.error
    import urllib.request

    url = f"{config.host.rstrip('/')}/apis/v2beta1/healthz"
    request = urllib.request.Request(url)
    if os.environ.get(TOKEN_ENV):
        request.add_header("Authorization", f"Bearer {os.environ[TOKEN_ENV]}")
    try:
        urllib.request.urlopen(request, timeout=config.connect_timeout_s).close()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise PipelineError(
                f"KFP at {config.host} refused the run: HTTP {e.code} {e.reason} on {url}; "
                f"set ${TOKEN_ENV} to a token the endpoint accepts, or check --namespace"
            ) from e
    except (OSError, ValueError):
        pass


def _first_line(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]
