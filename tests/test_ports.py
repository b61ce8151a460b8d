"""The ports the tests start servers on (tests/ports.py): none the kernel could hand to another
socket before the server binds it, none handed out twice."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from ports import LOWEST, free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="no Linux ephemeral port range to stay below")
def test_free_ports_lie_below_the_ephemeral_range_each_once_and_each_binds():
    # Before: bind(0) and close, i.e. an ephemeral port that any client connection (its source
    # port) or another bind(0) could take before the server bound it (CI: "address in use").
    ephemeral_start = int(RANGE.read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports), ports
    assert all(LOWEST <= port < ephemeral_start for port in ports), (ephemeral_start, ports)
    for port in ports[:5]:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
            server.listen()
