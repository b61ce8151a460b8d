"""The HTTP transport of both REST protocols (TF Serving's /v1, KServe V2's /v2) on one port.

uvicorn (h11) parses HTTP; `RestApp` bounds each body by `--max-message-bytes` before anything
parses it, runs the REST door (protocols/rest.py: V2's /v2, TF Serving's any other path) that
answers the path in a worker thread, and serves Prometheus metrics when asked to; `RestServer`
runs it on its own thread with the connection limits. Both protocols answer an error with the
one envelope here (`error_reply`): `{"error": "..."}` with TF Serving's HTTP status for the
gRPC code (http_server.cc), a bounded message, and INTERNAL without details for a server bug.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import grpc

from ampflow.errors import ConfigError, ServingError
from ampflow.serving.config import ConnectionLimits, ServerConfig
from ampflow.serving.status import ServingStatusError, clip
from ampflow.serving.transport.connection_limits import (
    guarded_h11_protocol,
    handshake_bounded_server,
)
from ampflow.serving.transport.drain import MESSAGE as DRAINING
from ampflow.serving.transport.drain import Drain

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
# a request's deadline unless given one: ServerConfig's (TF Serving's --rest_api_timeout_in_ms)
REST_TIMEOUT_S = next(f.default for f in dataclasses.fields(ServerConfig)
                      if f.name == "rest_api_timeout_in_ms") / 1000
MAX_ERROR_MESSAGE = 1024
Reply = tuple[int, bytes, list[tuple[bytes, bytes]]]  # status, body, headers


def dumps(payload) -> bytes:
    """Compact JSON, as TF Serving writes it."""
    return json.dumps(payload, separators=(",", ":")).encode()


def json_reply(status: int, payload) -> Reply:
    """A JSON answer."""
    return status, dumps(payload), [(b"content-type", b"application/json")]


def error_reply(error: Exception, method: str, raw_path: str) -> Reply:
    """The one error envelope of both REST protocols (a server bug is logged, not shown)."""
    if isinstance(error, ServingStatusError):
        return json_reply(HTTP_STATUS.get(error.code, 500),
                          {"error": clip(error.message, MAX_ERROR_MESSAGE)})
    log.error("REST %s %s failed", method, clip(raw_path, 200), exc_info=error)
    return json_reply(HTTP_STATUS[grpc.StatusCode.INTERNAL],
                      {"error": f"internal error ({type(error).__name__}); see the server log"})


class RestDoor(Protocol):
    """What the port asks of a REST protocol (protocols/rest.py's `RestDoor` is the shape)."""

    def answers(self, path: str) -> bool:
        """Whether a request for `path` (without its query) is this protocol's."""
        ...

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> Reply:
        """(HTTP status, body, headers) of one request; never raises."""
        ...


class RestApp:
    """A minimal ASGI app: bounded body, one worker thread per request, the doors' replies out.

    `doors`: the REST protocols on the port, asked in order; the first that answers a path
    handles it (V2's /v2 before TF Serving's, which answers every other path).
    """

    def __init__(self, doors: Sequence[RestDoor], max_body_bytes: int, workers: int,
                 metrics=None, drain: Drain | None = None,
                 timeout_s: float | None = REST_TIMEOUT_S) -> None:
        self.drain = drain or Drain()  # begun: new requests are answered 503 (drain.py)
        self.timeout_s = timeout_s  # a request's deadline (None: none)
        self.doors = tuple(doors)
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
            await _reply(send, 429, dumps(payload))
            return
        if self.drain.draining:
            await _send(send, 503, dumps({"error": DRAINING}), [
                (b"content-type", b"application/json"), (b"connection", b"close"),
                (b"retry-after", str(self.drain.retry_after_s).encode())])
            return
        door = next((d for d in self.doors if d.answers(scope["path"])), None)
        if door is None:
            await _reply(send, 404, dumps({"error": f"no API answers {clip(scope['path'], 200)}"}))
            return
        raw_path = scope.get("raw_path") or scope["path"].encode()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        work = asyncio.get_running_loop().run_in_executor(
            self.pool, door.handle, scope["method"], raw_path.decode("latin-1"), headers, body)
        try:
            status, payload, extra = await asyncio.wait_for(work, self.timeout_s)
        except TimeoutError:  # TF Serving: its session run's deadline, DEADLINE_EXCEEDED
            status, payload, extra = json_reply(
                HTTP_STATUS[grpc.StatusCode.DEADLINE_EXCEEDED],
                {"error": "Deadline exceeded: no answer within the REST request deadline "
                          f"(--rest_api_timeout_in_ms={round(self.timeout_s * 1000)})"})
        await _send(send, status, payload, extra)

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
                 limits: ConnectionLimits | None = None, reuse_port: bool = False) -> None:
        """`reuse_port`: share the port with the other `--workers N` processes (SO_REUSEPORT)."""
        limits = limits or ConnectionLimits()
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            self._socket.bind((host, port))
        except OSError as e:
            self._socket.close()
            raise ConfigError(f"--rest-api-port must be a port free on {host}. Received: "
                              f"--rest-api-port {port} ({e.strerror})") from e
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
