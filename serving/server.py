"""The local model server: TF Serving's gRPC protocol over SavedModels in TF Serving's layout.

`start_local_server(config)` returns a `RunningServer` in this process (tests, the demo, the
pipeline); `serve_forever(config)` is `ampflow serve`: it blocks, and on SIGTERM/SIGINT stops
accepting calls, lets in-flight ones finish (up to `grace_s`), and returns 0.
Besides the two TF Serving services it registers the Open Inference Protocol's
`inference.GRPCInferenceService` (KServe V2, always on; protocols/v2_grpc.py), `grpc.health.v1`
(SERVING once every model has a version loaded) and server reflection (every one of these
services, V2 included), and optionally serves Prometheus metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import ssl
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2
from tensorflow_serving.apis import model_service_pb2, prediction_service_pb2

from ampflow.errors import ConfigError, ServingError
from ampflow.serving import preflight
from ampflow.serving.config import ServerConfig
from ampflow.serving.config_poll import ConfigFilePoller
from ampflow.serving.core.batching import Batcher
from ampflow.serving.core.inference import InferenceCore, ReloadPolicy, RequestLimits
from ampflow.serving.listening import announce, client_host
from ampflow.serving.models import registry as model_registry
from ampflow.serving.protocols.tf_serving import TFServingProtocol
from ampflow.serving.protocols.tf_serving_grpc import ModelServicer, PredictionServicer
from ampflow.serving.protocols.v2 import V2Protocol
from ampflow.serving.protocols.v2_grpc import SERVICE as V2_SERVICE
from ampflow.serving.protocols.v2_grpc import V2Servicer
from ampflow.serving.transport.connection_limits import grpc_server_options
from ampflow.serving.transport.drain import REFUSE_S, Drain, DrainInterceptor
from ampflow.serving.transport.grpc_guard import UndecodableRequestInterceptor

log = logging.getLogger(__name__)

PREDICTION_SERVICE = prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"]
MODEL_SERVICE = model_service_pb2.DESCRIPTOR.services_by_name["ModelService"]
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]
REFLECTION_SERVICE = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
# grpc.health.v1 names: the overall server, ours (full names), and the short names that
# tensorflow_model_server registers (server.cc), so the same probes work against both servers.
HEALTH_SERVICE_NAMES = ("", PREDICTION_SERVICE.full_name, MODEL_SERVICE.full_name,
                        "PredictionService", "ModelService", V2_SERVICE.full_name)


@dataclasses.dataclass
class RunningServer:
    """A started server: where it listens and how to stop it."""

    address: str
    port: int
    config: ServerConfig
    registry: model_registry.ModelRegistry
    metrics_port: int | None
    _server: grpc.Server
    _health: health.HealthServicer
    _batcher: Batcher | None
    _metrics_http: object | None
    rest_port: int | None = None
    _rest: object | None = None
    _config_poller: ConfigFilePoller | None = None
    _drain: Drain = dataclasses.field(default_factory=Drain)

    @property
    def rest_address(self) -> str | None:
        """host:port of the REST API, or None when it is off."""
        return f"{client_host(self.config.host)}:{self.rest_port}" if self.rest_port else None

    def stop(self, grace: float | None = None, refuse_s: float = 0.0) -> None:
        """Refuse new calls, let in-flight ones finish within `grace` seconds, then stop.

        `refuse_s` (SIGTERM's drain: transport/drain.py): first answer new calls UNAVAILABLE /
        503 for that long (at most `grace`), so that none meets grpcio's shutdown, which
        cancels them. gRPC and REST then drain side by side.
        """
        grace = self.config.grace_s if grace is None else grace
        refuse_s = min(refuse_s, grace)
        self._drain.begin(refuse_s)  # before health says NOT_SERVING: a probe sees both
        self._health.enter_graceful_shutdown()
        if refuse_s > 0:
            time.sleep(refuse_s)
        grace -= refuse_s
        stopped = self._server.stop(grace)
        if self._rest is not None:
            self._rest.stop(grace)
        stopped.wait(grace + 5)
        if self._config_poller is not None:
            self._config_poller.stop()
        self.registry.stop()
        if self._batcher is not None:
            self._batcher.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped."""
        return self._server.wait_for_termination(timeout)


class _Metrics:
    """Prometheus counters/histogram per model, version and method, in a private registry.

    `exposed` is the registry /metrics serves: the private one, or with `--workers N` (the
    client library's multiprocess mode, PROMETHEUS_MULTIPROC_DIR set by the supervisor) a
    `MultiProcessCollector` over every worker's files, so any worker answers for all of them.
    """

    def __init__(self, multiprocess: bool = False) -> None:
        import prometheus_client as prom

        self.registry = prom.CollectorRegistry()
        self.exposed = self.registry
        if multiprocess:
            from prometheus_client import multiprocess as prom_multiprocess

            self.exposed = prom.CollectorRegistry()
            prom_multiprocess.MultiProcessCollector(self.exposed)
        labels = ("model", "version", "method")
        self.requests = prom.Counter("ampflow_serving_requests", "gRPC requests handled",
                                     labels, registry=self.registry)
        self.errors = prom.Counter("ampflow_serving_errors", "gRPC requests that failed",
                                   (*labels, "code"), registry=self.registry)
        self.latency = prom.Histogram(
            "ampflow_serving_latency_seconds", "gRPC request latency", labels,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=self.registry,
        )
        sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
        self.batch_requests = prom.Histogram(
            "ampflow_serving_batch_requests", "requests merged into one model run (batching)",
            buckets=sizes, registry=self.registry)
        self.batch_rows = prom.Histogram(
            "ampflow_serving_batch_rows", "rows of one batched model run", buckets=sizes,
            registry=self.registry)

    def observe_batch(self, requests: int, rows: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)

    def observe(self, model, version, method, code: grpc.StatusCode, seconds: float) -> None:
        self.requests.labels(model, version, method).inc()
        self.latency.labels(model, version, method).observe(seconds)
        if code != grpc.StatusCode.OK:
            self.errors.labels(model, version, method, code.name).inc()


def start_local_server(config: ServerConfig, *, as_worker: bool = False) -> RunningServer:
    """Check base paths and ports, bind, load the configured models; returns once listening.

    `as_worker`: one of `--workers N` processes (serving/workers.py). The supervisor checked
    and holds the ports, so they are bound with SO_REUSEPORT beside the other workers' (the
    kernel spreads connections), metrics go to the shared multiprocess files, and a separate
    `--metrics-port` is the supervisor's to serve.
    """
    if as_worker:
        for model in config.models:
            preflight.check_base_path(model.name, model.base_path,
                                      wait=config.wait_for_base_path)
    else:
        preflight.check_server(config)
    credentials = _server_credentials(config.tls) if config.tls else None
    metrics = _Metrics(multiprocess=as_worker) if config.metrics_port else None
    observe = metrics.observe if metrics else None
    registry = model_registry.ModelRegistry(config.models)
    batcher = Batcher(config.batching, metrics.observe_batch if metrics else None) \
        if config.batching.enabled else None
    runner = (lambda s, sig, inputs, t: batcher.run(s, sig, inputs, t)) if batcher else None
    limits = RequestLimits(max_bytes=config.max_message_bytes,
                           max_rows=config.request_batch_cap,
                           max_string_bytes=config.max_string_bytes,
                           max_strings=config.strings_cap,
                           max_tokens=config.max_request_tokens,
                           slice_tokens=config.max_execution_tokens)
    reload_policy = ReloadPolicy(allowed=config.allow_reload_config,
                                 roots=config.reload_config_roots)
    core = InferenceCore(registry, runner, limits, reload_policy,
                         method_name_check=config.enable_signature_method_name_check)
    tf_serving, v2 = TFServingProtocol(core), V2Protocol(core)  # each door takes its protocol
    drain = Drain()
    if config.enable_warmup:
        registry.set_warmup(tf_serving.warmup)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers,
                                   thread_name_prefix="ampflow-grpc"),
        options=server_options(config, reuse_port=as_worker),
        maximum_concurrent_rpcs=config.max_workers * 8,
        interceptors=(DrainInterceptor(drain), UndecodableRequestInterceptor()),
    )
    prediction_service_pb2_grpc_add(server, tf_serving, observe)
    server.add_generic_rpc_handlers((V2Servicer(v2, observe).handler(),))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflected = (PREDICTION_SERVICE, MODEL_SERVICE, HEALTH_SERVICE, REFLECTION_SERVICE,
                 V2_SERVICE)
    reflection.enable_server_reflection(tuple(s.full_name for s in reflected), server,
                                        pool=reflection_pool(reflected))
    port = _bind(server, config, credentials)
    if config.grpc_socket_path is not None:
        _bind_unix(server, config.grpc_socket_path, credentials)
    registry.on_change = lambda: _on_change(registry, health_servicer, batcher)
    registry.start(config.file_system_poll_wait_seconds)
    problems = registry.start_problems(waiting=config.wait_for_base_path)
    if problems:  # TF Serving does not start either: the operator sees why, the pod restarts
        server.stop(0)
        registry.stop()
        if batcher is not None:
            batcher.close()
        raise ServingError("; ".join(problems))
    _on_change(registry, health_servicer, batcher)
    poller = ConfigFilePoller(config.model_config_file, registry,
                              config.model_config_file_poll_wait_seconds, config.models[0]
                              ).start() if config.model_config_file_poll_wait_seconds else None
    server.start()
    try:
        rest = _start_rest(config, tf_serving, v2, metrics, drain, reuse_port=as_worker)
        metrics_http, metrics_port = (None, config.metrics_port) if as_worker else \
            _start_metrics(config, metrics)
    except Exception:
        server.stop(0)
        if poller is not None:
            poller.stop()
        registry.stop()
        raise
    address = f"{client_host(config.host)}:{port}"
    log.info("ampflow model server listening on %s:%d (models %s)%s%s", config.host, port,
             [m.name for m in config.models],
             f", REST API on :{rest.port}" if rest else "",
             f", metrics on :{metrics_port}/metrics" if metrics_port else "")
    return RunningServer(address, port, config, registry, metrics_port, server, health_servicer,
                         batcher, metrics_http, rest.port if rest else None, rest, poller, drain)


