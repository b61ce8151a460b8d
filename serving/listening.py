"""What `ampflow serve` prints once it listens, and the host a client on this machine dials.

Shared by the single server (serving/server.py) and the `--workers N` supervisor
(serving/workers.py), which prints for all its workers; TensorFlow-free, so the supervisor can
import it, and below both, so neither imports the other for it.
"""

from __future__ import annotations


def client_host(host: str) -> str:
    """The host a client on this machine dials for a bind address."""
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def announce(config, address: str, rest_address: str | None) -> None:
    """The lines `ampflow serve` prints once it listens (scripts and tests read the first)."""
    print(f"ampflow serve: listening on {address}", flush=True)
    if rest_address:
        scheme = "https" if config.tls else "http"
        print(f"ampflow serve: REST API on {scheme}://{rest_address}/v1/models/", flush=True)
        print(f"ampflow serve: Open Inference Protocol (V2) on {scheme}://{rest_address}/v2/ "
              f"and inference.GRPCInferenceService on {address}", flush=True)
