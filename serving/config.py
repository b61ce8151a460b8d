"""Typed configs of the model server, and TF Serving's `ModelServerConfig` text proto.

One `ModelConfig` per served model and one `ServerConfig` for the process. Both are frozen and
validated in `__post_init__`, so a wrong flag fails before any model is loaded; their fields'
defaults and help are `ampflow serve`'s flags (cli.py generates them with cliutil, as every
other command's). The same `ModelServerConfig` text-proto file that the real
`tensorflow_model_server` reads (`--model_config_file`) is parsed into `ModelConfig`s, so one
file drives both servers; its proto classes are imported where a file is read or written, so
building the CLI's parser imports no tensorflow_serving.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from pathlib import Path

from ampflow.errors import ConfigError
from ampflow.serving.channel_arguments import check_passed_through
from ampflow.serving.compute_precision import COMPUTE_PRECISIONS
from ampflow.serving.model_format import MAX_VERSION, MODEL_FORMATS, check_model_name

VERSION_POLICIES = ("latest", "all", "specific")
DEFAULT_MAX_REQUEST_BATCH = 1024  # rows per request when server-side batching is off
# One string of a request: an encoded phone photo fits (image_bytes), 10 MB of text does not.
# A text model reads max_sequence_length tokens (128 by default) of it in any case.
DEFAULT_MAX_STRING_BYTES = 4 * 1024 * 1024
# A text request's tokens after padding (serving/core/tokens.py): 512 texts at the 128 cap,
# 4,096 short ones; and the slice one run holds, whose memory bounds a run's.
DEFAULT_MAX_REQUEST_TOKENS = 65_536
DEFAULT_MAX_EXECUTION_TOKENS = 8_192
MAX_WORKERS = 64  # server processes of `--workers`: each holds every model in its memory


def _field(default, help: str, **metadata):
    """A field whose default and `--help` text `ampflow serve`'s flag reads (cliutil)."""
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One model: where its versions live and which of them to serve.

    `version_labels` maps a label (`stable`, `canary`) to a version number, as TF Serving's
    `ModelConfig.version_labels` does; a request may name a label instead of a version.
    `model_format`: what each version dir holds (`auto`: saved_model.pb, else a .tflite file).
    """

    name: str
    base_path: Path
    version_policy: str = _field("latest", "which versions on disk are served",
                                 choices=VERSION_POLICIES)
    num_latest: int = _field(1, "N of the 'latest' policy")
    versions: tuple[int, ...] = _field((), "versions of the 'specific' policy")
    version_labels: Mapping[str, int] = dataclasses.field(default_factory=dict)
    model_format: str = _field(
        "auto", "what each version dir holds: auto = saved_model.pb if there, else one .tflite "
        "file (a converter variant, run by LiteRT); prefer_tflite = the .tflite file when "
        "there, else the SavedModel (TF Serving's --prefer_tflite_model); applies to every "
        "model",
        choices=MODEL_FORMATS)
    compute_precision: str = _field(
        "float32", "what a SavedModel version computes in: bfloat16 runs its float32 graph "
        "through TF's oneDNN bfloat16 rewrite, only on a CPU with AVX512_BF16 or AMX-BF16 "
        "(refused elsewhere; deploy's parity check decides whether a version may); applies "
        "to every model", choices=COMPUTE_PRECISIONS)

    def __post_init__(self) -> None:
        check_model_name(self.name, "name")
        if self.compute_precision not in COMPUTE_PRECISIONS:
            raise ConfigError(f"compute_precision must be one of {COMPUTE_PRECISIONS}. "
                              f"Received: compute_precision={self.compute_precision!r}")
        if self.compute_precision != "float32" and self.model_format == "tflite":
            raise ConfigError("compute_precision bfloat16 rewrites a SavedModel's graph; a "
                              "TFLite model computes in its converter variant's precision. "
                              "Received: model_format='tflite'")
        if self.model_format not in MODEL_FORMATS:
            raise ConfigError(f"model_format must be one of {MODEL_FORMATS}. Received: "
                              f"model_format={self.model_format!r}")
        object.__setattr__(self, "base_path", Path(self.base_path))
        if self.version_policy not in VERSION_POLICIES:
            raise ConfigError(
                f"version_policy must be one of {VERSION_POLICIES}. "
                f"Received: version_policy={self.version_policy!r}"
            )
        if self.num_latest < 1:
            raise ConfigError(f"num_latest must be >= 1. Received: num_latest={self.num_latest}")
        object.__setattr__(self, "versions", tuple(int(v) for v in self.versions))
        if self.version_policy == "specific" and not self.versions:
            raise ConfigError(
                "version_policy='specific' needs at least one version. Received: versions=()"
            )
        if any(not 0 <= v <= MAX_VERSION for v in self.versions):
            raise ConfigError(f"versions must be in 0..{MAX_VERSION}. Received: "
                              f"versions={self.versions}")
        labels = {str(k): int(v) for k, v in dict(self.version_labels).items()}
        for label, version in labels.items():
            if not label or not (label[0].isalpha() or label[0] == "_"):
                raise ConfigError(
                    f"a version label must start with a letter. Received: label={label!r}"
                )
            if not 0 <= version <= MAX_VERSION:
                raise ConfigError(f"a version label must name a version in 0..{MAX_VERSION}. "
                                  f"Received: {label}={version}")
        object.__setattr__(self, "version_labels", labels)


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    """Server-side batching of concurrent Predict requests (off when max_batch_size is 0)."""

    max_batch_size: int = _field(0, "server-side batching of concurrent Predict calls "
                                    "(0/1 = off)")
    batch_timeout_ms: float = _field(2.0, "how long a batch waits to fill")

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ConfigError(
                f"max_batch_size must be >= 0 (0 = off). Received: max_batch_size="
                f"{self.max_batch_size}"
            )
        if not 0 <= self.batch_timeout_ms <= 10_000:
            raise ConfigError(
                f"batch_timeout_ms must be in 0..10000. Received: batch_timeout_ms="
                f"{self.batch_timeout_ms}"
            )

    @property
    def enabled(self) -> bool:
        """Whether requests are merged at all."""
        return self.max_batch_size > 1


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """Server TLS: PEM files. A client CA turns on mutual TLS (client certs required)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file", "client_ca_file"):
            value = getattr(self, name)
            if value is None:
                continue
            path = Path(value)
            if not path.is_file():
                raise ConfigError(f"{name} must be a readable PEM file. Received: {name}={value}")
            object.__setattr__(self, name, path)


