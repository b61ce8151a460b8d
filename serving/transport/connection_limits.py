"""Bounds on what many connections can do to the server: slow clients, idle ones, floods.

One request is bounded elsewhere (its declared size before any allocation, its body size); this
module bounds the *connections*, which a client holds without sending a whole request:

- REST (uvicorn's h11 protocol, subclassed): a request's head must arrive within
  `header_timeout_s` of its first byte (nginx's `client_header_timeout`: a total, so a client
  that trickles one byte at a time cannot hold it open), its body may pause at most
  `body_timeout_s` between reads (`client_body_timeout`), a connection that sends nothing is
  closed after `header_timeout_s`, an idle keep-alive one after `keepalive_timeout_s`; at most
  `max_connections_per_address` connections per client address (`limit_conn`) and
  `max_connections` in all. A refused connection gets `503` with a JSON error and is closed, a
  timed-out one `408`, so that a flood from one address never turns into `503` for everyone, as
  uvicorn's own `limit_concurrency` does (it counts half-open connections too).
- gRPC (grpcio's channel arguments): streams per HTTP/2 connection, connections idle without a
  call closed after `grpc_max_connection_idle_s` (GOAWAY), and any after
  `grpc_max_connection_age_s` (so that `--workers N` clients spread again), keepalive pings
  from clients no more often than `grpc_min_ping_interval_s`.
Why not a proxy in front: `ampflow serve` is reached directly in the demo, in KServe and from
the docs; a server that faces clients must hold these bounds itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import Counter

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ampflow.serving.config import WORKERS_CONNECTION_AGE_S, ConnectionLimits


def grpc_server_options(limits: ConnectionLimits, workers: bool = False
                        ) -> list[tuple[str, int]]:
    """The grpcio channel arguments that bound streams, connections' idle time and age, pings.

    `workers`: one of `--workers N`, where an age left at 0 is WORKERS_CONNECTION_AGE_S.
    """
    age_s = limits.grpc_max_connection_age_s or (WORKERS_CONNECTION_AGE_S if workers else 0)
    age = [("grpc.max_connection_age_ms", int(age_s * 1000)),
           ("grpc.max_connection_age_grace_ms",
            int(limits.grpc_max_connection_age_grace_s * 1000))] if age_s else []
    return [
        *age,
        ("grpc.max_concurrent_streams", limits.grpc_max_concurrent_streams),
        ("grpc.max_connection_idle_ms", int(limits.grpc_max_connection_idle_s * 1000)),
        # a client may ping (keepalive) this often, even between calls; faster is a GOAWAY
        ("grpc.http2.min_ping_interval_without_data_ms",
         int(limits.grpc_min_ping_interval_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


LINGER_S = 2.0  # how long a refused or timed-out connection is read and dropped before closing


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def guarded_h11_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """An h11 protocol class (uvicorn `http=`) holding `limits`; one class per server.

    After every event (bytes in, a response out) the one timer of a connection is set from
    h11's view of the client (`their_state`): a body being sent gets the body timeout, restarted
    by each read; bytes of a head not yet complete, the header timeout, counted from its first
    byte (or from the connection); nothing pending, the keep-alive timeout; a whole request
    being answered, no timer (that is the app's time). Deciding from the state, not from which
    callback ran, covers pipelined requests and answers sent before the body ended.
    """
    open_per_address: Counter[str] = Counter()  # accepted, not refused, connections
    lingering = [0]  # refused or timed-out connections still being read and dropped

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _timer_kind: str | None = None
        _address: str | None = None
        _lingering = False

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            _no_delay(transport)
            address = self.client[0] if self.client else "unknown"
            if sum(open_per_address.values()) >= limits.max_connections:
                return self._refuse(f"the server holds its maximum of {limits.max_connections} "
                                    "connections; retry later")
            if open_per_address[address] >= limits.max_connections_per_address:
                return self._refuse(f"{address} holds the maximum of "
                                    f"{limits.max_connections_per_address} connections per "
                                    "client address; reuse or close them")
            self._address = address
            open_per_address[address] += 1
            self._arm("head", limits.header_timeout_s)  # a new connection must send a head

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self._lingering:
                self._lingering = False
                lingering[0] -= 1
            if self._address is not None:
                open_per_address[self._address] -= 1
                if open_per_address[self._address] <= 0:
                    del open_per_address[self._address]
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # read and dropped, so that our close is a FIN, not a reset
            super().data_received(data)
            self._rearm()

        def on_response_complete(self) -> None:
            if self._lingering:
                return
            super().on_response_complete()  # may start the next, pipelined, request
            self._rearm()

        def _rearm(self) -> None:
            if self._lingering or self.transport.is_closing():
                return
            state = self.conn.their_state
            if state is h11.SEND_BODY:
                self._arm("body", limits.body_timeout_s)
            elif state is h11.IDLE and self.conn.trailing_data[0]:
                if self._timer_kind != "head":  # a total from the head's first byte
                    self._arm("head", limits.header_timeout_s)
            elif state is h11.IDLE:
                if self._timer_kind not in ("head", "idle"):
                    self._arm("idle", limits.keepalive_timeout_s)
            else:
                self._disarm()  # a whole request in (the app's time), or closing

        def _arm(self, kind: str, seconds: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._time_out, kind)
            self._timer_kind = kind

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_kind = None, None

        def _time_out(self, kind: str) -> None:
            self._timer, self._timer_kind = None, None
            if self.transport.is_closing():
                return
            if kind == "idle":
                self.transport.close()
                return
            if self.conn.their_state is h11.SEND_BODY and self.cycle is not None:
                self.cycle.disconnected = True  # the app reading the body gets a disconnect
                self.cycle.message_event.set()
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # no answer begun
                why = (f"the request head did not arrive within {limits.header_timeout_s:g} s"
                       if kind == "head" else
                       f"the request body paused for more than {limits.body_timeout_s:g} s")
                self._answer_and_close(_response(408, "Request Timeout", why))
            else:
                self.transport.close()

        def _refuse(self, why: str) -> None:
            self._answer_and_close(_response(503, "Service Unavailable", why))

        def _answer_and_close(self, response: bytes) -> None:
            """Send `response`, then close as nginx's lingering close does.

            Closing a socket with unread request bytes in it makes the kernel send a reset,
            and the client may lose the response before reading it; so the write side is
            shut first and what still arrives is read and dropped for up to LINGER_S. At
            most `max_connections` linger at once; past that a connection is closed at once.
            """
            self.transport.write(response)
            if lingering[0] >= limits.max_connections:
                self.transport.close()
                return
            self._lingering = True
            lingering[0] += 1
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)
            self._timer_kind = "linger"

    return GuardedH11Protocol


def _no_delay(transport) -> None:
    """TCP_NODELAY on a REST connection: h11 writes a response's head and body separately.

    With Nagle's algorithm on, the body waits for the client to acknowledge the head, and a
    client delays that ACK by up to 40 ms: every REST call took ~44 ms on loopback.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def handshake_bounded_server(config, handshake_timeout_s: float):
    """A uvicorn Server whose TLS handshakes must end within `handshake_timeout_s`.

    Over TLS the protocol above sees a connection only once its handshake is done, so a client
    that connects and never sends a ClientHello would be bounded by asyncio's default
    `ssl_handshake_timeout` (60 s) alone, uncounted; uvicorn has no setting for it, so the
    loop's `create_server` is given one while the server starts (asyncio's loop, set in the
    Config: uvloop's cannot be wrapped this way).
    """
    import uvicorn

    class HandshakeBoundedServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            loop = asyncio.get_running_loop()
            create_server = loop.create_server

            async def bounded(*args, **kwargs):
                if kwargs.get("ssl") is not None:
                    kwargs.setdefault("ssl_handshake_timeout", handshake_timeout_s)
                return await create_server(*args, **kwargs)

            loop.create_server = bounded
            try:
                await super().startup(sockets)
            finally:
                del loop.create_server  # the class's method again

    return HandshakeBoundedServer(config)
