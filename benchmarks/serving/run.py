"""Serving benchmark: in-process SavedModel inference vs Predict through `ampflow serve`.

One run measures, for one model (the exported one, or the tiny contract model when none is
given), in interleaved rounds (every path once per round, so a noisy neighbour hits them all
alike; the result is the median over rounds):
- in-process: the `serving_default` signature called directly (batch of --rows rows);
- a bare grpcio echo round trip (1 KB, a generic handler in a separate process, the same
  server options and thread pool as `ampflow serve`): the floor any Python gRPC server pays;
- gRPC Predict through the server (a separate process, so client and server do not share a
  GIL) with ampflow's client, and with a prebuilt request sent as bytes (no client-side
  encoding: what the server and the transport cost, comparable with the echo);
- REST :predict on the same server (ampflow's client, and a prebuilt JSON body over
  http.client); gRPC with server-side batching;
- throughput at concurrency 8 and 32, unbatched and batched, next to in-process throughput and
  the bare echo's at the same concurrency through the same client threads (the harness's ceiling).
Reports p50/p99 latency, requests/s, and the goal ratios of issue #22. Warm-up requests are
excluded. Writes JSON + Markdown naming the host's CPU and its flags.

    .venv/bin/python benchmarks/serving/run.py            # writes benchmarks/results/
    .venv/bin/python benchmarks/serving/run.py --model-base-path runs/demo/export/ampflow
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from ampflow.files import write_json_atomic  # noqa: E402

ECHO_METHOD = "/ampflow.bench.Echo/Echo"
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
LATENCY_PATHS = ("in_process", "echo", "grpc", "grpc_raw", "rest", "rest_raw", "grpc_batched")
LABELS = {"in_process": "in-process SavedModel", "echo": "bare grpcio echo (1 KB)",
          "grpc": "gRPC Predict (ampflow client)", "grpc_raw": "gRPC Predict (prebuilt bytes)",
          "rest": "REST :predict (ampflow client, version pinned)",
          "rest_raw": "REST :predict (prebuilt JSON, http.client)",
          "grpc_batched": "gRPC Predict, batched", "grpc_unbatched": "gRPC Predict, unbatched"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model-base-path", default=None,
                   help="TF Serving base path (<base>/<version>/); default: the tiny contract "
                        "model written to a temp dir")
    p.add_argument("--model-name", default="ampflow", help="model name")
    p.add_argument("--out", default="benchmarks/results", help="output dir")
    p.add_argument("--name", default="serving", help="result file stem")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--requests", type=int, default=300,
                   help="timed requests per path per round")
    p.add_argument("--warmup", type=int, default=50, help="untimed requests per path first")
    p.add_argument("--rows", type=int, default=1, help="images per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32],
                   help="client threads of the throughput rows")
    p.add_argument("--echo-bytes", type=int, default=1024, help="echo payload")
    p.add_argument("--max-batch-size", type=int, default=32, help="server batching: max rows")
    p.add_argument("--batch-timeout-ms", type=float, default=2.0, help="server batching timeout")
    p.add_argument("--timeout-s", type=float, default=600.0, help="bound on the whole run")
    p.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- host ---------------------------------------------------------------------------------

def cpu_info() -> dict:
    """CPU model and the flags that matter here (what the numbers ran on)."""
    model, flags = platform.processor(), []
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                      if ln.startswith("model name")), model)
        flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                      if ln.startswith("flags")), [])
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "fma")
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in wanted if f in flags],
            "python": platform.python_version()}


# ---- the echo floor (runs in its own process) ---------------------------------------------

def echo_server() -> int:
    """A generic-handler gRPC echo with ampflow serve's options and thread pool."""
    import grpc

    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import server_options

    config = ServerConfig(models=(ModelConfig("echo", "/nonexistent"),))
    server = grpc.server(ThreadPoolExecutor(max_workers=config.max_workers),
                         options=server_options(config),
                         maximum_concurrent_rpcs=config.max_workers * 8)
    handler = grpc.unary_unary_rpc_method_handler(lambda request, _context: request)
    service, method = ECHO_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        service, {method: handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"echo listening on 127.0.0.1:{port}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(0)
    return 0


class EchoProcess:
    """`run.py --echo-server` in a child process; `address` once it listens."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--echo-server"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        match = re.match(r"echo listening on (\S+)", line)
        if not match:
            self.stop()
            raise RuntimeError(f"echo server did not start: {line!r}")
        self.address = match.group(1)

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


# ---- the model ------------------------------------------------------------------------------

def model_base(model_base_path: str | None, tmp: Path, model_name: str) -> Path:
    """The given model base dir, or the tiny contract model written under `tmp`."""
    if model_base_path:
        return Path(model_base_path)
    from ampflow.serving.testing import write_model_version

    write_model_version(tmp / model_name, 1, model_name=model_name)
    return tmp / model_name


def write_report(out: Path, name: str, report: dict, markdown: str) -> None:
    """`<name>.json` and `<name>.md` under `out`, and the Markdown on stdout."""
    write_json_atomic(out / f"{name}.json", report)
    (out / f"{name}.md").write_text(markdown)
    print(markdown)


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(base: Path, args, batched: bool, log_dir: Path, rest_port: int = 0):
    """`ampflow serve` of `base` in its own process (ampflow.serving.testing.ServeProcess)."""
    from ampflow.serving.testing import ServeProcess

    flags = ["--grace-s", "2"]
    if rest_port:
        flags += ["--rest-api-port", str(rest_port)]
    if batched:
        flags += ["--max-batch-size", str(args.max_batch_size),
                  "--batch-timeout-ms", str(args.batch_timeout_ms)]
    return ServeProcess(args.model_name, base, log_dir / f"server-batched-{batched}.log", *flags,
                        start_timeout_s=180, stop_timeout_s=30)


# ---- one call per path ----------------------------------------------------------------------

def make_calls(version_dir: Path, name: str, batch: np.ndarray, unbatched, batched,
               echo_address: str, rest_address: str, args) -> tuple[dict, list]:
    """For each path a zero-argument callable doing one request; plus what to close after."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    from ampflow.serving.client import PredictionClient
    from ampflow.serving.rest_client import RestClient

    fn = tf.saved_model.load(str(version_dir)).signatures["serving_default"]
    version = int(version_dir.name)
    x = tf.constant(batch)
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
               ("grpc.max_send_message_length", 64 * 1024 * 1024)]  # ampflow_client's
    echo_channel = grpc.insecure_channel(echo_address, options=options)
    echo = echo_channel.unary_unary(ECHO_METHOD)
    payload = os.urandom(args.echo_bytes)
    raw_channel = grpc.insecure_channel(unbatched.address, options=options)
    raw = raw_channel.unary_unary(PREDICT_METHOD)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = args.model_name
    request.inputs[name].CopyFrom(tf.make_tensor_proto(batch))
    request_bytes = request.SerializeToString()
    grpc_client = PredictionClient(unbatched.address, timeout_s=30)
    grpc_client.wait_until_available(args.model_name, timeout=60)
    batched_client = PredictionClient(batched.address, timeout_s=30)
    batched_client.wait_until_available(args.model_name, timeout=60)
    rest_client = RestClient(rest_address, timeout_s=30)
    host, port = rest_address.rsplit(":", 1)
    rest_raw = http.client.HTTPConnection(host, int(port), timeout=30)
    rest_path = f"/v1/models/{args.model_name}/versions/{version}:predict"
    rest_body = json.dumps({"inputs": {name: batch.tolist()}}).encode()

    def rest_raw_call(retry: bool = True):
        try:
            rest_raw.request("POST", rest_path, body=rest_body,
                             headers={"Content-Type": "application/json"})
            response = rest_raw.getresponse()
            answer = response.read()
        except (ConnectionError, http.client.HTTPException):
            rest_raw.close()  # the server closed the idle keep-alive connection (5 s)
            if not retry:
                raise
            return rest_raw_call(retry=False)
        if response.status != 200:
            raise RuntimeError(f"REST {response.status}: {answer[:200]!r}")
    calls = {
        "in_process": lambda: {k: v.numpy() for k, v in fn(**{name: x}).items()},
        "echo": lambda: echo(payload, timeout=30),
        "grpc": lambda: grpc_client.predict(args.model_name, {name: batch}),
        "grpc_raw": lambda: raw(request_bytes, timeout=30),
        # the version pinned: without one, the REST client asks GET status per call for
        # the version that answered (REST answers do not say), a second round trip
        "rest": lambda: rest_client.predict(args.model_name, {name: batch}, version=version),
        "rest_raw": rest_raw_call,
        "grpc_batched": lambda: batched_client.predict(args.model_name, {name: batch}),
    }
    closers = [echo_channel.close, raw_channel.close, grpc_client.close, batched_client.close,
               getattr(rest_client, "close", lambda: None), rest_raw.close]
    return calls, closers


