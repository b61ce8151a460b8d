"""Calls that arrive while the server drains: refused with UNAVAILABLE (gRPC) or 503 (REST).

grpcio's shutdown sends the GOAWAY and closes the listener, but a call that reached gRPC's core
just before it (queued, not yet handed to a Python thread, or racing the GOAWAY) is cancelled
there, and the client sees CANCELLED, which no retry policy retries. So on SIGTERM the server
first refuses new calls itself for `REFUSE_S`: gRPC with UNAVAILABLE (retryable by every gRPC
retry policy) and a `grpc-retry-pushback-ms` hint past the stop, REST with 503, `Retry-After`
and `Connection: close` (the retry opens a new connection, to another replica); health already
answers NOT_SERVING. Then the stop runs as before: in-flight calls finish within the grace, a
later call meets a closed port (UNAVAILABLE on the client's side). Health and reflection keep
answering, so probes see NOT_SERVING rather than an error.
"""

from __future__ import annotations

import math
import threading

import grpc

REFUSE_S = 0.5  # after SIGTERM: new calls refused (retryable) before the stop (bounded by grace)
MESSAGE = ("the server is shutting down (draining after SIGTERM) and takes no new calls; "
           "retry the call (on another replica)")
_EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class Drain:
    """Whether the server refuses new calls, and for how long before it stops; set once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.refuse_s = 0.0

    def begin(self, refuse_s: float = 0.0) -> None:
        """Refuse new calls from now on (in-flight ones go on); the stop follows in `refuse_s`.

        The retry hints point past the stop, so a retry meets another server (or a closed port).
        """
        self.refuse_s = refuse_s
        self._event.set()

    @property
    def draining(self) -> bool:
        return self._event.is_set()

    @property
    def pushback_ms(self) -> int:
        """The retry pushback of gRPC: 100 ms past the stop."""
        return round(self.refuse_s * 1000) + 100

    @property
    def retry_after_s(self) -> int:
        """REST's Retry-After (whole seconds, at least 1): past the stop."""
        return max(1, math.ceil(self.refuse_s + 0.1))


class DrainInterceptor(grpc.ServerInterceptor):
    """Answers every call that starts after `drain.begin()` with UNAVAILABLE and a pushback.

    One attribute read per call while serving; the refusal never parses the request.
    """

    def __init__(self, drain: Drain) -> None:
        self.drain = drain

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not self.drain.draining or \
                handler_call_details.method.startswith(_EXEMPT):
            return handler
        return self._refusing(handler)

    def _refuse(self, _request, context: grpc.ServicerContext):
        context.set_trailing_metadata((("grpc-retry-pushback-ms",
                                        str(self.drain.pushback_ms)),))
        context.abort(grpc.StatusCode.UNAVAILABLE, MESSAGE)

    def _refusing(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """A handler of the same kind as `handler` that refuses (raw bytes, never parsed)."""
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._refuse)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._refuse)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(self._refuse)
        return grpc.stream_stream_rpc_method_handler(self._refuse)
