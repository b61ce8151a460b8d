"""`ampflow serve --workers 2` vs one worker vs in-process, beside the bare-grpcio floor.

Issue 42 point 3's goal, measured side by side in one run (interleaved rounds; medians of the
per-round ratios): batched gRPC Predict throughput at 32 concurrent clients with 2 workers
>= 1.7x one worker and >= 0.9x the model called in process (its requests/s at c=1, as
`run.py`'s ratio), and p50 latency at c=1 unchanged. Every server is its own process, batching
on (--max-batch-size 32, 2 ms) for both worker counts:
- in-process: `serving_default` called directly in this process;
- the bare grpcio echo (`run.py --echo-server`: ampflow serve's options, no work): the floor;
- `ampflow serve --workers 1` (today's single process) and `--workers 2`.
The c=32 load comes from --client-processes processes of 32/N threads each, every thread on a
TCP connection of its own (a local subchannel pool: gRPC otherwise shares one connection per
process and address, which SO_REUSEPORT cannot spread), sending one prebuilt Predict (bytes
serialized once) so the client's work is as small and as equal as it can be. Clients and
servers share the same cores, as on any one-machine measurement: said in the report.
The 1-minute load average is recorded before and after every round; the machine is shared, so
the report says "shared", and "not clean" when anything else ran (load above --clean-load).

    .venv/bin/python benchmarks/serving/workers.py        # -> benchmarks/results/serving_workers.*
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import run as serving_run  # noqa: E402  (the serving benchmark: echo, model, host, report)

SERVERS = ("echo", "workers_1", "workers_2")
LABELS = {"in_process": "in-process SavedModel", "echo": "bare grpcio echo (1 KB)",
          "workers_1": "ampflow serve --workers 1, batched",
          "workers_2": "ampflow serve --workers 2, batched"}
GOALS = (("workers_2_over_workers_1_c32", ">=", 1.7, "2 workers / 1 worker, batched c=32"),
         ("workers_2_c32_over_in_process", ">=", 0.9, "2 workers c=32 / in-process c=1 req/s"),
         ("workers_2_over_workers_1_p50", "<=", 1.1, "p50 at c=1, 2 workers / 1 worker"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="benchmarks/results", help="output dir")
    p.add_argument("--name", default="serving_workers", help="result file stem")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--requests", type=int, default=300, help="c=1 timed requests per path")
    p.add_argument("--seconds", type=float, default=4.0, help="each c=32 window")
    p.add_argument("--concurrency", type=int, default=32, help="client threads in all")
    p.add_argument("--client-processes", type=int, default=4, help="processes they run in")
    p.add_argument("--clean-load", type=float, default=1.0,
                   help="1-min load average above which the measurement is 'not clean'")
    p.add_argument("--load", nargs=4, metavar=("ADDRESS", "METHOD", "THREADS", "UNTIL"),
                   help=argparse.SUPPRESS)  # a load-generator child (payload on stdin)
    return p.parse_args(argv)


# ---- the load generator (a child process) ------------------------------------------------------

def load_child(address: str, method: str, threads: int, start_at: float, seconds: float,
               payload: bytes) -> int:
    """`threads` threads, each on its own connection, calling `method` from `start_at` on."""
    import grpc

    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(threads)]
    calls = [c.unary_unary(method) for c in channels]
    for call in calls:  # connected and warm before the window
        for _ in range(3):
            call(payload, timeout=30)

    def run(call) -> list[float]:
        while time.time() < start_at:
            time.sleep(0.001)
        out, end = [], start_at + seconds
        while time.time() < end:
            t0 = time.perf_counter()
            call(payload, timeout=30)
            out.append(time.perf_counter() - t0)
        return out

    with ThreadPoolExecutor(threads) as pool:
        latencies = [x for r in pool.map(run, calls) for x in r]
    print(json.dumps({"requests": len(latencies), "latencies": latencies}), flush=True)
    for channel in channels:
        channel.close()
    return 0


def concurrent_load(address: str, method: str, payload: bytes, args) -> dict:
    """c=`args.concurrency` throughput from `args.client_processes` processes at once."""
    per = [args.concurrency // args.client_processes] * args.client_processes
    per[0] += args.concurrency - sum(per)
    start_at = time.time() + 8.0  # the children import grpc and warm their connections first
    procs = [subprocess.Popen([sys.executable, __file__, "--load", address, method, str(n),
                               f"{start_at}:{args.seconds}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for n in per]
    results = []
    for proc in procs:
        out, _ = proc.communicate(payload, timeout=args.seconds + 120)
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    latencies = [x for r in results for x in r["latencies"]]
    ms = np.asarray(latencies) * 1000
    return {"requests": len(latencies), "requests_per_s": len(latencies) / args.seconds,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


# ---- the run ---------------------------------------------------------------------------------

def start_servers(base: Path, log_dir: Path) -> dict:
    from ampflow.serving.testing import ServeProcess

    servers = {"echo": serving_run.EchoProcess()}
    for workers in (1, 2):
        servers[f"workers_{workers}"] = ServeProcess(
            "ampflow", base, log_dir / f"workers-{workers}.log", "--workers", str(workers),
            "--grace-s", "2", "--max-batch-size", "32", "--batch-timeout-ms", "2",
            start_timeout_s=300, stop_timeout_s=30)
    return servers


def one_round(calls: dict, servers: dict, payloads: dict, args) -> dict:
    load_before = os.getloadavg()[0]
    latency = {path: serving_run.timed(call, args.requests) for path, call in calls.items()}
    throughput = {}
    for name in SERVERS:
        method = serving_run.ECHO_METHOD if name == "echo" else serving_run.PREDICT_METHOD
        throughput[name] = concurrent_load(servers[name].address, method, payloads[name], args)
    in_rps = latency["in_process"]["requests_per_s"]
    ratios = {"workers_2_over_workers_1_c32": throughput["workers_2"]["requests_per_s"]
              / throughput["workers_1"]["requests_per_s"],
              "workers_2_c32_over_in_process": throughput["workers_2"]["requests_per_s"] / in_rps,
              "workers_1_c32_over_in_process": throughput["workers_1"]["requests_per_s"] / in_rps,
              "workers_2_c32_over_echo": throughput["workers_2"]["requests_per_s"]
              / throughput["echo"]["requests_per_s"],
              "workers_2_over_workers_1_p50": latency["workers_2"]["p50_ms"]
              / latency["workers_1"]["p50_ms"]}
    return {"latency": latency, "throughput": throughput, "ratios": ratios,
            "load_1min": [load_before, os.getloadavg()[0]]}


def make_calls(version_dir: Path, servers: dict) -> tuple[dict, dict, list]:
    """c=1 callables per path, the c=32 payload per server, and what to close."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    name, batch = serving_run.input_batch(version_dir, 1)
    fn = tf.saved_model.load(str(version_dir)).signatures["serving_default"]
    x = tf.constant(batch)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ampflow"
    request.inputs[name].CopyFrom(tf.make_tensor_proto(batch))
    predict_bytes, echo_bytes = request.SerializeToString(), os.urandom(1024)
    channels = []
    calls = {"in_process": lambda: {k: v.numpy() for k, v in fn(**{name: x}).items()}}
    for server in SERVERS:
        channel = grpc.insecure_channel(servers[server].address,
                                        options=[("grpc.use_local_subchannel_pool", 1)])
        channels.append(channel)
        method = serving_run.ECHO_METHOD if server == "echo" else serving_run.PREDICT_METHOD
        payload = echo_bytes if server == "echo" else predict_bytes
        stub = channel.unary_unary(method)
        calls[server] = lambda stub=stub, payload=payload: stub(payload, timeout=30)
    payloads = {s: echo_bytes if s == "echo" else predict_bytes for s in SERVERS}
    return calls, payloads, channels


