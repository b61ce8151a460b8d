"""Run the real `tensorflow_model_server` with the flags that `ampflow serve` was given.

In production the real TF Serving binary serves the model. When it is on PATH, `ampflow serve`
execs it instead of the local server; the argv is built here from the same `ServerConfig`
(the config-only settings — model list, version policy, labels, batching, TLS, monitoring —
become the small text-proto files the binary reads). The binary could not be run on the
machine this was written on (not on PyPI, no Docker), so only the argv is tested.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from ampflow.serving.config import ServerConfig, to_model_server_config_text
from ampflow.serving.transport.connection_limits import ConnectionLimits

log = logging.getLogger(__name__)

BINARY = "tensorflow_model_server"
# ServerConfig's field defaults, to tell a limit the user set from one left as it is
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServerConfig)}


def find_binary() -> str | None:
    """The real binary's path, or None."""
    return shutil.which(BINARY)


def build_argv(config: ServerConfig, workdir: str | os.PathLike, binary: str = BINARY
               ) -> list[str]:
    """The argv for `tensorflow_model_server`; writes its config files into `workdir`."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if config.model_config_file is not None:
        model_config = Path(config.model_config_file).resolve()
    else:
        model_config = workdir / "models.config"
        model_config.write_text(to_model_server_config_text(config.models))
    argv = [
        binary,
        f"--port={config.port}",
        f"--model_config_file={model_config}",
        f"--file_system_poll_wait_seconds={_poll_seconds(config.file_system_poll_wait_seconds)}",
        f"--grpc_channel_arguments=grpc.max_receive_message_length={config.max_message_bytes},"
        f"grpc.max_send_message_length={config.max_message_bytes}",
        f"--enable_model_warmup={str(config.enable_warmup).lower()}",
        "--enable_signature_method_name_check="
        f"{str(config.enable_signature_method_name_check).lower()}",
    ]
    if config.batching.enabled:
        argv += ["--enable_batching=true",
                 f"--batching_parameters_file={_write_batching(config, workdir)}"]
    if config.tls is not None:
        argv.append(f"--ssl_config_file={_write_ssl(config, workdir)}")
    if config.rest_api_port:
        argv.append(f"--rest_api_port={config.rest_api_port}")
    if config.metrics_port:  # the binary serves metrics on its REST port (cannot_honour checks)
        argv.append(f"--monitoring_config_file={_write_monitoring(workdir)}")
    return argv


def cannot_honour(config: ServerConfig) -> list[str]:
    """Why the real binary would serve something other than what was asked (empty: it can).

    It has no bind-address flag (gRPC and REST listen on every interface), serves Prometheus
    metrics only on its REST port, and always accepts HandleReloadConfigRequest from anyone.
    `ampflow serve` never widens what the user asked for: it refuses, or uses the local server.
    """
    reasons = []
    if config.host not in ("0.0.0.0", "::"):
        reasons.append(f"it listens on every interface, not only --host {config.host} "
                       "(pass --host 0.0.0.0 to accept that)")
    if config.metrics_port and config.metrics_port != config.rest_api_port:
        reasons.append(f"it serves metrics on its REST port only, so --metrics-port "
                       f"{config.metrics_port} would open the REST API there (pass the same "
                       "port as --rest-api-port to accept that)")
    if not config.allow_reload_config or config.reload_config_roots:
        reasons.append("it accepts HandleReloadConfigRequest from any client for any path "
                       "(pass --allow-reload-config without --reload-config-root to accept "
                       "that)")
    if any(m.compute_precision != "float32" for m in config.models):
        reasons.append("it has no --compute-precision (TF's oneDNN bfloat16 rewrite is the "
                       "local server's; use --server local)")
    if any(m.model_format == "tflite" for m in config.models):
        reasons.append("it does not load a version dir holding only a .tflite file "
                       "(--model-format tflite; use --server local)")
    if (config.max_string_bytes, config.max_strings_per_request) != (
            _DEFAULTS["max_string_bytes"], _DEFAULTS["max_strings_per_request"]):
        reasons.append("it has no --max-string-bytes/--max-strings-per-request limit (leave "
                       "them at their defaults to accept that)")
    if config.connection_limits != ConnectionLimits():
        reasons.append("it has none of the --rest-*/--grpc-* connection limits asked for (its "
                       "own servers' limits apply; leave them at their defaults to accept that)")
    return reasons


def _poll_seconds(seconds: float) -> int:
    """The binary takes whole seconds; 0 means 'poll once' in both servers."""
    return 0 if seconds == 0 else max(1, round(seconds))


def _write_batching(config: ServerConfig, workdir: Path) -> Path:
    path = workdir / "batching.config"
    micros = int(config.batching.batch_timeout_ms * 1000)
    path.write_text(
        f"max_batch_size {{ value: {config.batching.max_batch_size} }}\n"
        f"batch_timeout_micros {{ value: {micros} }}\n"
        f"num_batch_threads {{ value: {os.cpu_count() or 1} }}\n"
        "max_enqueued_batches { value: 1000 }\n"
    )
    return path


def _write_ssl(config: ServerConfig, workdir: Path) -> Path:
    """SSLConfig text proto: the binary wants the PEM *contents*, not paths."""
    tls = config.tls
    lines = [
        f"server_key: {json.dumps(tls.key_file.read_text())}",
        f"server_cert: {json.dumps(tls.cert_file.read_text())}",
    ]
    if tls.client_ca_file is not None:
        lines += [f"custom_ca: {json.dumps(tls.client_ca_file.read_text())}",
                  "client_verify: true"]
    path = workdir / "ssl.config"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def _write_monitoring(workdir: Path) -> Path:
    path = workdir / "monitoring.config"
    path.write_text('prometheus_config {\n  enable: true\n  path: "/metrics"\n}\n')
    return path


def exec_binary(config: ServerConfig, binary: str) -> None:
    """Replace this process with the real server (never returns)."""
    workdir = Path(tempfile.mkdtemp(prefix="ampflow-tf-serving-"))
    argv = build_argv(config, workdir, binary)
    log.info("exec %s", " ".join(argv))
    os.execv(binary, argv)
