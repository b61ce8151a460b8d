"""Two builds of `ampflow serve` side by side: the same prebuilt Predict, interleaved in blocks.

On a shared host two runs of run.py minutes apart differ by more than a change does (its echo
floor moved 0.58-0.86 ms between runs here), so this starts a server of each build at once and
sends one prebuilt request (bytes, no client-side encoding: the server and the transport) to
each in turn, 50 calls a block, the order flipped every block, so both see the same load. The
other build is another checkout's importable tree, given as `--other-pythonpath` (the dir that
holds its `ampflow` package); this checkout's build is the second.

    .venv/bin/python benchmarks/serving/side_by_side.py --other-pythonpath DIR --other-label main
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_host  # noqa: E402

from ampflow.files import write_json_atomic  # noqa: E402

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--other-pythonpath", required=True, help="the other build's import root")
    p.add_argument("--other-label", default="other", help="what the other build is")
    p.add_argument("--label", default="this checkout", help="what this build is")
    p.add_argument("--blocks", type=int, default=60, help="blocks of 50 calls per build")
    p.add_argument("--out", default="benchmarks/results", help="output dir")
    p.add_argument("--name", default="serving_side_by_side", help="result file stem")
    return p.parse_args(argv)


def _percentiles(ms: list[float]) -> dict:
    ordered = sorted(ms)
    return {"calls": len(ms), "p50_ms": round(statistics.median(ms), 4),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 4)}


def measure(args, base: Path, logs: Path) -> dict:
    """{label: percentiles} of the interleaved calls to both servers."""
    import time

    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from ampflow.serving.testing import ServeProcess, sample_images

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ampflow"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(sample_images(1)))
    data = request.SerializeToString()
    os.environ["PYTHONPATH"] = args.other_pythonpath  # the other server imports its build
    try:
        other = ServeProcess("ampflow", base, logs / "other.log")
    finally:
        os.environ.pop("PYTHONPATH")
    servers = {args.other_label: other}
    try:
        servers[args.label] = ServeProcess("ampflow", base, logs / "this.log")
        calls, channels = {}, []
        for label, server in servers.items():
            channels.append(grpc.insecure_channel(server.address))
            calls[label] = channels[-1].unary_unary(PREDICT)
            for _ in range(300):  # warm-up, untimed
                calls[label](data, timeout=30)
        times: dict[str, list[float]] = {label: [] for label in servers}
        labels = list(servers)
        for block in range(args.blocks):
            for label in labels if block % 2 == 0 else labels[::-1]:
                for _ in range(50):
                    started = time.perf_counter()
                    calls[label](data, timeout=30)
                    times[label].append((time.perf_counter() - started) * 1e3)
        for channel in channels:
            channel.close()
        return {label: _percentiles(ms) for label, ms in times.items()}
    finally:
        for server in servers.values():
            server.stop()


def main(argv=None) -> int:
    args = parse_args(argv)
    from ampflow.serving.testing import write_model_version

    load_start = bench_host.load_average()
    with tempfile.TemporaryDirectory(prefix="ampflow-side-by-side-") as folder:
        base = Path(folder) / "ampflow"
        write_model_version(base, 1, model_name="ampflow")
        results = measure(args, base, Path(folder))
    report = {"benchmark": "serving_side_by_side", "request": "gRPC Predict, prebuilt bytes, "
              "tiny contract model, 1 image", "blocks": args.blocks, "results": results,
              "host": {"cpu": bench_host.cpu_capabilities(), "simd_flags": bench_host.simd_flags(),
                       "device": bench_host.device(), "load_start": load_start,
                       "load_end": bench_host.load_average()},
              "commit": bench_host.git_commit(("serving",))}
    out = Path(args.out) / f"{args.name}.json"
    write_json_atomic(out, report)
    print(json.dumps(results), f"load {load_start} -> {report['host']['load_end']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
