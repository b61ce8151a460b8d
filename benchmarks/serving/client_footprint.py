"""ampflow-client vs tensorflow-serving-api, side by side in one run: install, import, latency.

For each client, a fresh venv: `pip install clients/python` (grpcio, protobuf, numpy) and
`pip install tensorflow-serving-api==2.21.0` (which pulls the whole tensorflow wheel). Measured:
install time (pip with the machine's warm wheel cache, so mostly unpacking; downloads would add
to the TensorFlow side), installed size (site-packages), import time of what a Predict call
needs (median of fresh interpreters), and p50/p99 latency of Predict against one `ampflow serve`
(a separate process) — rounds interleaved A/B/A/B so machine noise hits both alike. Writes
JSON + Markdown naming the CPU and its flags.

    .venv/bin/python benchmarks/serving/client_footprint.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"

IMPORTS = {
    "ampflow-client": "import ampflow_client",
    "tensorflow-serving-api": ("import tensorflow as tf; "
                               "from tensorflow_serving.apis import predict_pb2, "
                               "prediction_service_pb2_grpc"),
}

# Runs inside each venv: `requests` Predict calls after `warmup`, one latency (s) per line.
LATENCY = {
    "ampflow-client": r'''
import sys, time, numpy as np
from ampflow_client import Client
address, n, warmup, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
images = np.random.default_rng(0).uniform(0, 255, (rows, 8, 8, 1)).astype(np.float32)
with Client(address, timeout_s=10, retries=0) as c:
    out = []
    for i in range(n + warmup):
        t = time.perf_counter()
        r = c.predict("ampflow", {"images": images})
        probs = r.outputs["probabilities"]
        if i >= warmup:
            out.append(time.perf_counter() - t)
print("\n".join(map(repr, out)))
''',
    "tensorflow-serving-api": r'''
import sys, time, numpy as np, grpc
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
address, n, warmup, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
images = np.random.default_rng(0).uniform(0, 255, (rows, 8, 8, 1)).astype(np.float32)
channel = grpc.insecure_channel(address)
stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
out = []
for i in range(n + warmup):
    t = time.perf_counter()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ampflow"
    request.model_spec.signature_name = "serving_default"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
    response = stub.Predict(request, timeout=10)
    probs = tf.make_ndarray(response.outputs["probabilities"])
    if i >= warmup:
        out.append(time.perf_counter() - t)
channel.close()
print("\n".join(map(repr, out)))
''',
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="benchmarks/results", help="output dir")
    p.add_argument("--requests", type=int, default=300, help="timed requests per round")
    p.add_argument("--warmup", type=int, default=30, help="untimed requests per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per client")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 32], help="images per request")
    p.add_argument("--imports", type=int, default=5, help="fresh interpreters per import time")
    p.add_argument("--tfs-version", default="2.21.0", help="tensorflow-serving-api version")
    return p.parse_args(argv)


def cpu_info() -> dict:
    """CPU model and the flags that matter here (what the numbers ran on)."""
    model, flags = platform.processor(), []
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name") and not model.strip():
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                      if ln.startswith("model name")), model)
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "fma")
    return {"model": model, "cores": os.cpu_count(),
            "flags": [f for f in wanted if f in flags]}


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def make_venv(where: Path, spec: list[str]) -> dict:
    """A fresh venv with `spec` installed; install seconds and site-packages bytes."""
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--upgrade", "pip"], check=True)
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True, text=True)
                .stdout.strip())
    before = _dir_size(site)
    t = time.perf_counter()
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *spec], check=True)
    seconds = time.perf_counter() - t
    listed = json.loads(subprocess.run([python, "-m", "pip", "list", "--format=json"],
                                       check=True, capture_output=True, text=True).stdout)
    return {"python": str(python), "install_s": round(seconds, 1),
            "installed_mb": round((_dir_size(site) - before) / 2 ** 20, 1),
            "packages": len(listed),
            "has_tensorflow": any(p["name"].lower() == "tensorflow" for p in listed)}


def import_time(python: str, statement: str, n: int) -> float:
    """Median seconds of `statement` in a fresh interpreter (n of them)."""
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    times = [float(subprocess.run([python, "-c", code], check=True, capture_output=True,
                                  text=True, env=env).stdout.split()[-1]) for _ in range(n)]
    return statistics.median(times)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    """`ampflow serve` of the tiny contract model, in its own process."""
    from ampflow.serving.testing import write_model_version

    base = workdir / "model" / "ampflow"
    write_model_version(base, 1, model_name="ampflow")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "ampflow.serving.cli", "serve",
                               "--model-base-path", str(base), "--port", str(port),
                               "--server", "local", "--file-system-poll-wait-seconds", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    from ampflow_client import Client

    with Client(address, timeout_s=5) as client:
        client.wait_until_available("ampflow", 120)
    return server, address


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"cpu": cpu_info(), "python": platform.python_version(), "clients": {}}
    with tempfile.TemporaryDirectory(prefix="client-footprint-") as tmp:
        tmp = Path(tmp)
        source = tmp / "client-src"
        shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                      "*.egg-info"))
        specs = {"ampflow-client": [str(source)],
                 "tensorflow-serving-api": [f"tensorflow-serving-api=={args.tfs_version}"]}
        for name, spec in specs.items():
            print(f"installing {name} in a fresh venv ...", flush=True)
            result["clients"][name] = make_venv(tmp / name, spec)
        for name, info in result["clients"].items():
            info["import_s"] = round(import_time(info["python"], IMPORTS[name], args.imports), 3)
            print(f"{name}: {info}", flush=True)
        server, address = start_server(tmp)
        try:
            latencies = {(n, r): [] for n in specs for r in args.rows}
            for _ in range(args.rounds):
                for rows in args.rows:
                    for name in specs:  # interleaved: A, B, A, B ...
                        done = subprocess.run(
                            [result["clients"][name]["python"], "-c", LATENCY[name], address,
                             str(args.requests), str(args.warmup), str(rows)],
                            check=True, capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
                        latencies[(name, rows)] += [float(x) for x in done.stdout.split()]
        finally:
            server.terminate()
            server.wait(30)
        result["latency"] = [
            {"client": name, "rows": rows, "requests": len(v),
             "p50_ms": round(percentile(v, 50) * 1e3, 3),
             "p99_ms": round(percentile(v, 99) * 1e3, 3)}
            for (name, rows), v in latencies.items()]
    for info in result["clients"].values():
        info.pop("python")
    (out_dir / "client_footprint.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "client_footprint.md").write_text(markdown(result, args))
    print(markdown(result, args))
    return 0


def markdown(result: dict, args) -> str:
    cpu = result["cpu"]
    a, b = result["clients"]["ampflow-client"], result["clients"]["tensorflow-serving-api"]
    lines = [
        "# ampflow-client vs tensorflow-serving-api (one run, side by side)", "",
        f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}; "
        f"Python {result['python']}. Install times with a warm pip cache (wheels cached, the "
        "index still queried): downloads would add to both, most to the 2 GB side.",
        "", "| | ampflow-client | tensorflow-serving-api |", "|---|---:|---:|",
        f"| installed size (site-packages) | {a['installed_mb']} MB | {b['installed_mb']} MB |",
        f"| install time (fresh venv) | {a['install_s']} s | {b['install_s']} s |",
        f"| packages in the venv | {a['packages']} | {b['packages']} |",
        f"| tensorflow installed | {'yes' if a['has_tensorflow'] else 'no'} | "
        f"{'yes' if b['has_tensorflow'] else 'no'} |",
        f"| import time (median of {args.imports}) | {a['import_s']} s | {b['import_s']} s |",
    ]
    by = {(r["client"], r["rows"]): r for r in result["latency"]}
    for rows in args.rows:
        ra, rb = by[("ampflow-client", rows)], by[("tensorflow-serving-api", rows)]
        lines.append(f"| Predict p50 / p99, {rows} image(s) of 8x8x1, `ampflow serve` | "
                     f"{ra['p50_ms']} / {ra['p99_ms']} ms | {rb['p50_ms']} / {rb['p99_ms']} ms |")
    lines += ["", f"Latency: {args.rounds} interleaved rounds of {args.requests} sequential "
              f"Predict calls per client (after {args.warmup} warm-up calls each), one channel, "
              "against one `ampflow serve` process on loopback; the request is built and the "
              "answer decoded to numpy inside the timed call.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
