"""KServe V2 through the protocol-neutral core vs a git revision's server, side by side in one run.

Issue 41 made the V2 adapters hand the core declared inputs built from the request's own bytes,
where the core used to take TF Serving's protos (a V2 tensor was copied into a TensorProto, into
a PredictRequest, and out again; the answer the same way back). This measures what that changed:
two `ampflow serve` processes, this checkout's ("after") and one built from `--before` (a git
revision, by default the commit before the change), serve the same tiny contract model
(ampflow.serving.testing, 8x8x1 images) on loopback, and every round calls each in turn
(A/B/A/B...), so machine noise hits both alike:
- V2 gRPC ModelInfer (raw contents) p50 latency at concurrency 1, for 1 image and for 1024
  images (256 KiB: where the copies show);
- V2 gRPC throughput of 8 concurrent clients sending 1 image each, with server-side batching
  (--max-batch-size 32), in alternating windows.
The client is a bare gRPC channel with the request serialized once, so the client's own work is
the same for both. Writes JSON + Markdown naming the CPU. The machine is shared: keep it short.

    .venv/bin/python benchmarks/serving/v2_core.py --before fc9a1f9 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = "ampflow"
# A revision's packages are laid out by its own pyproject's package-dir (the root package was
# core/ before it moved to src/ampflow/, and ampflow.cli/ came later).


def _cpu() -> dict:
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count()}


def checkout(revision: str, where: Path) -> Path:
    """`revision`'s packages laid out as an importable `ampflow`, by its pyproject's mapping."""
    import tomllib

    pyproject = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:pyproject.toml"],
                               check=True, capture_output=True, text=True).stdout
    mapping = tomllib.loads(pyproject)["tool"]["setuptools"]["package-dir"]
    archive = where / "src.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), revision,
                    *mapping.values()], check=True)
    src = where / "src"
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    overlay = where / "overlay"
    for name, folder in sorted(mapping.items()):  # `ampflow` first, its subpackages inside it
        target = overlay.joinpath(*name.split("."))
        target.parent.mkdir(parents=True, exist_ok=True)
        (src / folder).rename(target)
    return overlay


class Server:
    """`ampflow serve` in a child process (PYTHONPATH first: another revision's code)."""

    def __init__(self, base: Path, pythonpath: Path | None, *flags: str) -> None:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ampflow.cli", "serve", "--server", "local", "--port", "0",
             "--model-name", MODEL, "--model-base-path", str(base),
             "--max-request-batch-size", "1024", *flags],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in self.proc.stdout:
            if "listening on" in line:
                self.address = line.rsplit(" ", 1)[1].strip()
                break
        else:
            raise RuntimeError(f"server did not start (exit {self.proc.wait()})")
        self.channel = grpc.insecure_channel(self.address)
        self.infer = self.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda wire: wire, response_deserializer=lambda raw: raw)

    def stop(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def infer_wire(images: np.ndarray) -> bytes:
    """A serialized ModelInferRequest of `images` (raw contents), asking for class_ids."""
    from ampflow.serving.protocols import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL,
                                   raw_input_contents=[images.astype("<f4").tobytes()])
    request.inputs.add(name="images", datatype="FP32", shape=list(images.shape))
    request.outputs.add(name="class_ids")
    return request.SerializeToString()


def latency(servers: dict[str, Server], wire: bytes, rounds: int) -> dict[str, float]:
    """p50 ms of one call, each server in turn, `rounds` times (after a warm-up)."""
    samples: dict[str, list[float]] = {name: [] for name in servers}
    for _ in range(10):
        for server in servers.values():
            server.infer(wire, timeout=60)
    for _ in range(rounds):
        for name, server in servers.items():
            start = time.perf_counter()
            server.infer(wire, timeout=60)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) * 1e3 for name, s in samples.items()}


def throughput(servers: dict[str, Server], wire: bytes, clients: int, window_s: float,
               windows: int) -> dict[str, float]:
    """Requests/s of `clients` concurrent callers, in alternating windows per server."""
    done: dict[str, list[float]] = {name: [] for name in servers}
    with ThreadPoolExecutor(clients) as pool:
        for _ in range(windows):
            for name, server in servers.items():
                stop, count, lock = time.perf_counter() + window_s, [0], threading.Lock()

                def caller(server=server, stop=stop, count=count, lock=lock):
                    while time.perf_counter() < stop:
                        server.infer(wire, timeout=60)
                        with lock:
                            count[0] += 1

                started = time.perf_counter()
                for future in [pool.submit(caller) for _ in range(clients)]:
                    future.result()
                done[name].append(count[0] / (time.perf_counter() - started))
    return {name: statistics.median(rates) for name, rates in done.items()}


def run(before: str, rounds: int, window_s: float) -> dict:
    """Serve both revisions, measure, return the result."""
    from ampflow.serving.testing import sample_images, write_model_version

    with tempfile.TemporaryDirectory(prefix="ampflow-v2-core-") as tmp:
        tmp = Path(tmp)
        write_model_version(tmp / "model" / MODEL, 1, model_name=MODEL)
        old = checkout(before, tmp)
        base = tmp / "model" / MODEL
        one, many = infer_wire(sample_images(1)), infer_wire(sample_images(1024, seed=1))
        result: dict = {"before": before, "cpu": _cpu(), "rounds": rounds}
        servers = {"before": Server(base, old), "after": Server(base, None)}
        try:
            result["p50_ms_1_image"] = latency(servers, one, rounds)
            result["p50_ms_1024_images"] = latency(servers, many, max(rounds // 4, 20))
        finally:
            for server in servers.values():
                server.stop()
        batching = ("--max-batch-size", "32", "--batch-timeout-ms", "2")
        servers = {"before": Server(base, old, *batching), "after": Server(base, None, *batching)}
        try:
            result["batched_req_per_s_c8"] = throughput(servers, one, 8, window_s, 3)
        finally:
            for server in servers.values():
                server.stop()
    return result


def markdown(result: dict) -> str:
    """The result as a table: before, after, after/before."""
    rows = [("V2 gRPC p50, 1 image, c=1 (ms)", "p50_ms_1_image"),
            ("V2 gRPC p50, 1024 images, c=1 (ms)", "p50_ms_1024_images"),
            ("V2 gRPC batched throughput, c=8 (req/s)", "batched_req_per_s_c8")]
    lines = [f"# V2 through the protocol-neutral core (before: {result['before']})", "",
             f"CPU: {result['cpu']['model']} ({result['cpu']['cores']} cores, shared with "
             "other work while measured); both servers side by side, calls interleaved.", "",
             "| measure | before | after | after / before |", "|---|---|---|---|"]
    for label, key in rows:
        b, a = result[key]["before"], result[key]["after"]
        lines.append(f"| {label} | {b:.3f} | {a:.3f} | {a / b:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Measure and write `serving_v2_core.json` / `.md`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="fc9a1f9",
                        help="git revision to compare with (default: before the V2 core change)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    result = run(args.before, args.rounds, args.window_s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving_v2_core.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "serving_v2_core.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