MAX_SECONDS = 2_000_000  # gRPC's channel arguments hold milliseconds in an int32
# --workers N: the kernel hands each *connection* to a worker (SO_REUSEPORT), and a gRPC client
# keeps its connection, so a restarted worker got no load back (issue 49, measured). A maximum
# connection age makes every client reconnect this often, and a reconnection may land on it.
WORKERS_CONNECTION_AGE_S = 10.0


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """The connection bounds of `ampflow serve`; the defaults are nginx's where it has one.

    transport/connection_limits.py holds them (uvicorn's h11 protocol, gRPC's channel arguments).
    """

    header_timeout_s: float = _field(20.0, "REST: seconds a request head may take from its "
                                    "first byte (and a new connection to send one)")
    body_timeout_s: float = _field(60.0, "REST: seconds a request body may pause between reads")
    keepalive_timeout_s: float = _field(5.0, "REST: seconds an idle keep-alive connection is kept")
    max_connections: int = _field(512, "REST: connections held at once, in all")
    max_connections_per_address: int = _field(128, "REST: connections held at once per client "
                                             "address (raise it behind a proxy or sidecar, "
                                             "whose connections share one address)")
    grpc_max_concurrent_streams: int = _field(100, "gRPC: calls at once on one connection")
    grpc_max_connection_idle_s: float = _field(300.0, "gRPC: seconds a connection with no call "
                                              "is kept before a GOAWAY")
    grpc_min_ping_interval_s: float = _field(10.0, "gRPC: the fastest keepalive ping rate a "
                                            "client may use (seconds between pings)")
    grpc_max_connection_age_s: float = _field(
        0.0, "gRPC: seconds a connection may live before a GOAWAY sends its client to a new "
             f"one (TF Serving's grpc.max_connection_age_ms; 0 = off with one worker, "
             f"{WORKERS_CONNECTION_AGE_S:g} with --workers N, so that load returns to a "
             "restarted worker)")
    grpc_max_connection_age_grace_s: float = _field(
        30.0, "gRPC: seconds the calls on a connection past its age may take before it is "
              "closed (grpc.max_connection_age_grace_ms)")

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s",
                     "grpc_max_connection_idle_s", "grpc_min_ping_interval_s",
                     "grpc_max_connection_age_grace_s"):
            value = getattr(self, name)
            if not 0 < value <= MAX_SECONDS:  # NaN and inf fail too; gRPC takes int32 ms
                raise ConfigError(f"{name} must be > 0 and <= {MAX_SECONDS} seconds. "
                                  f"Received: {name}={value}")
        if not 0 <= self.grpc_max_connection_age_s <= MAX_SECONDS:
            raise ConfigError(f"grpc_max_connection_age_s must be in 0..{MAX_SECONDS} seconds "
                              f"(0 = off). Received: grpc_max_connection_age_s="
                              f"{self.grpc_max_connection_age_s}")
        for name in ("max_connections", "max_connections_per_address",
                     "grpc_max_concurrent_streams"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1. Received: {name}={getattr(self, name)}")
        if self.max_connections_per_address > self.max_connections:
            raise ConfigError(
                "max_connections_per_address must be <= max_connections. Received: "
                f"max_connections_per_address={self.max_connections_per_address}, "
                f"max_connections={self.max_connections}")


def flag_name(field_name: str) -> str:
    """`ampflow serve`'s flag for a field: REST fields get a `rest-` prefix (`grpc_` has one)."""
    name = field_name if field_name.startswith("grpc_") else f"rest_{field_name}"
    return "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Everything `ampflow serve` needs; the real binary gets the same values as flags."""

    models: tuple[ModelConfig, ...]
    host: str = _field("127.0.0.1", "bind address; use 0.0.0.0 explicitly to listen on every "
                                    "interface")
    port: int = _field(8500, "gRPC port (0 = pick a free one)")
    file_system_poll_wait_seconds: float = _field(
        1.0, "poll interval for new/removed version dirs (0 = load once)")
    max_message_bytes: int = _field(
        64 * 1024 * 1024, "largest gRPC message accepted or sent (larger: RESOURCE_EXHAUSTED)")
    tls: TlsConfig | None = None
    batching: BatchingConfig = dataclasses.field(default_factory=BatchingConfig)
    metrics_port: int = _field(0, "Prometheus /metrics port (0 = off)")
    max_workers: int = 16
    grace_s: float = _field(10.0, "on SIGTERM, how long in-flight requests may take to finish")
    workers: int = _field(
        1, "server processes sharing the gRPC and REST ports (SO_REUSEPORT; the kernel spreads "
           "connections), each with the models and its own batcher, under one supervisor that "
           "restarts a worker that dies; about one per core (1 = one process)")
    enable_warmup: bool = _field(True, "replay assets.extra/tf_serving_warmup_requests before "
                                       "a version serves", flag="--warmup")
    model_config_file: Path | None = _field(
        None, "TF Serving ModelServerConfig text proto (several models); replaces "
              "--model-name/--model-base-path/version flags")
    max_request_batch_size: int = _field(
        0, "rows (or Classify examples) one request may carry; 0 = the batching "
           "--max-batch-size when batching is on, else 1024")
    max_string_bytes: int = _field(
        DEFAULT_MAX_STRING_BYTES,
        "bytes one string of a request may hold (a raw text, an encoded image); longer: "
        "INVALID_ARGUMENT / HTTP 400, before any tensor is built (the default fits an encoded "
        "photo; a text-only server may take 65536)")
    max_strings_per_request: int = _field(
        0, "strings all string inputs of one request may hold together; 0 = the "
           "--max-request-batch-size cap")
    max_request_tokens: int = _field(
        DEFAULT_MAX_REQUEST_TOKENS,
        "a text model's tokens one request may run after padding (its texts x their longest "
        "one's length bucket, bounded from its bytes before the model runs); more: "
        "INVALID_ARGUMENT / HTTP 400 (0 = no cap)")
    max_execution_tokens: int = _field(
        DEFAULT_MAX_EXECUTION_TOKENS,
        "a text request's texts run by length bucket, and a bucket's rows of more tokens "
        "than this in slices of at most this many, one after the other, so one run's memory "
        "is bounded (as TF Serving's max_execution_batch_size, in tokens; 0 = no slices)")
    rest_api_port: int = _field(
        0, "TF Serving's REST API (/v1/models/...) and V2's (/v2/...) on this port, bound to "
           "--host with the same TLS (0 = off)")
    rest_api_timeout_in_ms: int = _field(
        30000, "REST request deadline: a request not answered within it gets HTTP 504 "
               "DEADLINE_EXCEEDED, as TF Serving's --rest_api_timeout_in_ms (<= 0: none)")
    allow_reload_config: bool = _field(
        False, "accept ModelService/HandleReloadConfigRequest (off: PERMISSION_DENIED)")
    reload_config_roots: tuple[Path, ...] = ()
    enable_signature_method_name_check: bool = _field(
        False, "Classify and Regress refuse a signature whose method name is not "
               "tensorflow/serving/classify or /regress (TF Serving's flag of the same name; off "
               "by default there too, as a TF2 export writes every signature as "
               "tensorflow/serving/predict)")
    wait_for_base_path: bool = _field(
        False, "start even if a model base path does not exist yet or holds no version, and "
               "load the first version a deploy writes there, logging every poll until then "
               "(off: fail at start)")
    model_config_file_poll_wait_seconds: float = _field(
        0.0, "re-read --model-config-file this often and apply what changed (models added, "
             "removed, relabelled; a file that does not parse keeps the models served and is "
             "logged); 0 = read once at start")
    grpc_socket_path: Path | None = _field(
        None, "also serve the gRPC APIs on this Unix socket (TF Serving's --grpc_socket_path; "
              "one process: not with --workers N)")
    connection_limits: ConnectionLimits = dataclasses.field(default_factory=ConnectionLimits)
    # TF Serving's --grpc_channel_arguments that no flag sets: (key, int or str), to grpcio as is
    grpc_channel_arguments: tuple[tuple[str, int | str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "grpc_channel_arguments",
                           check_passed_through(self.grpc_channel_arguments))
        if not self.models:
            raise ConfigError("at least one model must be configured. Received: models=()")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ConfigError(f"model names must be unique. Received: names={names}")
        _check_host(self.host)
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535 (0 = pick a free one). "
                              f"Received: port={self.port}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"metrics_port must be in 0..65535 (0 = off). Received: metrics_port="
                f"{self.metrics_port}"
            )
        if self.file_system_poll_wait_seconds < 0:
            raise ConfigError(
                "file_system_poll_wait_seconds must be >= 0 (0 = load once). Received: "
                f"file_system_poll_wait_seconds={self.file_system_poll_wait_seconds}"
            )
        if self.max_message_bytes < 1024:
            raise ConfigError(
                f"max_message_bytes must be >= 1024. Received: max_message_bytes="
                f"{self.max_message_bytes}"
            )
        if self.max_workers < 1:
            raise ConfigError(f"max_workers must be >= 1. Received: max_workers={self.max_workers}")
        if self.grace_s < 0:
            raise ConfigError(f"grace_s must be >= 0. Received: grace_s={self.grace_s}")
        _check_workers(self.workers, self.allow_reload_config)
        _check_poll_and_socket(self)
        if self.max_request_batch_size < 0:
            raise ConfigError(
                "max_request_batch_size must be >= 0 (0 = the batching max_batch_size, or "
                f"{DEFAULT_MAX_REQUEST_BATCH} without batching). Received: "
                f"max_request_batch_size={self.max_request_batch_size}"
            )
        if self.max_string_bytes < 1:
            raise ConfigError(f"max_string_bytes must be >= 1. Received: max_string_bytes="
                              f"{self.max_string_bytes}")
        if self.max_strings_per_request < 0:
            raise ConfigError(
                "max_strings_per_request must be >= 0 (0 = the request batch cap). Received: "
                f"max_strings_per_request={self.max_strings_per_request}")
        for name in ("max_request_tokens", "max_execution_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0 = no cap). Received: "
                                  f"{name}={getattr(self, name)}")
        if not 0 <= self.rest_api_port <= 65535:
            raise ConfigError(f"rest_api_port must be in 0..65535 (0 = off). Received: "
                              f"rest_api_port={self.rest_api_port}")
        if self.rest_api_port and self.rest_api_port == self.port:
            raise ConfigError(
                f"rest_api_port must differ from port. Received: rest_api_port="
                f"{self.rest_api_port}, port={self.port}"
            )
        if self.metrics_port and self.metrics_port == self.port:
            raise ConfigError(f"metrics_port must differ from port. Received: metrics_port="
                              f"{self.metrics_port}, port={self.port}")
        object.__setattr__(self, "reload_config_roots",
                           tuple(Path(r) for r in self.reload_config_roots))
        if self.reload_config_roots and not self.allow_reload_config:
            raise ConfigError(
                "reload_config_roots needs allow_reload_config. Received: "
                f"reload_config_roots={[str(r) for r in self.reload_config_roots]}, "
                "allow_reload_config=False"
            )

    @property
    def request_batch_cap(self) -> int:
        """Rows one request may carry.

        The flag, else TF Serving's rule (a request larger than the batching max_batch_size is
        refused), else a fixed default.
        """
        if self.max_request_batch_size:
            return self.max_request_batch_size
        if self.batching.enabled:
            return self.batching.max_batch_size
        return DEFAULT_MAX_REQUEST_BATCH

    @property
    def strings_cap(self) -> int:
        """Strings one request may carry: the flag, else as many as rows."""
        return self.max_strings_per_request or self.request_batch_cap

    def model(self, name: str) -> ModelConfig | None:
        """The config of model `name`, or None."""
        return next((m for m in self.models if m.name == name), None)


MAX_SOCKET_PATH_BYTES = 107  # sockaddr_un.sun_path holds 108 bytes with the closing NUL


def _check_poll_and_socket(config: ServerConfig) -> None:
    """A config file to poll, when polling; a socket path that fits, for one process only."""
    poll_s = config.model_config_file_poll_wait_seconds
    if not 0 <= poll_s <= 86_400:
        raise ConfigError("model_config_file_poll_wait_seconds must be in 0..86400 (0 = read "
                          f"once). Received: model_config_file_poll_wait_seconds={poll_s}")
    if poll_s and config.model_config_file is None:
        raise ConfigError("model_config_file_poll_wait_seconds needs model_config_file (the "
                          f"file to re-read). Received: model_config_file_poll_wait_seconds="
                          f"{poll_s} and no model_config_file")
    if config.grpc_socket_path is None:
        return
    object.__setattr__(config, "grpc_socket_path", Path(config.grpc_socket_path))
    size = len(str(config.grpc_socket_path).encode())
    if not 0 < size <= MAX_SOCKET_PATH_BYTES:
        raise ConfigError(f"grpc_socket_path must be 1..{MAX_SOCKET_PATH_BYTES} bytes (a Unix "
                          f"socket address). Received: {size} bytes")
    if config.workers > 1:
        raise ConfigError(f"grpc_socket_path needs workers=1: each worker would take the socket "
                          f"from the one before. Received: workers={config.workers}")


def _check_workers(workers: int, allow_reload_config: bool) -> None:
    """1..MAX_WORKERS processes; a config reload would reach only the worker it landed on."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"workers must be in 1..{MAX_WORKERS} (1 = one process). Received: "
                          f"workers={workers}")
    if workers > 1 and allow_reload_config:
        raise ConfigError(
            "allow_reload_config needs workers=1: a HandleReloadConfigRequest reaches only the "
            "worker its connection landed on, and the workers would then serve different "
            "models. Received: allow_reload_config=True, workers="
            f"{workers} (change --model-config-file and restart instead)")


def _check_host(host: str) -> None:
    """Accept an IP literal or `localhost`; a bind address is never a free-form name."""
    if host == "localhost":
        return
    try:
        ipaddress.ip_address(host)
    except ValueError as e:
        raise ConfigError(
            f"host must be an IP address such as 127.0.0.1 or 0.0.0.0. Received: host={host!r}"
        ) from e


def parse_model_server_config(text: str, *, source: str = "<text>") -> tuple[ModelConfig, ...]:
    """Parse TF Serving's `ModelServerConfig` text proto into `ModelConfig`s.

    Only `model_config_list` is supported (as in TF Serving's open-source server); relative
    base paths are kept as written.
    """
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    proto = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as e:
        raise ConfigError(
            # TF Serving's words in the parenthesis, which its own test looks for in the log
            f"model config must be a ModelServerConfig text proto. Received: {source} (Error "
            f"parsing text-format tensorflow.serving.ModelServerConfig: {e})"
        ) from e
    return model_configs_from_proto(proto, source=source)


def model_configs_from_proto(proto, *, source: str = "<proto>") -> tuple[ModelConfig, ...]:
    """Turn a `ModelServerConfig` proto (file or ReloadConfigRequest) into `ModelConfig`s."""
    if proto.WhichOneof("config") != "model_config_list":
        raise ConfigError(
            f"model config must contain model_config_list. Received: {source} with "
            f"{proto.WhichOneof('config')!r}"
        )
    return tuple(_model_config_from_proto(m) for m in proto.model_config_list.config)


def _model_config_from_proto(m) -> ModelConfig:
    platform = m.model_platform or "tensorflow"
    if platform != "tensorflow":
        raise ConfigError(
            f"model_platform must be 'tensorflow'. Received: model_platform={platform!r} "
            f"for model {m.name!r}"
        )
    policy = m.model_version_policy
    kind = policy.WhichOneof("policy_choice") or "latest"
    num_latest, versions = 1, ()
    if kind == "latest":
        num_latest = policy.latest.num_versions or 1
    elif kind == "specific":
        versions = tuple(policy.specific.versions)
    return ModelConfig(
        name=m.name,
        base_path=Path(m.base_path),
        version_policy=kind,
        num_latest=num_latest,
        versions=versions,
        version_labels=dict(m.version_labels),
    )


def load_model_config_file(path: str | Path) -> tuple[ModelConfig, ...]:
    """Read and parse a `--model-config-file`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(
            f"model_config_file must be a readable file. Received: model_config_file={path} "
            f"({e.strerror})"
        ) from e
    return parse_model_server_config(text, source=str(path))


def to_model_server_config_text(models: tuple[ModelConfig, ...]) -> str:
    """Write `models` as a `ModelServerConfig` text proto (what the real binary reads)."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    proto = model_server_config_pb2.ModelServerConfig()
    for model in models:
        entry = proto.model_config_list.config.add()
        entry.name = model.name
        entry.base_path = str(Path(model.base_path).resolve())
        entry.model_platform = "tensorflow"
        if model.version_policy == "latest":
            entry.model_version_policy.latest.num_versions = model.num_latest
        elif model.version_policy == "all":
            entry.model_version_policy.all.SetInParent()
        else:
            entry.model_version_policy.specific.versions.extend(model.versions)
        for label, version in model.version_labels.items():
            entry.version_labels[label] = version
    return text_format.MessageToString(proto)