def reflection_pool(services) -> descriptor_pool.DescriptorPool:
    """One descriptor pool with the files of `services` and everything they import.

    Server reflection answers from a single pool, and the V2 service lives in a private one
    (grpc_predict_v2_pb2.py: tritonclient or kserve may hold other `inference` protos in the
    default pool), so the files are copied, once at start, into a pool of their own.
    """
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        pool.AddSerializedFile(file.serialized_pb)
        added.add(file.name)

    for service in services:
        add(service.file)
    return pool


def server_options(config: ServerConfig, reuse_port: bool = False) -> list[tuple]:
    """The gRPC server's channel arguments (the serving benchmark's echo floor uses them too).

    SO_REUSEPORT only for `--workers N`: otherwise a second server on a busy port must fail.
    """
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),
        *grpc_server_options(config.connection_limits, workers=reuse_port),
        *config.grpc_channel_arguments,  # TF Serving's flag: what no flag of ours sets
    ]


def _start_rest(config: ServerConfig, tf_serving: TFServingProtocol, v2: V2Protocol,
                metrics: _Metrics | None, drain: Drain, reuse_port: bool = False):
    """TF Serving's REST API and the V2 REST API on --rest-api-port (gRPC's host and TLS).

    Metrics are served there too when --metrics-port names the same port (as the binary does).
    """
    if not config.rest_api_port:
        return None
    from ampflow.serving.protocols import tf_serving_rest, v2_rest
    from ampflow.serving.transport import http

    shared = metrics is not None and config.metrics_port == config.rest_api_port
    observe = metrics.observe if metrics else None
    timeout_s = config.rest_api_timeout_in_ms / 1000 if config.rest_api_timeout_in_ms > 0 \
        else None
    doors = (v2_rest.V2RestHandler(v2, observe, timeout_s),  # /v2 first: TF Serving: any path
             tf_serving_rest.TFServingRestHandler(tf_serving, observe, timeout_s))
    app = http.RestApp(doors, config.max_message_bytes, workers=min(8, config.max_workers),
                       metrics=metrics.exposed if shared else None, drain=drain,
                       timeout_s=timeout_s)
    return http.RestServer(app, config.host, config.rest_api_port, config.tls,
                           config.connection_limits, reuse_port=reuse_port)


