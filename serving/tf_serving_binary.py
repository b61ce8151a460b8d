"""TF Serving's command line, both ways: the real binary's argv, and its flags read by `serve`.

In production the real TF Serving binary serves the model. When it is on PATH, `ampflow serve`
execs it instead of the local server; the argv is built here from the same `ServerConfig`
(the config-only settings — model list, version policy, labels, batching, TLS, monitoring —
become the small text-proto files the binary reads). The binary could not be run on the
machine this was written on (not on PyPI, no Docker), so only the argv is tested.

The other way, `ampflow serve` takes tensorflow_model_server's own flags (`--model_name=m
--rest_api_port=8501`, as its container passes them) as aliases of its own, so what build_argv
writes reads back to the same config; its flags with no equivalent are refused in one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from ampflow.errors import ConfigError
from ampflow.serving.channel_arguments import parse_channel_arguments, tf_serving_form
from ampflow.serving.config import ConnectionLimits, ServerConfig, to_model_server_config_text
from ampflow.serving.model_format import DEFAULT_MODEL_NAME
from ampflow.serving.monitoring_config import metrics_on_rest_port

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
        f"--grpc_channel_arguments={tf_serving_form(config)}",
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
        argv += [f"--rest_api_port={config.rest_api_port}",
                 f"--rest_api_timeout_in_ms={config.rest_api_timeout_in_ms}"]
    if config.model_config_file_poll_wait_seconds:  # (only with a file of the user's own)
        argv.append("--model_config_file_poll_wait_seconds="
                    f"{_poll_seconds(config.model_config_file_poll_wait_seconds)}")
    if config.grpc_socket_path is not None:
        argv.append(f"--grpc_socket_path={config.grpc_socket_path}")
    if any(m.model_format == "prefer_tflite" for m in config.models):  # (the same for all)
        argv.append("--prefer_tflite_model=true")
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
    tokens = ("max_request_tokens", "max_execution_tokens")
    if any(getattr(config, name) != _DEFAULTS[name] for name in tokens):
        reasons.append("it has no --max-request-tokens/--max-execution-tokens (leave them at "
                       "their defaults to accept that)")
    if _without_age(config.connection_limits) != ConnectionLimits():  # an age, it is given
        reasons.append("it has none of the --rest-*/--grpc-* connection limits asked for (its "
                       "own servers' limits apply; leave them at their defaults to accept that)")
    return reasons


def _without_age(limits: ConnectionLimits) -> ConnectionLimits:
    default = ConnectionLimits()
    return dataclasses.replace(
        limits, grpc_max_connection_age_s=default.grpc_max_connection_age_s,
        grpc_max_connection_age_grace_s=default.grpc_max_connection_age_grace_s)


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


# --- TF Serving's command line, read: `ampflow serve --rest_api_port=8501 ...` ----------------
# tensorflow_model_server's flags (tensorflow_serving/model_servers/main.cc) that mean what one
# of `ampflow serve`'s own does: TF Serving's name -> the config field it sets. `--port` is
# spelled the same in both. Their defaults are the fields' (one home); TF Serving's differ only
# for --model_name ("default" there, DEFAULT_MODEL_NAME here).
TF_SERVING_ALIASES = {
    "model_name": "model_name",
    "model_base_path": "model_base_path",
    "model_config_file": "model_config_file",
    "rest_api_port": "rest_api_port",
    "rest_api_timeout_in_ms": "rest_api_timeout_in_ms",
    "file_system_poll_wait_seconds": "file_system_poll_wait_seconds",
    "enable_model_warmup": "enable_warmup",
    "enable_signature_method_name_check": "enable_signature_method_name_check",
    "grpc_channel_arguments": "grpc_channel_arguments",  # and the fields of its known keys
    "model_config_file_poll_wait_seconds": "model_config_file_poll_wait_seconds",
    "grpc_socket_path": "grpc_socket_path",
    "monitoring_config_file": "metrics_port",  # prometheus_config enabled: the REST port's
    "prefer_tflite_model": "model_format",  # true: prefer_tflite
}
# Flags whose one value is what `ampflow serve` always does (taken), any other refused: flag ->
# (the value as TF Serving parses it, why another cannot be had).
TF_SERVING_FIXED = {
    "enable_batching": (
        "false", "batching is --max-batch-size N with --batch-timeout-ms X (a "
                 "BatchingParameters file is not read: its thread count and queue bound have "
                 "no equivalent in the local batcher)"),
    "enable_grpc_healthcheck_service": ("true", "grpc.health.v1 is always served"),
}
# Every other flag of tensorflow_model_server: refused, in one line with the reason.
TF_SERVING_UNSUPPORTED = {
    "rest_api_num_threads": "the REST API runs on one event loop per process (use --workers)",
    "rest_api_enable_cors_support": "the REST API sends no CORS headers",
    "batching_parameters_file": "use --max-batch-size N and --batch-timeout-ms X (its thread "
                                "count and queue bound have no equivalent in the local batcher)",
    "enable_per_model_batching_parameters": "batching is set for the whole server "
                                            "(--max-batch-size, --batch-timeout-ms)",
    "allow_version_labels_for_unavailable_models": "no equivalent",
    "num_load_threads": "no equivalent",
    "num_unload_threads": "no equivalent",
    "max_num_load_retries": "no equivalent",
    "load_retry_interval_micros": "no equivalent",
    "flush_filesystem_caches": "no equivalent",
    "tensorflow_session_parallelism": "TensorFlow's own thread pools are used",
    "tensorflow_intra_op_parallelism": "TensorFlow's own thread pools are used",
    "tensorflow_inter_op_parallelism": "TensorFlow's own thread pools are used",
    "tensorflow_session_config_file": "no TF1 session ConfigProto is read",
    "platform_config_file": "no PlatformConfigMap is read (models are SavedModels or .tflite, "
                            "--model-format)",
    "use_alts_credentials": "no ALTS; TLS is --tls-cert/--tls-key/--tls-client-ca",
    "ssl_config_file": "its SSLConfig holds the PEM contents; give the PEM files as --tls-cert, "
                       "--tls-key and --tls-client-ca",
    "per_process_gpu_memory_fraction": "no equivalent (TensorFlow's GPU allocator defaults)",
    "saved_model_tags": "the 'serve' tag set is loaded",
    "grpc_max_threads": "no equivalent (use --workers for more processes)",
    "num_request_iterations_for_warmup": "no equivalent (--warmup/--no-warmup)",
    "version": "use `ampflow --version`",
    "remove_unused_fields_from_bundle_metagraph": "no equivalent",
    "num_tflite_pools": "no equivalent",
    "num_tflite_interpreters_per_pool": "no equivalent",
    "xla_cpu_compilation_enabled": "no equivalent (a SavedModel runs as exported)",
    "xla_gpu_compilation_enabled": "no equivalent (a SavedModel runs as exported)",
    "enable_profiler": "no profiler service",
    "thread_pool_factory_config_file": "no equivalent",
    "mixed_precision": "use --compute-precision bfloat16",
    "skip_initialize_tpu": "no TPU support",
    "enable_serialization_as_tensor_content": "no equivalent",
}
_TRUE, _FALSE = ("true", "True", "1"), ("false", "False", "0")


def parse_tf_bool(flag: str, value: str) -> bool:
    """A TF Serving bool flag's value: `--flag` alone is true, else `=true` or `=false`."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"--{flag} must be true or false. Received: --{flag}={value}")


