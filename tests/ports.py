"""TCP ports for the servers the tests start: below the kernel's ephemeral range, never twice.

The usual trick (bind port 0, read the port, close, let the server bind it later) hands out an
*ephemeral* port: between the close and the server's bind the kernel may give that same port to
any outgoing connection (every gRPC or HTTP client of the suite takes one as its source port) or
to another process's `bind(0)`, and the server then fails with "address in use", more often the
busier the host. The kernel never picks a port below `ip_local_port_range` by itself, so ports
from there can only be taken by an explicit bind: this module hands out each one once per
process, from a slice of its own per pytest-xdist worker (started at a pid-dependent offset,
for two runs side by side), after checking that it binds.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
from pathlib import Path

LOWEST = 20_000  # above the registered services most hosts run; the range ends at the ephemerals
_lock = threading.Lock()
_walk: dict[str, itertools.count] = {}


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; elsewhere the kernel's own choice is used (below)


def _slice() -> range:
    """This process's ports: the xdist worker's share of LOWEST..ephemeral start."""
    end = _ephemeral_start()
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    index = int(match.group(1)) if match else 0
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    size = (end - LOWEST) // workers
    return range(LOWEST + index * size, LOWEST + (index + 1) * size)


def _binds(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, that no other call of this process (or xdist worker) gets."""
    ports = _slice()
    if len(ports) < 100:  # an unusual ephemeral range: fall back on the kernel's choice
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    with _lock:
        walk = _walk.setdefault(host, itertools.count(os.getpid() % len(ports)))
        for _ in range(len(ports)):
            port = ports[next(walk) % len(ports)]
            if _binds(host, port):
                return port
    raise RuntimeError(f"no free port left in {ports.start}..{ports.stop - 1} on {host}")