def prediction_service_pb2_grpc_add(server: grpc.Server, api: TFServingProtocol,
                                    observe) -> None:
    """Register PredictionService and ModelService on `server`."""
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionServicer(api, observe), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(api, observe), server)


def _bind(server: grpc.Server, config: ServerConfig, credentials) -> int:
    target = f"[{config.host}]:{config.port}" if ":" in config.host else \
        f"{config.host}:{config.port}"
    try:
        if credentials is None:
            port = server.add_insecure_port(target)
        else:
            port = server.add_secure_port(target, credentials)
    except RuntimeError as e:
        raise ConfigError(f"--port must be a port free on {config.host}. Received: {target} "
                          f"({e})") from e
    if port == 0:
        raise ConfigError(f"--port must be a port free on {config.host}. Received: {target} "
                          "(in use?)")
    return port


def _bind_unix(server: grpc.Server, path: Path, credentials) -> None:
    """Serve gRPC on a Unix socket too, as TF Serving's --grpc_socket_path."""
    target = f"unix:{path}"
    try:
        bound = server.add_insecure_port(target) if credentials is None else \
            server.add_secure_port(target, credentials)
    except RuntimeError as e:
        bound, error = 0, f" ({e})"
    else:
        error = ""
    if not bound:
        raise ConfigError(f"--grpc-socket-path must be a path a Unix socket can be created at "
                          f"(its dir exists and is writable). Received: {path}{error}")
    log.info("gRPC also on unix:%s", path)