def same_tf_value(expected: str, given: str | None) -> bool:
    """Whether TF Serving reads `given` (None: the flag alone) as `expected`."""
    if expected in _TRUE + _FALSE:
        return given is None and expected in _TRUE or given in (
            _TRUE if expected in _TRUE else _FALSE)
    try:
        return given is not None and float(given) == float(expected)
    except ValueError:
        return False


def add_tf_serving_flags(p: argparse.ArgumentParser) -> None:
    """tensorflow_model_server's flags, so its container's arguments and scripts run unchanged.

    Each is an alias of one of the flags above (same dest and default: the field stays the one
    home of the default), read in TF Serving's syntax (`--flag=value`; a bool flag alone is
    true). Its other flags are refused in one line with the reason: never silently ignored.
    """
    group = p.add_argument_group(
        "TF Serving's flags", "tensorflow_model_server's spellings of the flags above, taken "
        "as it takes them (--rest_api_port=8501, --enable_model_warmup=false); its flags with "
        "no equivalent here are refused, each in one line saying why. One default differs: a "
        f"model given no name is {DEFAULT_MODEL_NAME!r} here, 'default' there.")
    by_dest = {a.dest: a for a in p._actions if a.option_strings}
    group.add_argument("--grpc_channel_arguments", dest="grpc_channel_arguments",
                       action=_TfServingFlag, tf_name="grpc_channel_arguments",
                       convert=parse_channel_arguments, metavar="KEY=VALUE,...",
                       default=_DEFAULTS["grpc_channel_arguments"],
                       help="gRPC server arguments, as TF Serving passes them (an int where "
                            "the value is one); grpc.max_connection_age_ms and the message "
                            "lengths, idle time, streams and ping interval set their flags")
    group.add_argument("--monitoring_config_file", dest="tf_serving_metrics_on_rest_port",
                       action=_TfServingFlag, tf_name="monitoring_config_file",
                       convert=metrics_on_rest_port, default=False, metavar="FILE",
                       help="a MonitoringConfig whose prometheus_config is enabled: the metrics "
                            "on the REST port (--metrics-port equal to --rest-api-port)")
    group.add_argument("--prefer_tflite_model", dest="model_format", action=_TfServingFlag,
                       tf_name="prefer_tflite_model", is_bool=True, metavar="true|false",
                       convert=lambda value: "prefer_tflite" if parse_tf_bool(
                           "prefer_tflite_model", value) else by_dest["model_format"].default,
                       default=by_dest["model_format"].default,
                       help="true: a version's .tflite file when it has one, else its SavedModel "
                            "(--model-format prefer_tflite)")
    for name, dest in TF_SERVING_ALIASES.items():
        if name in ("grpc_channel_arguments", "monitoring_config_file", "prefer_tflite_model"):
            continue
        own = by_dest[dest]
        is_bool = isinstance(own, argparse.BooleanOptionalAction)
        help_text = f"TF Serving's spelling of {own.option_strings[0]}"
        group.add_argument(f"--{name}", dest=dest, action=_TfServingFlag, tf_name=name,
                           convert=_tf_converter(name, own), is_bool=is_bool, help=help_text,
                           default=own.default,  # the field's, as ours: every action agrees
                           metavar="true|false" if is_bool else own.metavar or "VALUE")
    for name in (*TF_SERVING_FIXED, *TF_SERVING_UNSUPPORTED):
        group.add_argument(f"--{name}", dest=f"tf_serving_{name}", action=_TfServingFlag,
                           tf_name=name, convert=None, help=argparse.SUPPRESS)