def summarize(latencies_s: list[float], wall_s: float) -> dict:
    ms = np.asarray(latencies_s) * 1000.0
    return {"requests": len(ms), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "requests_per_s": len(ms) / wall_s}


def timed(call, count: int) -> dict:
    latencies = []
    started = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
    return summarize(latencies, time.perf_counter() - started)


def predict_caller(address: str, name: str, batch: np.ndarray, args):
    """One client thread's Predict through ampflow's client (its own channel), and its close."""
    from ampflow.serving.client import PredictionClient

    client = PredictionClient(address, timeout_s=30)
    return (lambda: client.predict(args.model_name, {name: batch})), client.close


def echo_caller(address: str, args):
    """One client thread's bare echo round trip (its own channel), and its close.

    The ceiling the same harness reaches against a server that does no work.
    """
    import grpc

    channel = grpc.insecure_channel(address)
    echo = channel.unary_unary(ECHO_METHOD)
    payload = os.urandom(args.echo_bytes)
    return (lambda: echo(payload, timeout=30)), channel.close


def concurrent(make_caller, concurrency: int, args) -> dict:
    """Throughput of `concurrency` client threads in this process, one channel each."""
    callers = [make_caller() for _ in range(concurrency)]
    per_thread = max(1, args.requests // concurrency) * 2

    def worker(i: int, count: int) -> list[float]:
        call, out = callers[i][0], []
        for _ in range(count):
            t0 = time.perf_counter()
            call()
            out.append(time.perf_counter() - t0)
        return out

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda i: worker(i, 3), range(concurrency)))
            started = time.perf_counter()
            results = list(pool.map(lambda i: worker(i, per_thread), range(concurrency)))
            wall = time.perf_counter() - started
        return summarize([x for r in results for x in r], wall)
    finally:
        for _call, close in callers:
            close()