def median(rounds: list[dict]) -> dict:
    med = lambda values: float(np.median(values))  # noqa: E731
    return {
        "latency": {p: {k: med([r["latency"][p][k] for r in rounds])
                        for k in ("p50_ms", "p99_ms", "requests_per_s")}
                    for p in rounds[0]["latency"]},
        "throughput": {s: {k: med([r["throughput"][s][k] for r in rounds])
                           for k in ("p50_ms", "p99_ms", "requests_per_s")} for s in SERVERS},
        "ratios": {k: med([r["ratios"][k] for r in rounds]) for k in rounds[0]["ratios"]},
    }


def to_markdown(report: dict) -> str:
    cpu, med = report["host"], report["median"]
    loads = [x for r in report["per_round"] for x in r["load_1min"]]
    lines = [f"# ampflow serve --workers ({report['label']})", "",
             f"Host: {cpu['model']}, {cpu['cores']} CPUs, flags {', '.join(cpu['flags'])}; "
             f"Python {cpu['python']}. Machine: **shared** (other developers' jobs on the same "
             f"cores); 1-min load average {min(loads):.1f}-{max(loads):.1f} during the run: "
             f"**{'clean' if report['clean'] else 'not clean'}**. Tiny contract model, 1 image "
             f"per request; {report['rounds']} interleaved rounds, medians of per-round ratios. "
             f"c=32: {report['concurrency']} client threads in {report['client_processes']} "
             f"processes, one TCP connection each, prebuilt requests, {report['seconds']:g} s "
             f"windows; clients and servers share the {cpu['cores']} cores.", "",
             "| goal | value | target | met |", "|---|---:|---|---|"]
    for key, op, bound, text in GOALS:
        value = med["ratios"][key]
        met = value >= bound if op == ">=" else value <= bound
        lines.append(f"| {text} | {value:.2f} | {op} {bound} | {'yes' if met else 'no'} |")
    ratios = med["ratios"]
    lines += ["", f"1 worker c=32 / in-process: {ratios['workers_1_c32_over_in_process']:.2f}; "
              f"2 workers c=32 / the echo's c=32: {ratios['workers_2_c32_over_echo']:.2f}.",
              "", "| path | p50 c=1 ms | p99 c=1 ms | req/s c=1 | req/s c=32 | p50 c=32 ms |",
              "|---|---:|---:|---:|---:|---:|"]
    for path, row in med["latency"].items():
        t = med["throughput"].get(path)
        lines.append(f"| {LABELS[path]} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
                     f"{row['requests_per_s']:.0f} | {t['requests_per_s']:.0f} | "
                     f"{t['p50_ms']:.2f} |" if t else
                     f"| {LABELS[path]} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
                     f"{row['requests_per_s']:.0f} | - | - |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.load:
        address, method, threads, window = args.load
        start_at, seconds = (float(v) for v in window.split(":"))
        return load_child(address, method, int(threads), start_at, seconds,
                          sys.stdin.buffer.read())
    with tempfile.TemporaryDirectory(prefix="ampflow-bench-workers-") as tmp:
        base = serving_run.model_base(None, Path(tmp), "ampflow")
        version_dir = serving_run.latest_version_dir(base)
        servers = start_servers(base, Path(tmp))
        try:
            calls, payloads, channels = make_calls(version_dir, servers)
            for call in calls.values():
                for _ in range(50):
                    call()
            rounds = []
            for index in range(args.rounds):
                rounds.append(one_round(calls, servers, payloads, args))
                print(f"round {index + 1}/{args.rounds}:",
                      {k: round(v, 3) for k, v in rounds[-1]["ratios"].items()},
                      f"load {rounds[-1]['load_1min']}", flush=True)
            for channel in channels:
                channel.close()
        finally:
            for server in servers.values():
                server.stop()
    loads = [x for r in rounds for x in r["load_1min"]]
    report = {"label": args.name, "host": serving_run.cpu_info(), "machine": "shared",
              "clean": max(loads) <= args.clean_load, "rounds": args.rounds,
              "seconds": args.seconds, "concurrency": args.concurrency,
              "client_processes": args.client_processes, "median": median(rounds),
              "per_round": rounds}
    serving_run.write_report(Path(args.out), args.name, report, to_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
