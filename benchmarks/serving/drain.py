"""What clients see when `ampflow serve` gets SIGTERM under load: the codes of calls after it.

Starts `ampflow serve --server local` (gRPC and REST) on the tiny contract model, has
`--grpc-clients` threads (one channel each, under a gRPC retry policy on UNAVAILABLE that
honours the server's pushback) and `--rest-clients` threads (one keep-alive connection each,
reconnecting when told `Connection: close`) call Predict in a loop, sends SIGTERM, and counts
what every call made after the signal ended with, per stop and in total. CANCELLED is the one
a client does not retry (transport/drain.py says why it happened). Run it on two commits to
compare; the JSON names the commit, the CPU and the load.

    .venv/bin/python benchmarks/serving/drain.py --stops 3   # writes benchmarks/results/
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_host  # noqa: E402

from ampflow.files import write_json_atomic  # noqa: E402

RETRY_POLICY = json.dumps({"methodConfig": [{"name": [{}], "retryPolicy": {
    "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]})


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--stops", type=int, default=3, help="servers started and SIGTERMed")
    p.add_argument("--grpc-clients", type=int, default=16, help="gRPC client threads")
    p.add_argument("--rest-clients", type=int, default=4, help="REST client threads")
    p.add_argument("--load-s", type=float, default=1.5, help="calls before the SIGTERM")
    p.add_argument("--out", default="benchmarks/results", help="output dir")
    p.add_argument("--name", default="serving_drain", help="result file stem")
    p.add_argument("--label", default="", help="what code served (e.g. 'before: <commit>')")
    return p.parse_args(argv)


def _grpc_loop(stub, request, stop: threading.Event, after, codes, lock) -> None:
    import grpc

    while not stop.is_set():
        try:
            stub.Predict(request, timeout=10)
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
            time.sleep(0.05)  # retries exhausted: the next call a little later
        if after.is_set():
            with lock:
                codes["grpc " + code] += 1


def _rest_loop(port: int, body: bytes, stop: threading.Event, after, codes, lock) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        try:
            conn.request("POST", "/v1/models/ampflow:predict", body,
                         {"content-type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            code = str(reply.status)
            if reply.getheader("connection") == "close":
                conn.close()
        except OSError as e:
            code = type(e).__name__
            conn.close()
            time.sleep(0.05)
        if after.is_set():
            with lock:
                codes["rest " + code] += 1


def one_stop(args, base: Path, log: Path) -> dict:
    """One server under load, SIGTERMed: {"grpc CODE" / "rest STATUS": calls after it}."""
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from ampflow.serving.testing import ServeProcess, sample_images

    rest_port = _free_port()
    with ServeProcess("ampflow", base, log, "--grace-s", "5",
                      "--rest-api-port", str(rest_port)) as server:
        import tensorflow as tf

        request = predict_pb2.PredictRequest()
        request.model_spec.name = "ampflow"
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(sample_images(1)))
        body = json.dumps({"instances": sample_images(1).tolist()}).encode()
        options = [("grpc.enable_retries", 1), ("grpc.service_config", RETRY_POLICY)]
        channels = [grpc.insecure_channel(server.address, options=options)
                    for _ in range(args.grpc_clients)]
        stop, after, lock = threading.Event(), threading.Event(), threading.Lock()
        codes: collections.Counter = collections.Counter()
        threads = [threading.Thread(target=_grpc_loop, args=(
            prediction_service_pb2_grpc.PredictionServiceStub(c), request, stop, after, codes,
            lock)) for c in channels]
        threads += [threading.Thread(target=_rest_loop, args=(rest_port, body, stop, after,
                                                              codes, lock))
                    for _ in range(args.rest_clients)]
        for thread in threads:
            thread.start()
        time.sleep(args.load_s)
        after.set()
        server.proc.send_signal(signal.SIGTERM)
        exit_code = server.proc.wait(60)
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join()
        for channel in channels:
            channel.close()
    return {"exit_code": exit_code, "codes": dict(sorted(codes.items()))}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    from ampflow.serving.testing import write_model_version

    load_before = bench_host.load_average()
    with tempfile.TemporaryDirectory(prefix="ampflow-drain-") as folder:
        base = Path(folder) / "ampflow"
        write_model_version(base, 1, model_name="ampflow")
        stops = [one_stop(args, base, Path(folder) / f"serve{i}.log") for i in range(args.stops)]
    total: collections.Counter = collections.Counter()
    for stop in stops:
        total.update(stop["codes"])
    result = {"benchmark": "serving_drain", "args": vars(args), "stops": stops,
              "total": dict(sorted(total.items())),
              "cancelled": total.get("grpc CANCELLED", 0),
              "host": {"cpu": bench_host.cpu_capabilities(), "device": bench_host.device(),
                       "simd_flags": bench_host.simd_flags(), "load_before": load_before,
                       "load_after": bench_host.load_average()},
              "commit": bench_host.git_commit(("serving",))}
    out = Path(args.out) / f"{args.name}.json"
    write_json_atomic(out, result)
    print(json.dumps({"total": result["total"], "cancelled": result["cancelled"],
                      "load": [load_before, result["host"]["load_after"]]}))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
