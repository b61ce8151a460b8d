"""Requests whose bytes do not parse: answered once, logged in one line now and then, no leak.

grpcio (1.85) handles a request that its deserializer cannot parse by aborting the call and then
aborting it again from the waiting handler thread; every such request leaves its call state
behind. Measured with `benchmarks/serving/garbage_requests.py`: a 30-line grpcio server grows
by the same ~94 MB per 5,000 undeserializable requests as `ampflow serve` did, with or without
logging, while parseable bad requests leave RSS flat. The growth is grpcio's, and its trigger is
the deserializer failing, so this interceptor makes every deserializer total: bytes that do not
parse become an `Undecodable` marker that the handler answers with INTERNAL "Invalid protobuf
byte sequence" (the code TF Serving's C++ gRPC gives), through grpcio's normal, leak-free path.
grpcio would also log a full traceback per request; this logs one summary line per interval.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc

log = logging.getLogger(__name__)


class Undecodable:
    """Stands in for a request message whose bytes did not parse."""

    __slots__ = ("size", "error")

    def __init__(self, size: int, error: str) -> None:
        self.size = size
        self.error = error


class _SummaryLog:
    """At most one warning per `interval_s`, counting the requests in between."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._count = 0
        self._last = -float("inf")

    def note(self, method: str, item: Undecodable) -> None:
        with self._lock:
            self._count += 1
            now = time.monotonic()
            if now - self._last < self.interval_s:
                return
            count, self._count, self._last = self._count, 0, now
        log.warning("%d request(s) could not be parsed in the last %.0fs (answered INTERNAL); "
                    "last: %s, %d bytes, %s", count, self.interval_s, method, item.size,
                    item.error)


def _tolerant(deserializer):
    def deserialize(data: bytes):
        try:
            return deserializer(data)
        except Exception as e:  # any parse failure: a marker, never an exception or None
            return Undecodable(len(data), type(e).__name__)
    return deserialize


MESSAGE = "Invalid protobuf byte sequence: the request does not parse as {}"


class UndecodableRequestInterceptor(grpc.ServerInterceptor):
    """Wraps every registered method so that undecodable requests are answered cleanly."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.summary = _SummaryLog(interval_s)
        self._cache: dict[str, grpc.RpcMethodHandler] = {}
        self._lock = threading.Lock()

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        cached = self._cache.get(method)
        if cached is not None:
            return cached
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler  # unknown method (not cached: names are client-chosen)
        wrapped = self._wrap(method, handler)
        with self._lock:
            self._cache[method] = wrapped
        return wrapped

    def _reject(self, method: str, item: Undecodable, context) -> None:
        self.summary.note(method, item)
        context.abort(grpc.StatusCode.INTERNAL, MESSAGE.format(method))

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        deserialize = _tolerant(handler.request_deserializer)
        serialize = handler.response_serializer

        def check(request, context):
            if isinstance(request, Undecodable):
                self._reject(method, request, context)
            return request

        def checked_stream(requests, context):
            for request in requests:
                yield check(request, context)

        if handler.unary_unary:
            inner = handler.unary_unary
            return grpc.unary_unary_rpc_method_handler(
                lambda r, c: inner(check(r, c), c), deserialize, serialize)
        if handler.unary_stream:
            inner = handler.unary_stream
            return grpc.unary_stream_rpc_method_handler(
                lambda r, c: inner(check(r, c), c), deserialize, serialize)
        if handler.stream_unary:
            inner = handler.stream_unary
            return grpc.stream_unary_rpc_method_handler(
                lambda r, c: inner(checked_stream(r, c), c), deserialize, serialize)
        inner = handler.stream_stream
        return grpc.stream_stream_rpc_method_handler(
            lambda r, c: inner(checked_stream(r, c), c), deserialize, serialize)
