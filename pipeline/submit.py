"""Compile and submit the pipeline to a Kubeflow Pipelines endpoint with `kfp.Client`."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from ampflow.errors import ConfigError, PipelineError
from ampflow.pipeline.parameters import check_arguments
from ampflow.pipeline.settings import DEFAULT_IMAGE

log = logging.getLogger(__name__)
TOKEN_ENV = "KFP_TOKEN"


@dataclass(frozen=True)
class SubmitConfig:
    """Where to submit, and as what run."""

    host: str = field(metadata={"help": "KFP API endpoint, e.g. http://localhost:8080 after "
                                        "`kubectl port-forward svc/ml-pipeline-ui 8080:80`."})
    namespace: str | None = field(default=None, metadata={
        "help": "Kubeflow profile namespace (multi-user installs)."})
    experiment: str = field(default="ampflow", metadata={"help": "Experiment name."})
    run_name: str | None = field(default=None, metadata={"help": "Run name (default: KFP's)."})
    image: str = field(default=DEFAULT_IMAGE, metadata={"help": "Image every step runs in."})
    gpu: bool = field(default=True, metadata={"help": "Request a GPU for training."})
    with_float32_baseline: bool = field(default=True, metadata={
        "help": "Train a float32 baseline in parallel (training parity in the gate)."})
    checkpoints: str = field(default="workspace", metadata={
        "choices": ("workspace", "none"),
        "help": "Train checkpoints on the run's KFP workspace PVC (retries resume), or none."})
    workspace_storage_class: str | None = field(default=None, metadata={
        "help": "Storage class of the workspace PVC (default: the KFP server's)."})
    workspace_access_mode: str | None = field(default=None, metadata={
        "help": "Access mode of the workspace PVC (default: the KFP server's)."})
    train_workers: int = field(default=1, metadata={
        "help": "> 1: the AMP train task runs a TFJob with this many workers."})
    connect_timeout_s: float = field(default=5.0, metadata={
        "help": "Give up reaching the endpoint after this long."})

    def __post_init__(self) -> None:
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
    check_arguments(arguments or {})  # a misspelt --param fails here, before anything is sent
    import kfp

    from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline

    options = PipelineOptions(image=config.image, gpu=config.gpu,
                              with_float32_baseline=config.with_float32_baseline,
                              checkpoints=config.checkpoints,
                              workspace_storage_class=config.workspace_storage_class,
                              workspace_access_mode=config.workspace_access_mode,
                              train_workers=config.train_workers)
    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(Path(tmp) / "ampflow.yaml", options)
        _probe(config)
        try:
            client = kfp.Client(host=config.host, namespace=config.namespace or "kubeflow",
                                existing_token=os.environ.get(TOKEN_ENV))
            run = client.create_run_from_pipeline_package(
                package, arguments=arguments or {}, run_name=config.run_name,
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
