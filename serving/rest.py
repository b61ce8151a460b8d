"""TF Serving's REST API (`--rest-api-port`), over the same `InferenceCore` as gRPC.

The behaviour follows TF Serving's `http_rest_api_handler.cc`, `http_rest_api_util.cc`,
`http_server.cc` and `util/json_tensor.cc` (read, not copied):
- `POST /v1/models/{name}[/versions/{n}|/labels/{l}]:(predict|classify|regress)`;
  `GET /v1/models/{name}[/versions/{n}|/labels/{l}][/metadata]` (status or metadata);
- predict takes `instances` (row format: a list, of objects when there are several inputs)
  or `inputs` (columnar: a value, or an object keyed by input name), with dtypes and shapes
  from the signature; answers `predictions` / `outputs`; `{"b64": ...}` carries bytes both
  ways (outputs whose name ends in `_bytes`); `NaN`/`Infinity` are accepted and written;
- classify takes `examples` (+ optional `context`) and answers `results`;
- every error is `{"error": "..."}` with TF Serving's HTTP code for the gRPC code.
Each JSON request becomes the gRPC request proto and goes through `InferenceCore`, so REST and
gRPC run the same validation and limits and give the same answers. HTTP itself is parsed by
uvicorn (h11); the body is bounded by `--max-message-bytes` before it is parsed. The JSON <-> proto
conversions are in json_tensor.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    predict_pb2,
)

from ampflow.errors import ServingError
from ampflow.serving import json_tensor, tensors
from ampflow.serving.connection_limits import (
    ConnectionLimits,
    guarded_h11_protocol,
    handshake_bounded_server,
)
from ampflow.serving.inference import (
    CallObserver,
    CallRecord,
    InferenceCore,
    Observer,
    answered_version,
)
from ampflow.serving.model_format import DEFAULT_SIGNATURE
from ampflow.serving.status import ServingStatusError, clip
from ampflow.serving.status import invalid_argument as _invalid

log = logging.getLogger(__name__)

# http_server.cc: ToHTTPStatusCode
HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}
_PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)",
    re.IGNORECASE)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?",
    re.IGNORECASE)
REST_TIMEOUT_S = 30.0  # TF Serving's --rest_api_timeout_in_ms default


# ---- the request handler (plain Python: method, path, body -> status, JSON) ------------------

class RestHandler:
    """Turns one HTTP request into an InferenceCore call and its answer into JSON."""

    def __init__(self, core: InferenceCore, observe: Observer | None = None) -> None:
        self.core = core
        self.calls = CallObserver(core, observe)

    def handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, bytes]:
        """Answer one request: (HTTP status, JSON body). Never raises."""
        try:
            with self.calls.call() as record:
                payload = self._dispatch(method, raw_path, body, record)
            code = grpc.StatusCode.OK
        except ServingStatusError as e:
            code, payload = e.code, {"error": clip(e.message, 1024)}
        except Exception as e:  # a server bug must not end the process: INTERNAL
            log.exception("REST %s %s failed", method, clip(raw_path, 200))
            code = grpc.StatusCode.INTERNAL
            payload = {"error": f"internal error ({type(e).__name__}); see the server log"}
        return HTTP_STATUS.get(code, 500), _dumps(payload)

    def _dispatch(self, method: str, raw_path: str, body: bytes, record: CallRecord):
        """Route one request; `record` learns the API, the request and the version that ran."""
        path = raw_path.split("?", 1)[0]
        malformed = _invalid(f"Malformed request: {method} {clip(path, 200)}")
        if method == "POST":
            match = _PREDICT_PATH.fullmatch(path)
            if not match:
                raise malformed
            spec = _model_spec(*match.groups()[:3])
            verb = match.group(4).lower()
            if verb == "predict":
                record.method = "Predict"
                return self._predict(spec, body, record)
            if verb == "classify":
                record.method = "Classify"
                return self._classify(spec, body, record)
            raise ServingStatusError(grpc.StatusCode.UNIMPLEMENTED,
                                     "Regress is not supported by ampflow serve")
        if method == "GET":
            match = _STATUS_PATH.fullmatch(path)
            if not match:
                raise malformed
            name = match.group(1)
            if not name:
                raise _invalid("Missing model name in request.")
            spec = _model_spec(*match.groups()[:3])
            if match.group(4):
                record.method = "GetModelMetadata"
                return self._metadata(spec, record)
            record.method = "GetModelStatus"
            return self._status(spec, record)
        raise malformed

    # ---- APIs -------------------------------------------------------------------------------

    def _predict(self, spec, body: bytes, record: CallRecord):
        request = record.request = predict_pb2.PredictRequest(model_spec=spec)
        doc = json_tensor.parse_object(body)
        request.model_spec.signature_name = json_tensor.signature_name(doc)
        servable = self.core.resolve(request)
        sig_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if sig_name not in servable.signature_defs or not servable.can_run(sig_name):
            raise _invalid(f'Serving signature name: "{clip(sig_name)}" not found in '
                           "signature def")
        infos = dict(servable.signature_defs[sig_name].inputs)
        row_format = json_tensor.fill_inputs(doc, infos, request)
        response = self.core.predict(request, REST_TIMEOUT_S, servable=servable)
        record.answered = answered_version(response)
        outputs = {k: tensors.to_ndarray(k, v) for k, v in response.outputs.items()}
        return (json_tensor.row_json if row_format else json_tensor.columnar_json)(outputs)

    def _classify(self, spec, body: bytes, record: CallRecord):
        request = record.request = classification_pb2.ClassificationRequest(model_spec=spec)
        doc = json_tensor.parse_object(body)
        request.model_spec.signature_name = json_tensor.signature_name(doc)
        json_tensor.fill_examples(doc, request, self.core.limits.max_rows)
        response = self.core.classify(request, REST_TIMEOUT_S)
        record.answered = answered_version(response)
        results = [[[c.label, json_tensor.float32_json(c.score)] for c in row.classes]
                   for row in response.result.classifications]
        return {"results": results}

    def _status(self, spec, record: CallRecord):
        request = record.request = get_model_status_pb2.GetModelStatusRequest(model_spec=spec)
        response = self.core.status(request)
        return json_format.MessageToDict(
            response, always_print_fields_with_no_presence=True)

    def _metadata(self, spec, record: CallRecord):
        request = record.request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=spec, metadata_field=["signature_def"])
        response = self.core.metadata(request)
        record.answered = answered_version(response)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(sig_map)
        options = {"preserving_proto_field_name": True,
                   "always_print_fields_with_no_presence": True}
        return {"model_spec": json_format.MessageToDict(response.model_spec, **options),
                         "metadata": {"signature_def": json_format.MessageToDict(sig_map,
                                                                                 **options)}}


def _model_spec(name: str, version: str | None, label: str | None):
    from tensorflow_serving.apis import model_pb2

    spec = model_pb2.ModelSpec(name=urllib.parse.unquote(name or ""))
    if version is not None:
        number = int(version)
        if number >= 2 ** 63:
            raise _invalid(f"Failed to convert version: {clip(version)} to numeric.")
        spec.version.value = number
    if label is not None:
        spec.version_label = urllib.parse.unquote(label)
    return spec


def _dumps(payload) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


# ---- the ASGI app and its uvicorn server -----------------------------------------------------

class RestApp:
    """A minimal ASGI app: bounded body, one worker thread per request, JSON out."""

    def __init__(self, handler: RestHandler, max_body_bytes: int, workers: int,
                 metrics=None, v2=None) -> None:
        self.handler = handler
        self.v2 = v2  # a v2_rest.V2RestHandler answering /v2/..., or None
        self.max_body_bytes = max_body_bytes
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="ampflow-rest")
        self.metrics = metrics  # a prometheus CollectorRegistry served at /metrics, or None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if self.metrics is not None and scope["path"] in ("/metrics",
                                                           "/monitoring/prometheus/metrics"):
            import prometheus_client as prom

            await _reply(send, 200, prom.generate_latest(self.metrics), "text/plain")
            return
        body = await self._read_body(scope, receive)
        if body is None:
            payload = {"error": f"request body larger than {self.max_body_bytes} bytes "
                                "(--max-message-bytes)"}
            await _reply(send, 429, _dumps(payload))
            return
        raw_path = scope.get("raw_path") or scope["path"].encode()
        loop = asyncio.get_running_loop()
        if self.v2 is not None and (scope["path"] == "/v2" or scope["path"].startswith("/v2/")):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                       for k, v in scope.get("headers", [])}
            status, payload, extra = await loop.run_in_executor(
                self.pool, self.v2.handle, scope["method"], raw_path.decode("latin-1"), headers,
                body)
            await _send(send, status, payload, extra)
            return
        status, payload = await loop.run_in_executor(
            self.pool, self.handler.handle, scope["method"], raw_path.decode("latin-1"), body)
        await _reply(send, status, payload)

    async def _read_body(self, scope, receive) -> bytes | None:
        """The request body, or None when it is over the limit (then nothing of it is kept).

        An over-limit body is still read, and thrown away, up to `drain_bytes(limit)` past the
        limit before the 429 goes out: a server that answers and closes while the client is
        still writing makes the kernel reset the connection, and a client that writes its
        whole body before reading (urllib, requests, curl) then sees "connection reset" instead
        of the 429 (nginx's lingering close exists for the same reason). A body declared larger
        than that is answered at once, without reading any of it.
        """
        limit = self.max_body_bytes
        give_up = limit + drain_bytes(limit)
        declared = _content_length(scope)
        if declared is not None and declared > give_up:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b""
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > give_up:
                return None
            if size <= limit:
                chunks.append(chunk)
            else:
                chunks.clear()
            if not message.get("more_body"):
                return b"".join(chunks) if size <= limit else None


def drain_bytes(limit: int) -> int:
    """How far past the body limit a request is read, and discarded, to answer it cleanly.

    As much again as the limit, at least 1 MiB and at most 64 MiB: bandwidth, never memory.
    """
    return min(max(limit, 1 << 20), 64 << 20)


def _content_length(scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key == b"content-length" and value.isdigit():
            return int(value)
    return None


async def _reply(send, status: int, body: bytes, content_type: str = "application/json"):
    await _send(send, status, body, [(b"content-type", content_type.encode())])


async def _send(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]):
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class RestServer:
    """uvicorn serving a `RestApp` on its own thread and event loop."""

    def __init__(self, app: RestApp, host: str, port: int, tls=None,
                 limits: ConnectionLimits | None = None) -> None:
        limits = limits or ConnectionLimits()
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError as e:
            self._socket.close()
            raise ServingError(f"cannot bind the REST API port. Received: {host}:{port} "
                               f"({e.strerror})") from e
        self.port = self._socket.getsockname()[1]
        ssl_options = {}
        if tls is not None:
            import ssl

            ssl_options = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
            if tls.client_ca_file is not None:
                ssl_options.update(ssl_ca_certs=str(tls.client_ca_file),
                                   ssl_cert_reqs=ssl.CERT_REQUIRED)
        # log_config=None: uvicorn's default runs logging.config.dictConfig, which closes every
        # logging handler of the process (an embedding app's, pytest's capture) and gives
        # uvicorn's loggers their own; its lines now go through the process's handlers.
        config = uvicorn.Config(
            app, log_config=None, log_level="warning", access_log=False, lifespan="off",
            ws="none", interface="asgi3", loop="asyncio",
            timeout_keep_alive=limits.keepalive_timeout_s,
            limit_concurrency=None, http=guarded_h11_protocol(limits),
            h11_max_incomplete_event_size=64 * 1024, **ssl_options)
        self._server = handshake_bounded_server(config, limits.header_timeout_s)
        self._app = app
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="ampflow-rest", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise ServingError(f"the REST API did not start on {host}:{self.port}")

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to `grace_s`), then close."""
        self._server.should_exit = True
        self._thread.join(timeout=grace_s + 5)
        self._app.pool.shutdown(wait=False, cancel_futures=True)
        self._socket.close()
