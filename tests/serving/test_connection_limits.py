"""Many connections at once: slow and half-sent requests, idle connections, floods (REST, gRPC).

The attacker's connections come from 127.0.0.2 and the real client from 127.0.0.1 (both are
loopback on Linux), so the per-address bound is what keeps the real client served, as it would
for two hosts. Before these bounds, 500 half-sent requests from one client made every REST
request answer 503 for as long as they were held (uvicorn's `limit_concurrency` counted them).
"""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.error
import urllib.request

import pytest
from serving_helpers import MODEL, free_port, install_version
from test_serving_server import pki  # noqa: F401 - the throwaway CA and certificates

from ampflow.errors import ConfigError
from ampflow.serving.config import ConnectionLimits
from ampflow.serving.testing import sample_images

pytestmark = pytest.mark.serving

ATTACKER = "127.0.0.2"
HALF_SENT = (b"POST /v1/models/ampflow:predict HTTP/1.1\r\nHost: server\r\n"
             b"Content-Type: application/json\r\n")  # the head never ends


def _connect(port: int, source: str = ATTACKER) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    return sock


def _read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes; raises socket.timeout if it does not."""
    sock.settimeout(timeout_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _status_of(rest_address: str) -> int:
    with urllib.request.urlopen(f"http://{rest_address}/v1/models/{MODEL}", timeout=5) as reply:
        json.load(reply)
        return reply.status


@pytest.fixture
def rest_server(start_server, model_store, tmp_path):
    def _start(**limits):
        base = tmp_path / MODEL
        install_version(model_store, base, 1)
        return start_server(base, rest_api_port=free_port(),
                            connection_limits=ConnectionLimits(**limits))
    return _start


@pytest.fixture
def enough_file_descriptors():
    """500 client sockets and their 500 server ends live in this one process."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if max(soft, wanted) < 1200:
        pytest.skip(f"needs ~1200 file descriptors; the hard limit is {hard}")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_500_half_sent_requests_from_one_address_leave_the_rest_api_answering(
        rest_server, enough_file_descriptors):
    # while the 500 connect, the address's 32 slots stay full (a slot a timeout frees is taken
    # by the next connection), so a short timeout leaves the claim whole; 1.5 s is the real
    # client's (it too must send its head within it)
    server = rest_server(header_timeout_s=1.5, max_connections_per_address=32)
    port = int(server.rest_address.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(500):
            sock = _connect(port)
            sock.sendall(HALF_SENT)
            held.append(sock)
        assert _status_of(server.rest_address) == 200  # a real client, another address

        replies = [_read_until_closed(sock, timeout_s=15) for sock in held]
    finally:
        for sock in held:
            sock.close()
    refused = [r for r in replies if r.startswith(b"HTTP/1.1 503")]
    timed_out = [r for r in replies if r.startswith(b"HTTP/1.1 408")]
    # every one answered and closed; at least the first 32 were held until their timeout
    # (more if connecting 500 took longer than the timeout on a slow host: slots free up)
    assert len(refused) + len(timed_out) == 500 and len(timed_out) >= 32 and refused, (
        len(refused), len(timed_out))
    assert b"per client address" in refused[0] and b"request head" in timed_out[0]


def test_a_head_trickled_one_byte_at_a_time_is_cut_at_the_header_timeout(rest_server):
    """The head's time is a total (nginx's client_header_timeout), not a pause between bytes."""
    server = rest_server(header_timeout_s=1.0)
    sock = _connect(int(server.rest_address.rsplit(":", 1)[1]))
    answer = b""
    try:
        for byte in HALF_SENT:  # one byte per 0.1 s: never a pause near the 1 s timeout
            sock.sendall(bytes([byte]))
            time.sleep(0.1)
            sock.settimeout(0.001)
            try:
                if answer := sock.recv(65536):
                    break
            except (BlockingIOError, TimeoutError):
                continue
        else:
            pytest.fail("the server let a trickled head run longer than the whole head takes")
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"request head" in answer


def test_a_body_that_stops_arriving_is_cut_and_the_connection_freed(rest_server):
    server = rest_server(body_timeout_s=0.5, max_connections_per_address=1)  # head and part
    # of the body come in one send, so no byte of the client's has to beat the 0.5 s
    port = int(server.rest_address.rsplit(":", 1)[1])
    sock = _connect(port)
    sock.sendall(HALF_SENT + b"Content-Length: 100\r\n\r\n{\"instances\": ")
    reply = _read_until_closed(sock, timeout_s=10)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408") and b"request body" in reply
    # its slot is free again: the same address may connect and be answered
    again = _connect(port)
    again.sendall(f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n"
                  .encode())
    assert _read_until_closed(again, timeout_s=10).startswith(b"HTTP/1.1 200")
    again.close()


def test_a_connection_that_never_sends_is_closed_and_keep_alive_idles_out(rest_server):
    """Closed after --rest-keepalive-timeout-s (0.5 s), well before uvicorn's own 5 s.

    The head's timeout stays 1 s: the kept connection's GET has to arrive within it. The two
    connections are open side by side, so their timeouts run out together."""
    server = rest_server(header_timeout_s=1.0, keepalive_timeout_s=0.5)
    port = int(server.rest_address.rsplit(":", 1)[1])
    silent = _connect(port)
    kept = _connect(port)
    kept.sendall(f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: s\r\n\r\n".encode())
    reply = _read_until_closed(kept, timeout_s=4)  # answered, then closed when idle
    kept.close()
    assert reply.startswith(b"HTTP/1.1 200") and reply.count(b"HTTP/1.1") == 1
    assert _read_until_closed(silent, timeout_s=10).startswith(b"HTTP/1.1 408")
    silent.close()


def test_the_total_connection_bound_refuses_with_503_and_frees_on_close(rest_server):
    server = rest_server(max_connections=4, max_connections_per_address=4)
    port = int(server.rest_address.rsplit(":", 1)[1])
    held = [_connect(port) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(b"GET ")  # begun, so each one is surely accepted and counted
        time.sleep(0.2)
        extra = _connect(port, source="127.0.0.3")
        assert _read_until_closed(extra, timeout_s=10).startswith(b"HTTP/1.1 503")
        extra.close()
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the server sees the closes asynchronously
        try:
            assert _status_of(server.rest_address) == 200
            break
        except (urllib.error.HTTPError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_many_idle_grpc_connections_leave_predict_answering_and_idle_ones_are_closed(
        start_server, model_store, tmp_path, client_for):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    # 0.5 s: no idle socket has to beat it, and the client's call keeps its own connection busy
    server = start_server(base, connection_limits=ConnectionLimits(grpc_max_connection_idle_s=0.5))
    port = server.port
    # the HTTP/2 preface, an empty SETTINGS, and the ACK of the server's SETTINGS (without
    # it, gRPC drops the connection at its handshake timeout: idleness would not be tested)
    preface = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
               + b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
    idle = []
    try:
        for _ in range(200):
            sock = _connect(port)
            sock.sendall(preface)  # an HTTP/2 connection that never opens a stream
            idle.append(sock)
        client = client_for(server.address)
        assert client.predict(MODEL, sample_images(1)).version == 1
        closed = _count_closed_within(idle, timeout_s=15)
    finally:
        for sock in idle:
            sock.close()
    assert closed == len(idle)


def _count_closed_within(sockets: list[socket.socket], timeout_s: float) -> int:
    """How many of `sockets` the server closes (after whatever it sends) within `timeout_s`."""
    open_ = {sock.fileno(): sock for sock in sockets}
    deadline = time.monotonic() + timeout_s
    while open_ and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(list(open_.values()), [], [], left)
        for sock in readable:
            try:
                if not sock.recv(65536):
                    del open_[sock.fileno()]
            except ConnectionResetError:
                del open_[sock.fileno()]
    return len(sockets) - len(open_)


@pytest.mark.parametrize("field,value", [("header_timeout_s", 0), ("max_connections", 0),
                                         ("grpc_max_connection_idle_s", float("inf")),
                                         ("body_timeout_s", float("nan")),
                                         ("grpc_min_ping_interval_s", 3e6),
                                         ("max_connections_per_address", 10**6),
                                         ("grpc_max_concurrent_streams", 0)])
def test_limits_out_of_range_are_refused_with_the_field_named(field, value):
    with pytest.raises(ConfigError, match=field):
        ConnectionLimits(**{field: value})


def test_serve_flags_set_every_limit_and_the_real_binary_is_not_chosen_for_them(tmp_path):
    import dataclasses

    from ampflow.cli import build_parser
    from ampflow.serving.cli import serve_config_from_args
    from ampflow.serving.tf_serving_binary import cannot_honour

    argv = ["serve", "--model-base-path", str(tmp_path), "--host", "0.0.0.0",
            "--allow-reload-config"]
    default = serve_config_from_args(build_parser().parse_args(argv))
    assert default.connection_limits == ConnectionLimits() and cannot_honour(default) == []
    changed = {"--rest-header-timeout-s": "3", "--rest-body-timeout-s": "4",
               "--rest-keepalive-timeout-s": "2", "--rest-max-connections": "99",
               "--rest-max-connections-per-address": "7", "--grpc-max-concurrent-streams": "5",
               "--grpc-max-connection-idle-s": "30", "--grpc-min-ping-interval-s": "1",
               "--grpc-max-connection-age-s": "20", "--grpc-max-connection-age-grace-s": "3"}
    config = serve_config_from_args(build_parser().parse_args(
        argv + [x for pair in changed.items() for x in pair]))
    assert [float(v) for v in changed.values()] == [
        float(getattr(config.connection_limits, f.name))
        for f in dataclasses.fields(ConnectionLimits)]
    assert any("connection limits" in reason for reason in cannot_honour(config))


GET = f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: s\r\n\r\n".encode()


def test_a_pipelined_request_whose_body_never_comes_is_still_cut(rest_server):
    """The second request starts while the first is answered, with no bytes arriving."""
    server = rest_server(body_timeout_s=0.5)  # both heads come in one send: nothing to beat
    sock = _connect(int(server.rest_address.rsplit(":", 1)[1]), source="127.0.0.1")
    sock.sendall(GET + b"POST /v1/models/ampflow:predict HTTP/1.1\r\nHost: s\r\n"
                       b"Content-Length: 10\r\n\r\n")
    reply = _read_until_closed(sock, timeout_s=10)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in reply


def test_a_body_still_trickling_after_an_early_answer_is_cut(start_server, model_store, tmp_path):
    """A body declared far past the limit is answered (429) before it is read."""
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, rest_api_port=free_port(), max_message_bytes=1024,
                          connection_limits=ConnectionLimits(body_timeout_s=1.0))
    sock = _connect(int(server.rest_address.rsplit(":", 1)[1]), source="127.0.0.1")
    sock.sendall(b"POST /v1/models/ampflow:predict HTTP/1.1\r\nHost: s\r\n"
                 b"Content-Length: 10000000\r\n\r\n{")  # > limit + 1 MiB
    first = b""
    sock.settimeout(10)
    while b"\r\n\r\n" not in first:
        first += sock.recv(65536)
    sock.sendall(b'"instances": ')  # more of the body, then silence
    _read_until_closed(sock, timeout_s=10)
    sock.close()
    assert first.startswith(b"HTTP/1.1 429")


def test_a_slow_second_head_on_a_keep_alive_connection_gets_408(rest_server):
    server = rest_server(header_timeout_s=1.0, keepalive_timeout_s=30.0)
    sock = _connect(int(server.rest_address.rsplit(":", 1)[1]), source="127.0.0.1")
    sock.sendall(GET)
    sock.settimeout(10)
    first = sock.recv(65536)
    sock.sendall(b"GET /v1/models/ampflow HTTP/1.1\r\n")  # and the head never ends
    rest = _read_until_closed(sock, timeout_s=10)
    sock.close()
    reply = first + rest
    assert reply.startswith(b"HTTP/1.1 200") and reply.count(b"HTTP/1.1 ") == 2
    assert b"HTTP/1.1 408" in reply and b"request head" in reply


def test_refused_connections_still_lingering_do_not_fill_the_server_for_others(rest_server):
    """One address's refused flood must not count against everyone's total."""
    server = rest_server(max_connections=16, max_connections_per_address=2)
    port = int(server.rest_address.rsplit(":", 1)[1])
    flood = []
    try:
        for _ in range(40):
            sock = _connect(port)
            sock.sendall(HALF_SENT)
            flood.append(sock)
        assert _status_of(server.rest_address) == 200
    finally:
        for sock in flood:
            sock.close()


def test_a_tls_connection_that_never_says_hello_is_closed_at_the_header_timeout(
        start_server, model_store, tmp_path, pki):  # noqa: F811
    from ampflow.serving.config import TlsConfig

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, rest_api_port=free_port(),
                          tls=TlsConfig(pki["server"], pki["server_key"]),
                          connection_limits=ConnectionLimits(header_timeout_s=0.5))
    sock = _connect(int(server.rest_address.rsplit(":", 1)[1]))
    assert _read_until_closed(sock, timeout_s=15) == b""  # asyncio's own default: 60 s
    sock.close()
