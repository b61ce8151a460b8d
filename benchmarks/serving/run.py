"""Serving benchmark: in-process SavedModel inference vs gRPC Predict through `ampflow serve`.

One run measures, for one model (the exported one, or the tiny contract model when none is
given):
- in-process: the `serving_default` signature called directly (batch of --rows rows);
- gRPC Predict through the server (a separate process, so client and server do not share a
  GIL) at concurrency 1, 8 and 32, unbatched and with server-side batching;
and reports p50/p99 latency, requests/s and the server overhead over in-process (p50 gRPC at
concurrency 1 minus p50 in-process). Warm-up requests are excluded. Writes JSON + Markdown.

    .venv/bin/python benchmarks/serving/run.py            # writes benchmarks/results/
    .venv/bin/python benchmarks/serving/run.py --model-base-path runs/demo/export/ampflow
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from ampflow.files import write_json_atomic  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model-base-path", default=None,
                   help="TF Serving base path (<base>/<version>/); default: the tiny contract "
                        "model written to a temp dir")
    p.add_argument("--model-name", default="ampflow", help="model name")
    p.add_argument("--out", default="benchmarks/results", help="output dir")
    p.add_argument("--requests", type=int, default=400, help="timed requests per measurement")
    p.add_argument("--warmup", type=int, default=30, help="untimed requests first")
    p.add_argument("--rows", type=int, default=1, help="images per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32],
                   help="client threads")
    p.add_argument("--max-batch-size", type=int, default=32, help="server batching: max rows")
    p.add_argument("--batch-timeout-ms", type=float, default=2.0, help="server batching timeout")
    p.add_argument("--timeout-s", type=float, default=600.0, help="bound on the whole run")
    return p.parse_args(argv)


def latest_version_dir(base: Path) -> Path:
    versions = sorted(int(p.name) for p in base.iterdir() if p.name.isdigit())
    if not versions:
        raise SystemExit(f"no <version>/ dir under {base}")
    return base / str(versions[-1])


def input_batch(version_dir: Path, rows: int) -> tuple[str, np.ndarray]:
    """The single input of serving_default, read from the signature (never hard-coded)."""
    from ampflow.serving.model_format import serving_signature_defs

    sig = serving_signature_defs(version_dir)["serving_default"]
    ((name, info),) = sig.inputs.items()
    dims = [d.size for d in info.tensor_shape.dim][1:]
    rng = np.random.default_rng(0)
    return name, rng.integers(0, 256, (rows, *dims)).astype(np.float32)


def summarize(latencies_s: list[float], wall_s: float) -> dict:
    ms = np.asarray(latencies_s) * 1000.0
    return {"requests": len(ms), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()),
            "requests_per_s": len(ms) / wall_s}


def bench_in_process(version_dir: Path, name: str, batch: np.ndarray, args) -> dict:
    import tensorflow as tf

    fn = tf.saved_model.load(str(version_dir)).signatures["serving_default"]
    x = tf.constant(batch)
    for _ in range(args.warmup):
        fn(**{name: x})
    latencies = []
    started = time.perf_counter()
    for _ in range(args.requests):
        t0 = time.perf_counter()
        {k: v.numpy() for k, v in fn(**{name: x}).items()}
        latencies.append(time.perf_counter() - t0)
    return summarize(latencies, time.perf_counter() - started)


def start_server(base: Path, args, batched: bool, log_dir: Path):
    """`ampflow serve` of `base` in its own process (ampflow.serving.testing.ServeProcess)."""
    from ampflow.serving.testing import ServeProcess

    flags = ["--grace-s", "2"]
    if batched:
        flags += ["--max-batch-size", str(args.max_batch_size),
                  "--batch-timeout-ms", str(args.batch_timeout_ms)]
    return ServeProcess(args.model_name, base, log_dir / f"server-batched-{batched}.log", *flags,
                        start_timeout_s=120, stop_timeout_s=30)


def bench_grpc(address: str, name: str, batch: np.ndarray, concurrency: int, args) -> dict:
    from ampflow.serving.client import PredictionClient

    clients = [PredictionClient(address, timeout_s=30) for _ in range(concurrency)]
    try:
        clients[0].wait_until_available(args.model_name, timeout=60)
        per_thread = max(1, args.requests // concurrency)

        def worker(i: int, count: int) -> list[float]:
            out = []
            for _ in range(count):
                t0 = time.perf_counter()
                clients[i].predict(args.model_name, {name: batch})
                out.append(time.perf_counter() - t0)
            return out

        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda i: worker(i, max(1, args.warmup // concurrency)),
                          range(concurrency)))
            started = time.perf_counter()
            results = list(pool.map(lambda i: worker(i, per_thread), range(concurrency)))
            wall = time.perf_counter() - started
        return summarize([x for r in results for x in r], wall)
    finally:
        for client in clients:
            client.close()


def to_markdown(report: dict) -> str:
    lines = [
        "# Serving benchmark",
        "",
        f"Model: `{report['model_dir']}`; {report['rows']} image(s)/request; "
        f"{report['requests']} timed requests per row; machine: {report['machine']}.",
        "",
        "| path | concurrency | p50 ms | p99 ms | requests/s | p50 overhead vs in-process ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = report["in_process"]
    lines.append(f"| in-process SavedModel | 1 | {base['p50_ms']:.3f} | {base['p99_ms']:.3f} | "
                 f"{base['requests_per_s']:.0f} | - |")
    for row in report["grpc"]:
        lines.append(
            f"| gRPC {row['mode']} | {row['concurrency']} | {row['p50_ms']:.3f} | "
            f"{row['p99_ms']:.3f} | {row['requests_per_s']:.0f} | "
            f"{row['p50_ms'] - base['p50_ms']:.3f} |")
    lines += ["", f"Server overhead (gRPC p50 at concurrency 1, unbatched, minus in-process "
                  f"p50): **{report['server_overhead_ms']:.3f} ms**.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    timer = threading.Timer(args.timeout_s, lambda: os._exit(124))
    timer.daemon = True
    timer.start()
    tmp = None
    if args.model_base_path:
        base = Path(args.model_base_path)
    else:
        from ampflow.serving.testing import write_model_version

        tmp = tempfile.TemporaryDirectory(prefix="ampflow-bench-")
        base = Path(tmp.name) / args.model_name
        write_model_version(base, 1, model_name=args.model_name)
    version_dir = latest_version_dir(base)
    name, batch = input_batch(version_dir, args.rows)
    model_label = (str(version_dir) if args.model_base_path else
                   "tiny contract model (ampflow.serving.testing, 8x8x1 -> 10 classes)")
    report = {"model_dir": model_label, "rows": args.rows, "requests": args.requests,
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                         f"Python {platform.python_version()}",
              "in_process": bench_in_process(version_dir, name, batch, args), "grpc": []}
    print("in-process", report["in_process"], flush=True)
    with tempfile.TemporaryDirectory(prefix="ampflow-bench-logs-") as logs:
        for mode in ("unbatched", "batched"):
            with start_server(base, args, mode == "batched", Path(logs)) as server:
                for concurrency in args.concurrency:
                    row = {"mode": mode, "concurrency": concurrency,
                           **bench_grpc(server.address, name, batch, concurrency, args)}
                    report["grpc"].append(row)
                    print(row, flush=True)
    first = next(r for r in report["grpc"] if r["mode"] == "unbatched")
    report["server_overhead_ms"] = first["p50_ms"] - report["in_process"]["p50_ms"]
    out = Path(args.out)
    write_json_atomic(out / "serving.json", report)
    (out / "serving.md").write_text(to_markdown(report))
    print(to_markdown(report))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