# ---- the run -------------------------------------------------------------------------------

def run_rounds(calls: dict, servers: dict, name: str, batch: np.ndarray, args) -> list[dict]:
    """Every path once per round, in the same order; each round's numbers kept."""
    for call in calls.values():
        for _ in range(args.warmup):
            call()
    rounds = []
    for index in range(args.rounds):
        latency = {path: timed(calls[path], args.requests) for path in LATENCY_PATHS}
        makers = {"echo": lambda: echo_caller(servers["echo"], args),
                  **{mode: (lambda mode=mode: predict_caller(servers[mode].address, name,
                                                              batch, args))
                     for mode in ("unbatched", "batched")}}
        throughput = [{"mode": mode, "concurrency": c,
                       **concurrent(makers[mode], c, args)}
                      for c in args.concurrency for mode in ("echo", "unbatched", "batched")]
        rounds.append({"latency": latency, "throughput": throughput,
                       "ratios": round_ratios(latency, throughput)})
        print(f"round {index + 1}/{args.rounds}:",
              {k: round(v, 3) for k, v in rounds[-1]["ratios"].items()}, flush=True)
    return rounds


def round_ratios(latency: dict, throughput: list[dict]) -> dict:
    """The goal numbers of one round (issue #22), each from paths measured side by side."""
    p50 = {path: row["p50_ms"] for path, row in latency.items()}
    overhead = p50["grpc"] - p50["in_process"]
    raw_overhead = p50["grpc_raw"] - p50["in_process"]
    ratios = {"grpc_overhead_ms": overhead, "grpc_raw_overhead_ms": raw_overhead,
              "echo_p50_ms": p50["echo"],
              "grpc_overhead_over_echo": overhead / p50["echo"],
              "grpc_raw_overhead_over_echo": raw_overhead / p50["echo"],
              "rest_over_grpc": p50["rest"] / p50["grpc"],
              "rest_raw_over_grpc_raw": p50["rest_raw"] / p50["grpc_raw"]}
    in_process_rps = latency["in_process"]["requests_per_s"]
    echo_rps = {row["concurrency"]: row["requests_per_s"] for row in throughput
                if row["mode"] == "echo"}
    for row in throughput:
        key = f"{row['mode']}_c{row['concurrency']}_over_in_process"
        ratios[key] = row["requests_per_s"] / in_process_rps
        if row["mode"] != "echo":
            key = f"{row['mode']}_c{row['concurrency']}_over_echo"
            ratios[key] = row["requests_per_s"] / echo_rps[row["concurrency"]]
    return ratios


