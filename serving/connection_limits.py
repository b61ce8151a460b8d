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
  call closed after `grpc_max_connection_idle_s` (GOAWAY), keepalive pings from clients no more
  often than `grpc_min_ping_interval_s`.
Why not a proxy in front: `ampflow serve` is reached directly in the demo, in KServe and from
the docs; a server that faces clients must hold these bounds itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ampflow.errors import ConfigError


def _limit(default, help_text: str):
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """The connection bounds of `ampflow serve`; the defaults are nginx's where it has one."""

    header_timeout_s: float = _limit(20.0, "REST: seconds a request head may take from its "
                                     "first byte (and a new connection to send one)")
    body_timeout_s: float = _limit(60.0, "REST: seconds a request body may pause between reads")
    keepalive_timeout_s: float = _limit(5.0, "REST: seconds an idle keep-alive connection is kept")
    max_connections: int = _limit(512, "REST: connections held at once, in all")
    max_connections_per_address: int = _limit(128, "REST: connections held at once per client "
                                              "address (raise it behind a proxy or sidecar, "
                                              "whose connections share one address)")
    grpc_max_concurrent_streams: int = _limit(100, "gRPC: calls at once on one connection")
    grpc_max_connection_idle_s: float = _limit(300.0, "gRPC: seconds a connection with no call "
                                               "is kept before a GOAWAY")
    grpc_min_ping_interval_s: float = _limit(10.0, "gRPC: the fastest keepalive ping rate a "
                                             "client may use (seconds between pings)")

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s",
                     "grpc_max_connection_idle_s", "grpc_min_ping_interval_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds. Received: "
                                  f"{name}={getattr(self, name)}")
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


def grpc_server_options(limits: ConnectionLimits) -> list[tuple[str, int]]:
    """The grpcio channel arguments that bound streams, idle connections and client pings."""
    return [
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
    """An h11 protocol class (uvicorn `http=`) holding `limits`; one class per server."""
    open_per_address: Counter[str] = Counter()

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _address: str | None = None
        _lingering = False

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else "unknown"
            if len(self.connections) > limits.max_connections:
                return self._refuse(f"the server holds its maximum of {limits.max_connections} "
                                    "connections; retry later")
            if open_per_address[address] >= limits.max_connections_per_address:
                return self._refuse(f"{address} holds the maximum of "
                                    f"{limits.max_connections_per_address} connections per "
                                    "client address; reuse or close them")
            self._address = address
            open_per_address[address] += 1
            self._arm(limits.header_timeout_s, "the request head did not arrive within "
                      f"{limits.header_timeout_s:g} s")

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self._address is not None:
                open_per_address[self._address] -= 1
                if open_per_address[self._address] <= 0:
                    del open_per_address[self._address]
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # read and dropped, so that our close is a FIN, not a reset
            waiting_for_head = self.conn.their_state is h11.IDLE
            super().data_received(data)
            state = self.conn.their_state
            if state is h11.IDLE and not waiting_for_head:
                pass  # a request ended and the next one has not begun: keep-alive's timer
            elif state is h11.IDLE and self._timer is None:
                # the first bytes of a head after keep-alive: its total time starts now
                self._arm(limits.header_timeout_s, "the request head did not arrive within "
                          f"{limits.header_timeout_s:g} s")
            elif state is h11.SEND_BODY:
                self._arm(limits.body_timeout_s, "the request body paused for more than "
                          f"{limits.body_timeout_s:g} s")
            elif state is not h11.IDLE:
                self._disarm()  # the whole request is in: the app's time, not the client's

        def on_response_complete(self) -> None:
            if self._lingering:
                return
            self._disarm()
            super().on_response_complete()

        def _arm(self, seconds: float, why: str) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._time_out, why)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _time_out(self, why: str) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None:  # the app reading the body gets a disconnect
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            if self.cycle is None or not self.cycle.response_started:
                self._answer_and_close(_response(408, "Request Timeout", why))
            else:
                self.transport.close()

        def _refuse(self, why: str) -> None:
            self._answer_and_close(_response(503, "Service Unavailable", why))

        def _answer_and_close(self, response: bytes) -> None:
            """Send `response`, then close as nginx's lingering close does.

            Closing a socket with unread request bytes in it makes the kernel send a reset,
            and the client may lose the response before reading it; so the write side is
            shut first and what still arrives is read and dropped for up to LINGER_S.
            """
            self._lingering = True
            self.transport.write(response)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)

    return GuardedH11Protocol
