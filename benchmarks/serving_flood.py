"""Slow clients and connection floods against `ampflow serve` (its own process), side by side.

Three phases in one run, each timing N real requests from 127.0.0.1 (REST metadata GET and gRPC
Predict, one at a time):
  quiet      nothing else connected;
  rest-flood HOLD half-sent REST requests (a head that never ends) held open from 127.0.0.2;
  grpc-idle  HOLD HTTP/2 connections from 127.0.0.2 that never open a stream.
Reports p50/p99/max latency and failures per phase, how many flood connections the server
refused at once (503) or timed out (408) and how long after the header timeout the last one
was closed, and the server's RSS. The issue's bar: a real REST request still answered within
a second while 500 half-sent requests are held.

    .venv/bin/python benchmarks/serving_flood.py --out benchmarks/results
Writes serving_flood.json and .md (naming the host's CPU); exits 1 if a real request failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODEL = "ampflow"
ATTACKER = "127.0.0.2"
HALF_SENT = (b"POST /v1/models/ampflow:predict HTTP/1.1\r\nHost: server\r\n"
             b"Content-Type: application/json\r\n")
H2_IDLE = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
           + b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")


def cpu() -> dict:
    """The host: model name and the SIMD flags that change TF's kernels."""
    model, flags = platform.processor(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = sorted(f for f in line.split(":", 1)[1].split()
                               if f.startswith(("avx", "amx", "fma", "sse4")))
                break
    except OSError:
        pass
    return {"model": model, "flags": flags, "cores": os.cpu_count()}


def _hold(port: int, payload: bytes, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10,
                                        source_address=(ATTACKER, 0))
        sock.sendall(payload)
        held.append(sock)
    return held


def _drain(held: list[socket.socket], timeout_s: float) -> dict:
    """Read every held socket until the server closes it; what it answered, and when."""
    start, first = time.monotonic(), {}
    open_ = {s.fileno(): s for s in held}
    answers = {"503": 0, "408": 0, "other": 0, "still_open": 0}
    last_close = 0.0
    while open_ and time.monotonic() - start < timeout_s:
        ready, _, _ = select.select(list(open_.values()), [], [], 0.5)
        for sock in ready:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                first.setdefault(sock.fileno(), data)
                continue
            head = first.get(sock.fileno(), b"")[:12]
            key = "503" if b" 503" in head else "408" if b" 408" in head else "other"
            answers[key] += 1
            last_close = time.monotonic() - start
            del open_[sock.fileno()]
    answers["still_open"] = len(open_)
    for sock in held:
        sock.close()
    answers["last_closed_after_s"] = round(last_close, 2)
    return answers


def _time_requests(rest: str, grpc_address: str, n: int) -> dict:
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.testing import sample_images

    out = {}
    images = sample_images(1)
    client = PredictionClient(grpc_address, timeout_s=10.0, retries=0)
    try:
        for name, call in (("rest_get_ms", lambda: urllib.request.urlopen(
                f"http://{rest}/v1/models/{MODEL}", timeout=10).read()),
                           ("grpc_predict_ms", lambda: client.predict(MODEL, images))):
            times, failures = [], 0
            for _ in range(n):
                t0 = time.perf_counter()
                try:
                    call()
                    times.append((time.perf_counter() - t0) * 1000)
                except Exception:  # noqa: BLE001 - a failure is what is counted here
                    failures += 1
            times.sort()
            out[name] = {"p50": round(statistics.median(times), 2) if times else None,
                         "p99": round(times[int(0.99 * (len(times) - 1))], 2) if times else None,
                         "max": round(times[-1], 2) if times else None, "failures": failures}
    finally:
        client.close()
    return out


def run(workdir: Path, hold: int, requests: int, header_timeout_s: float) -> dict:
    from ampflow.serving.testing import ServeProcess, write_model_version

    base = workdir / MODEL
    write_model_version(base, 1)
    rest_port = _free_port()
    flags = ("--rest-api-port", str(rest_port), "--rest-header-timeout-s", str(header_timeout_s),
             "--grpc-max-connection-idle-s", str(header_timeout_s))
    with ServeProcess(MODEL, base, workdir / "serve.log", *flags) as server:
        rest = f"127.0.0.1:{rest_port}"
        _time_requests(rest, server.address, 5)  # warm both paths
        report = {"quiet": _time_requests(rest, server.address, requests)}
        held = _hold(rest_port, HALF_SENT, hold)
        report["rest_flood"] = _time_requests(rest, server.address, requests)
        report["rest_flood"]["flood"] = _drain(held, header_timeout_s + 30)
        held = _hold(int(server.address.rsplit(":", 1)[1]), H2_IDLE, hold)
        report["grpc_idle"] = _time_requests(rest, server.address, requests)
        report["grpc_idle"]["flood"] = _drain(held, header_timeout_s + 30)
        report["server_rss_mb"] = round(server.rss_mb, 1)
    return report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def to_markdown(result: dict) -> str:
    host = result["host"]
    lines = [f"# Connection floods against `ampflow serve` — {host['model']}, {host['cores']} "
             f"cores ({' '.join(host['flags'])})", "",
             f"{result['hold']} connections held from {ATTACKER}; {result['requests']} real "
             f"requests per phase from 127.0.0.1, one at a time; header timeout / gRPC idle "
             f"limit {result['header_timeout_s']:g} s.", "",
             "| phase | REST GET p50 / p99 / max ms | fails | gRPC Predict p50 / p99 / max ms "
             "| fails | flood answered (503 / 408 / other / still open) | last closed after |",
             "|---|---|---|---|---|---|---|"]
    for phase in ("quiet", "rest_flood", "grpc_idle"):
        row = result["phases"][phase]
        rest, grpc = row["rest_get_ms"], row["grpc_predict_ms"]
        flood = row.get("flood")
        answered = (f"{flood['503']} / {flood['408']} / {flood['other']} / "
                    f"{flood['still_open']}") if flood else "—"
        closed = f"{flood['last_closed_after_s']} s" if flood else "—"
        lines.append(f"| {phase} | {rest['p50']} / {rest['p99']} / {rest['max']} | "
                     f"{rest['failures']} | {grpc['p50']} / {grpc['p99']} / {grpc['max']} | "
                     f"{grpc['failures']} | {answered} | {closed} |")
    lines += ["", f"Server RSS at the end: {result['phases']['server_rss_mb']} MB. Latencies are"
              " one run on a host that may be busy: read the tails as 'answered', not as a"
              " bound."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hold", type=int, default=500, help="flood connections held")
    parser.add_argument("--requests", type=int, default=200, help="real requests per phase")
    parser.add_argument("--header-timeout-s", type=float, default=5.0,
                        help="the server's REST header timeout and gRPC idle limit")
    parser.add_argument("--out", default=None, help="folder for serving_flood.json/.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        phases = run(Path(tmp), args.hold, args.requests, args.header_timeout_s)
    result = {"host": cpu(), "hold": args.hold, "requests": args.requests,
              "header_timeout_s": args.header_timeout_s, "phases": phases}
    text = to_markdown(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "serving_flood.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "serving_flood.md").write_text(text)
    failed = sum(phases[p][k]["failures"] for p in ("quiet", "rest_flood", "grpc_idle")
                 for k in ("rest_get_ms", "grpc_predict_ms"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