def median_report(rounds: list[dict]) -> dict:
    """Per path and per ratio: the median over rounds."""
    latency = {path: {key: float(np.median([r["latency"][path][key] for r in rounds]))
                      for key in ("p50_ms", "p99_ms", "requests_per_s")}
               for path in LATENCY_PATHS}
    throughput = []
    for i, row in enumerate(rounds[0]["throughput"]):
        throughput.append({"mode": row["mode"], "concurrency": row["concurrency"],
                           **{key: float(np.median([r["throughput"][i][key] for r in rounds]))
                              for key in ("p50_ms", "p99_ms", "requests_per_s")}})
    ratios = {key: float(np.median([r["ratios"][key] for r in rounds]))
              for key in rounds[0]["ratios"]}
    return {"latency": latency, "throughput": throughput, "ratios": ratios}


GOALS = (  # (ratio, comparison, bound, what it says)
    ("grpc_overhead_ms", "<=", 0.5, "gRPC p50 overhead over in-process, c=1 (ms)"),
    ("grpc_overhead_over_echo", "<=", 1.5, "that overhead / bare grpcio echo p50"),
    ("batched_c32_over_in_process", ">=", 0.9, "batched c=32 throughput / in-process"),
    ("rest_over_grpc", "<=", 1.5, "REST p50 / gRPC p50, c=1 (ampflow clients)"),
    ("rest_raw_over_grpc_raw", "<=", 1.5, "REST p50 / gRPC p50, c=1 (prebuilt requests)"),
)


def goal_rows(ratios: dict) -> list[dict]:
    rows = []
    for key, op, bound, text in GOALS:
        if key not in ratios:
            continue
        value = ratios[key]
        met = value <= bound if op == "<=" else value >= bound
        rows.append({"ratio": key, "what": text, "value": value, "goal": f"{op} {bound}",
                     "met": met})
    return rows


