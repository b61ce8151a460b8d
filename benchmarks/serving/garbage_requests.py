"""Is the RSS growth on undeserializable requests ours or grpcio's? Issue 14 item 2.

Sends rounds of requests whose bytes do not parse as a `PredictRequest` to three servers, each
in its own process, and reports the server's RSS after each round and its log bytes:
- `grpcio`: a minimal grpcio server with the stock `PredictRequest.FromString` deserializer
  (grpcio logs "Exception deserializing request!" with a traceback and answers INTERNAL);
- `grpcio-tolerant`: the same minimal server with a deserializer that never raises (it
  returns a marker object; returning None takes grpcio's failed-parse path again);
- `ampflow`: `ampflow serve` itself.

    .venv/bin/python benchmarks/serving/garbage_requests.py --rounds 3 --requests 5000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MINIMAL_SERVER = r'''
import logging, sys, time
from concurrent import futures
import grpc
from tensorflow_serving.apis import predict_pb2
logging.basicConfig(level=logging.INFO)
tolerant = sys.argv[1] == "tolerant"

BAD = object()

def deserialize(data):
    if not tolerant:
        return predict_pb2.PredictRequest.FromString(data)
    try:
        return predict_pb2.PredictRequest.FromString(data)
    except Exception:
        return BAD  # grpcio treats None as a failed parse: a marker keeps the normal path

def predict(request, context):
    context.abort(grpc.StatusCode.INTERNAL if request is BAD else
                  grpc.StatusCode.INVALID_ARGUMENT, "bad request")

handler = grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", {
    "Predict": grpc.unary_unary_rpc_method_handler(
        predict, request_deserializer=deserialize,
        response_serializer=predict_pb2.PredictResponse.SerializeToString)})
server = grpc.server(futures.ThreadPoolExecutor(16))
server.add_generic_rpc_handlers((handler,))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(f"listening on 127.0.0.1:{port}", flush=True)
time.sleep(3600)
'''


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(kind: str, workdir: Path) -> tuple[subprocess.Popen, str, Path]:
    log_path = workdir / f"{kind}.log"
    log = open(log_path, "w")
    if kind == "ampflow":
        from ampflow.serving.testing import write_model_version

        base = workdir / "model"
        write_model_version(base, 1)
        cmd = [sys.executable, "-m", "ampflow.serving.cli", "serve", "--server", "local",
               "--port", "0", "--model-base-path", str(base)]
    else:
        cmd = [sys.executable, "-c", MINIMAL_SERVER,
               "tolerant" if kind == "grpcio-tolerant" else "stock"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if "listening on" in line:
            return proc, line.strip().rsplit(" ", 1)[1], log_path
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"{kind} server did not start; see {log_path}")


def garbage(i: int) -> bytes:
    # field 1 (model_spec) declared as a 200-byte message with 3 bytes present: never parses
    return b"\x0a\xc8\x01" + bytes([i % 256, 1, 2])


def run(kind: str, rounds: int, requests: int, workdir: Path) -> dict:
    import grpc

    proc, address, log_path = start(kind, workdir)
    try:
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
            codes: dict[str, int] = {}
            rss = [rss_mb(proc.pid)]
            for _ in range(rounds):
                for i in range(requests):
                    try:
                        call(garbage(i), timeout=10)
                        codes["OK"] = codes.get("OK", 0) + 1
                    except grpc.RpcError as e:
                        codes[e.code().name] = codes.get(e.code().name, 0) + 1
                time.sleep(0.5)
                rss.append(rss_mb(proc.pid))
        return {"server": kind, "rss_mb": [round(r, 1) for r in rss],
                "growth_mb_per_round": round((rss[-1] - rss[1]) / max(1, rounds - 1), 1),
                "codes": codes, "log_bytes": log_path.stat().st_size}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=5000, help="garbage requests per round")
    p.add_argument("--servers", nargs="+", default=["grpcio", "grpcio-tolerant", "ampflow"])
    p.add_argument("--out", default=None, help="write the JSON report here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ampflow-garbage-") as tmp:
        report = [run(kind, args.rounds, args.requests, Path(tmp)) for kind in args.servers]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