def check_tls_files(tls) -> None:
    """Load the PEM files with Python's ssl module, so a bad file is named as such.

    gRPC itself would only fail to bind the port.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(
            "tls_cert and tls_key must be a PEM certificate and its matching PEM private key. "
            f"Received: tls_cert={tls.cert_file}, tls_key={tls.key_file} ({e})"
        ) from e
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(
                "tls_client_ca must hold PEM CA certificates. Received: "
                f"tls_client_ca={tls.client_ca_file} ({e})"
            ) from e


def _server_credentials(tls) -> grpc.ServerCredentials:
    check_tls_files(tls)
    key, cert = tls.key_file.read_bytes(), tls.cert_file.read_bytes()
    ca = tls.client_ca_file.read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=ca is not None)


def _on_change(registry, health_servicer, batcher) -> None:
    """Health follows the registry: SERVING once every model has a loaded version."""
    status = (health_pb2.HealthCheckResponse.SERVING if registry.any_available()
              else health_pb2.HealthCheckResponse.NOT_SERVING)
    for service in HEALTH_SERVICE_NAMES:
        health_servicer.set(service, status)
    if batcher is not None:
        batcher.retire(registry.served_ids())


def _start_metrics(config: ServerConfig, metrics: _Metrics | None):
    if metrics is None:
        return None, None
    if config.metrics_port == config.rest_api_port:  # served by the REST app
        return None, config.metrics_port
    import prometheus_client as prom

    try:
        http, _thread = prom.start_http_server(config.metrics_port, addr=config.host,
                                               registry=metrics.registry)
    except OSError as e:
        raise ServingError(
            f"cannot bind the metrics port. Received: metrics_port={config.metrics_port} "
            f"({e.strerror})"
        ) from e
    return http, http.server_address[1]


def serve_forever(config: ServerConfig) -> int:
    """`ampflow serve`: run until SIGTERM/SIGINT, drain in-flight calls, return 0."""
    running = start_local_server(config)
    run_until_signalled(running, lambda: announce(config, running.address,
                                                  running.rest_address))
    log.info("server stopped cleanly")
    return 0


def run_until_signalled(running: RunningServer, on_ready=None) -> None:
    """Serve until SIGTERM/SIGINT, then drain in-flight calls (up to the config's grace_s).

    `on_ready` runs once the signal handlers are in place (so a SIGTERM right after it drains).
    `ampflow serve` runs this, and so does each `--workers N` process (its supervisor passes
    SIGTERM on).
    """
    stop = threading.Event()
    grace_s = running.config.grace_s

    def _signal(signum, _frame):
        log.info("received %s: draining in-flight requests (grace %.1fs)",
                 signal.Signals(signum).name, grace_s)
        stop.set()

    previous = {s: signal.signal(s, _signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if on_ready is not None:
            on_ready()
        while not stop.wait(0.5):
            pass
        running.stop(grace_s, refuse_s=REFUSE_S)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