def to_markdown(report: dict) -> str:
    cpu = report["host"]
    med = report["median"]
    lines = [
        f"# Serving benchmark ({report['label']})",
        "",
        f"Model: `{report['model']}`; {report['rows']} image(s)/request; {report['rounds']} "
        f"interleaved rounds of {report['requests']} timed requests per path; medians over "
        f"rounds. Host: {cpu['model']}, {cpu['cores']} CPUs, flags "
        f"{', '.join(cpu['flags']) or 'none of avx2/avx512'}; Python {cpu['python']}"
        + (f"; load {cpu['load_start']} at the start, {cpu['load_end']} at the end."
           if "load_start" in cpu else "."),
        "",
        "## Goals (issue #22), each a median of per-round ratios",
        "",
        "| ratio | value | goal | met |",
        "|---|---:|---|---|",
    ]
    for row in report["goals"]:
        lines.append(f"| {row['what']} | {row['value']:.3f} | {row['goal']} | "
                     f"{'yes' if row['met'] else 'no'} |")
    extra = med["ratios"]
    lines += ["",
              f"With a prebuilt request (no client-side encoding): overhead "
              f"{extra['grpc_raw_overhead_ms']:.3f} ms = "
              f"{extra['grpc_raw_overhead_over_echo']:.2f}x the echo."]
    if "batched_c32_over_echo" in extra:
        lines.append(f"Batched c=32 throughput is {extra['batched_c32_over_echo']:.2f}x the "
                     f"bare echo's at c=32 through the same client harness (the ceiling a "
                     f"Python gRPC server reaches here with no work at all).")
    lines += ["",
              "## Latency, concurrency 1", "",
              "| path | p50 ms | p99 ms | requests/s | p50 over in-process ms |",
              "|---|---:|---:|---:|---:|"]
    base = med["latency"]["in_process"]["p50_ms"]
    for path in LATENCY_PATHS:
        row = med["latency"][path]
        over = "-" if path in ("in_process", "echo") else f"{row['p50_ms'] - base:.3f}"
        lines.append(f"| {LABELS[path]} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
                     f"{row['requests_per_s']:.0f} | {over} |")
    lines += ["", "## Throughput (ampflow client, one channel per thread)", "",
              "| path | concurrency | p50 ms | p99 ms | requests/s | vs in-process c=1 |",
              "|---|---:|---:|---:|---:|---:|"]
    in_rps = med["latency"]["in_process"]["requests_per_s"]
    for row in med["throughput"]:
        label = LABELS["echo" if row["mode"] == "echo" else "grpc_" + row["mode"]]
        lines.append(f"| {label} | {row['concurrency']} | "
                     f"{row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
                     f"{row['requests_per_s']:.0f} | {row['requests_per_s'] / in_rps:.2f}x |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.echo_server:
        return echo_server()
    timer = threading.Timer(args.timeout_s, lambda: os._exit(124))
    timer.daemon = True
    timer.start()
    load_start = [round(x, 2) for x in os.getloadavg()]  # a shared host: the load beside
    with tempfile.TemporaryDirectory(prefix="ampflow-bench-") as tmp:
        base = model_base(args.model_base_path, Path(tmp), args.model_name)
        version_dir = latest_version_dir(base)
        name, batch = input_batch(version_dir, args.rows)
        rest_port = free_port()
        logs = Path(tmp)
        echo = EchoProcess()
        try:
            with start_server(base, args, False, logs, rest_port) as unbatched, \
                    start_server(base, args, True, logs) as batched:
                calls, closers = make_calls(version_dir, name, batch, unbatched, batched,
                                            echo.address, f"127.0.0.1:{rest_port}", args)
                try:
                    rounds = run_rounds(calls, {"unbatched": unbatched, "batched": batched,
                                                "echo": echo.address}, name, batch, args)
                finally:
                    for close in closers:
                        close()
        finally:
            echo.stop()
    median = median_report(rounds)
    report = {"label": args.name,
              "model": str(version_dir) if args.model_base_path else
              "tiny contract model (ampflow.serving.testing, 8x8x1 -> 10 classes)",
              "rows": args.rows, "rounds": args.rounds, "requests": args.requests,
              "host": {**cpu_info(), "load_start": load_start,
                       "load_end": [round(x, 2) for x in os.getloadavg()]},
              "median": median, "goals": goal_rows(median["ratios"]),
              "per_round": rounds}
    write_report(Path(args.out), args.name, report, to_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