def _tf_converter(name: str, own: argparse.Action):
    """How TF Serving's `--name=value` becomes the value of `own` (ours)'s dest."""
    if isinstance(own, argparse.BooleanOptionalAction):
        return lambda value: parse_tf_bool(name, value)
    kind = own.type or str

    def convert(value: str):
        try:
            return kind(value)
        except ValueError:
            raise ConfigError(f"--{name} must be {'a whole number' if kind is int else 'a number'}"
                              f". Received: --{name}={value}") from None
    return convert


class _TfServingFlag(argparse.Action):
    """One of TF Serving's flags: set our dest (`convert`), or take/refuse it in one line."""

    def __init__(self, option_strings, dest, *, tf_name: str, convert, is_bool: bool = False,
                 default=argparse.SUPPRESS, **kwargs) -> None:
        # a bool flag may stand alone (true); an alias of a valued flag needs its value
        nargs = None if convert is not None and not is_bool else "?"
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)
        self.tf_name, self.convert = tf_name, convert

    def __call__(self, parser, namespace, values, option_string=None):
        given = f"--{self.tf_name}" + ("" if values is None else f"={values}")
        try:
            if self.convert is not None:
                value = self.convert("true" if values is None else values)
                # --grpc_channel_arguments sets the fields of the keys it knows too
                for dest, each in (value.items() if isinstance(value, dict) else
                                   [(self.dest, value)]):
                    setattr(namespace, dest, each)
                return
            value, why = TF_SERVING_FIXED.get(self.tf_name, (None, None))
            if value is not None and same_tf_value(value, values):
                return  # what ampflow serve does anyway
            why = why or TF_SERVING_UNSUPPORTED[self.tf_name]
            raise ConfigError(f"TF Serving's --{self.tf_name} is not supported by `ampflow "
                              f"serve`{'' if value is None else f' except as ={value}'}: {why}. "
                              f"Received: {given}")
        except ConfigError as e:
            parser.error(str(e))
