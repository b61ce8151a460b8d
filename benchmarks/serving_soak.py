"""Reliability of `ampflow serve`: a soak with hot reloads, and a fuzz of hostile requests.

soak: N clients x T seconds (default 32 x 120) of gRPC Predict against `ampflow serve` (its own
process), while new versions are pushed mid-run: version 2 (atomic rename), a corrupt
version 3, a version 4 copied in slowly file by file, and version 5 (atomic rename). Reports
requests, failures by code, p50/p99 latency, which version answered over time, whether the
corrupt or the half-copied version ever answered, and the server's RSS drift.

fuzz: byte-mutated Predict/Classify/metadata/status requests (default 10,000) plus hand-made bad
requests (the 52-byte huge-shape request and others), each answered with a status code; checks
the server is alive afterwards and reports its RSS before and after, and the table
request -> code -> message.

    .venv/bin/python benchmarks/serving_soak.py                      # soak 32 x 120 s + fuzz 10k
    .venv/bin/python benchmarks/serving_soak.py --clients 8 --seconds 20 --fuzz 2000  # smoke
Writes JSON (and Markdown) to --out; exits 1 when any soak request failed, the corrupt or
half-copied version answered, or the server died.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODEL = "ampflow"


# ---- the server under test ----------------------------------------------------------------------

def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class ServerProcess:
    """`ampflow serve --server local` in its own process (so its RSS is its own)."""

    def __init__(self, base: Path, log_path: Path, *flags: str) -> None:
        cmd = [sys.executable, "-m", "ampflow.serving.cli", "serve", "--server", "local",
               "--port", "0", "--model-name", MODEL, "--model-base-path", str(base),
               "--grace-s", "2", *flags]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.address = self._read_address(timeout_s=180)

    def _read_address(self, timeout_s: float) -> str:
        found: list[str] = []

        def reader():
            for line in self.proc.stdout:
                match = re.search(r"^ampflow serve: listening on (\S+:\d+)", line)
                if match and not found:
                    found.append(match.group(1))

        threading.Thread(target=reader, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not found:
            self.stop()
            raise RuntimeError(f"server did not start; see {self._log.name}")
        return found[0]

    @property
    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode


def write_store(store: Path, versions: tuple[int, ...]) -> None:
    """The contract test model (ampflow.serving.testing), one dir per version."""
    from ampflow.serving.testing import write_model_version

    for version in versions:
        write_model_version(store, version, model_name=MODEL)


def install(store: Path, base: Path, version: int) -> None:
    """Copy a stored version next to the base path's versions, then rename it into place."""
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".{version}.incomplete-"))
    shutil.copytree(store / str(version), tmp, dirs_exist_ok=True)
    os.replace(tmp, base / str(version))


def copy_slowly(store: Path, base: Path, version: int, pause_s: float) -> float:
    """Copy a version file by file into place (no rename); returns when the copy ended."""
    source, target = store / str(version), base / str(version)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    # saved_model.pb and variables first, assets later: the order of a naive copy
    files.sort(key=lambda p: (0 if p.name == "saved_model.pb" else
                              1 if "variables" in p.parts else 2))
    for i, path in enumerate(files):
        if i:
            time.sleep(pause_s)
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    return time.monotonic()  # right after the last file: answers from then on are legitimate


# ---- soak ---------------------------------------------------------------------------------------

def soak(workdir: Path, clients: int, seconds: float, poll_s: float = 0.5) -> dict:
    import grpc
    import numpy as np

    from ampflow.serving.client import PredictionClient
    from ampflow.serving.testing import sample_images

    store, base = workdir / "store", workdir / "serving" / MODEL
    write_store(store, (1, 2, 4, 5))
    base.mkdir(parents=True)
    install(store, base, 1)
    server = ServerProcess(base, workdir / "soak-server.log",
                           "--file-system-poll-wait-seconds", str(poll_s))
    images = sample_images(1, seed=3)
    records: list[tuple[float, int | None, str, float]] = []
    lock = threading.Lock()
    stop = threading.Event()
    start = time.monotonic()
    events: dict[str, float] = {}
    rss: list[tuple[float, float]] = []

    def client_loop():
        out = []
        with PredictionClient(server.address, timeout_s=10, retries=0) as client:
            client.input_specs(MODEL)
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    version, code = client.predict(MODEL, images).version, "OK"
                except Exception as e:  # recorded by code
                    version, code = None, getattr(getattr(e, "code", None), "name", None) or \
                        type(e).__name__
                out.append((t0 - start, version, code, time.monotonic() - t0))
        with lock:
            records.extend(out)

    def pusher():
        plan = [(0.2, "v2 (atomic rename)", lambda: install(store, base, 2)),
                (0.35, "v3 corrupt", lambda: _install_corrupt(store, base, 3)),
                (0.5, "v4 slow copy started", None),
                (0.75, "v5 (atomic rename)", lambda: install(store, base, 5))]
        for fraction, name, action in plan:
            if stop.wait(max(0.0, start + fraction * seconds - time.monotonic())):
                return
            events[name] = time.monotonic() - start
            if action is not None:
                action()
            elif name.startswith("v4"):
                files = sum(1 for p in (store / "4").rglob("*") if p.is_file())
                pause = 0.15 * seconds / max(1, files)
                events["v4 slow copy finished"] = copy_slowly(store, base, 4, pause) - start

    def sampler():
        while not stop.wait(1.0):
            if server.alive():
                rss.append((time.monotonic() - start, server.rss_mb))

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    helpers = [threading.Thread(target=pusher), threading.Thread(target=sampler)]
    try:
        for t in threads + helpers:
            t.start()
        time.sleep(seconds)
    finally:
        stop.set()
        for t in threads + helpers:
            t.join(timeout=60)
        alive = server.alive()
        exit_code = server.stop()
    del grpc
    latencies = np.array([r[3] for r in records]) * 1000
    failures: dict[str, int] = {}
    for _t, _v, code, _l in records:
        if code != "OK":
            failures[code] = failures.get(code, 0) + 1
    timeline: dict[int, dict[str, int]] = {}
    for t, version, code, _l in records:
        bucket = timeline.setdefault(int(t), {})
        key = str(version) if code == "OK" else code
        bucket[key] = bucket.get(key, 0) + 1
    copy_done = events.get("v4 slow copy finished", float("inf"))
    early_v4 = sum(1 for t, v, _c, _l in records if v == 4 and t < copy_done)
    warm = [r for t, r in rss if t >= 2.0] or [r for _t, r in rss]
    return {
        "clients": clients, "seconds": seconds, "requests": len(records),
        "failures": sum(failures.values()), "failures_by_code": failures,
        "p50_ms": float(np.percentile(latencies, 50)) if len(latencies) else None,
        "p99_ms": float(np.percentile(latencies, 99)) if len(latencies) else None,
        "events_s": events,
        "versions_answered": sorted({r[1] for r in records if r[1] is not None}),
        "corrupt_v3_answers": sum(1 for r in records if r[1] == 3),
        "v4_answers_before_copy_finished": early_v4,
        "timeline_per_second": timeline,
        "rss_mb": {"first": warm[0] if warm else None, "last": warm[-1] if warm else None,
                   "max": max(warm) if warm else None,
                   "drift": (warm[-1] - warm[0]) if warm else None},
        "server_alive_at_end": alive, "server_exit_code": exit_code,
    }


def _install_corrupt(store: Path, base: Path, version: int) -> None:
    """A complete copy of version 1 whose saved_model.pb is garbage, renamed into place."""
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".{version}.incomplete-"))
    shutil.copytree(store / "1", tmp, dirs_exist_ok=True)
    (tmp / "saved_model.pb").write_bytes(b"\x00this is not a SavedModel")
    os.replace(tmp, base / str(version))


# ---- fuzz ---------------------------------------------------------------------------------------

def hand_made_requests() -> list[tuple[str, str, bytes]]:
    """(name, method, serialized request): bad requests a hostile client could send."""
    import numpy as np
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        predict_pb2,
    )

    from ampflow.serving.testing import raw_tensor_proto

    def predict(dims=(1, 8, 8, 1), dtype=types_pb2.DT_FLOAT, key="images", name=MODEL,
                signature="", **values):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = name
        if signature:
            request.model_spec.signature_name = signature
        request.inputs[key].CopyFrom(raw_tensor_proto(dims, dtype, **values))
        return request

    one_image = np.zeros((1, 8, 8, 1), np.float32).tobytes()
    cases: list[tuple[str, str, object]] = [
        ("52-byte request declaring [4000000,8,8,1], one float_val", "Predict",
         predict((4_000_000, 8, 8, 1), float_val=[1.0])),
        ("wrong rank, huge shape [50000000,1]", "Predict", predict((50_000_000, 1),
                                                                   float_val=[1.0])),
        ("dims whose product overflows int64 to 64", "Predict",
         predict((2 ** 62 + 1, 8, 8, 1), float_val=[1.0])),
        ("dims over 2**63 elements", "Predict", predict((2 ** 62, 2 ** 62, 8, 1),
                                                        float_val=[1.0])),
        ("negative dimension", "Predict", predict((-1, 8, 8, 1), float_val=[1.0])),
        ("rank 300", "Predict", predict((1,) * 300, float_val=[1.0])),
        ("batch 100000 within the byte limit (one value)", "Predict",
         predict((100_000, 8, 8, 1), float_val=[1.0])),
        ("batch over the cap with full data", "Predict",
         predict((2000, 8, 8, 1), tensor_content=b"\0" * (2000 * 256))),
        ("tensor_content shorter than the shape", "Predict",
         predict((10, 8, 8, 1), tensor_content=b"\0" * 4)),
        ("string tensor declared [3000000] with one value", "Predict",
         predict((3_000_000,), types_pb2.DT_STRING, "inputs", signature="classify",
                 string_val=[b"x"])),
        ("wrong dtype (int32)", "Predict", predict(dtype=types_pb2.DT_INT32, int_val=[1])),
        ("unsupported dtype (complex64)", "Predict", predict(dtype=types_pb2.DT_COMPLEX64)),
        ("too many values", "Predict", predict((1, 1, 1, 1), float_val=[1.0, 2.0])),
        ("batch 0", "Predict", predict((0, 8, 8, 1))),
        ("unknown input name", "Predict", predict(key="pixels", tensor_content=one_image)),
        ("empty model name", "Predict", predict(name="", tensor_content=one_image)),
        ("100 KB model name", "Predict", predict(name="m" * 100_000, tensor_content=one_image)),
        ("unknown signature", "Predict", predict(signature="nope", tensor_content=one_image)),
        ("no model_spec", "Predict", predict_pb2.PredictRequest()),
    ]
    many = predict_pb2.PredictRequest()
    many.model_spec.name = MODEL
    for i in range(2001):
        many.inputs[f"input_{i:05d}_" + "x" * 40].dtype = types_pb2.DT_FLOAT
    cases.append(("2001 input names", "Predict", many))
    label = predict(tensor_content=one_image)
    label.model_spec.version_label = "l" * 50_000
    cases.append(("50 KB version label", "Predict", label))
    version = predict(tensor_content=one_image)
    version.model_spec.version.value = 2 ** 63 - 1
    cases.append(("version 2**63-1", "Predict", version))
    flood = classification_pb2.ClassificationRequest()
    flood.model_spec.name = MODEL
    flood.model_spec.signature_name = "classify"
    ctx = flood.input.example_list_with_context.context
    ctx.features.feature["pad"].float_list.value.extend([0.5] * 250_000)
    for _ in range(100):
        flood.input.example_list_with_context.examples.add()
    cases.append(("Classify: 1 MB context x 100 examples", "Classify", flood))
    empty = classification_pb2.ClassificationRequest()
    empty.model_spec.name = MODEL
    empty.model_spec.signature_name = "classify"
    cases.append(("Classify: no examples", "Classify", empty))
    wrong_sig = classification_pb2.ClassificationRequest()
    wrong_sig.model_spec.name = MODEL
    wrong_sig.input.example_list.examples.add()
    cases.append(("Classify on the predict signature", "Classify", wrong_sig))
    meta = get_model_metadata_pb2.GetModelMetadataRequest()
    meta.model_spec.name = MODEL
    meta.metadata_field.append("x" * 10_000)
    cases.append(("metadata field 10 KB", "GetModelMetadata", meta))
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "nope"
    cases.append(("status of an unknown model", "GetModelStatus", status))
    raw = [(name, method, request.SerializeToString()) for name, method, request in cases]
    raw.append(("6 bytes that do not parse", "Predict", b"\x0a\xc8\x01\x00\x01\x02"))
    raw.append(("random bytes", "Predict", random.Random(0).randbytes(512)))
    return raw


_PATHS = {"Predict": "/tensorflow.serving.PredictionService/Predict",
          "Classify": "/tensorflow.serving.PredictionService/Classify",
          "GetModelMetadata": "/tensorflow.serving.PredictionService/GetModelMetadata",
          "GetModelStatus": "/tensorflow.serving.ModelService/GetModelStatus"}


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four random byte edits: flip, overwrite, insert, delete, truncate, duplicate."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        i = rng.randrange(len(data)) if data else 0
        if kind == 0 and data:
            data[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and data:
            data[i] = rng.randrange(256)
        elif kind == 2:
            data[i:i] = bytes([rng.randrange(256)])
        elif kind == 3 and data:
            del data[i]
        elif kind == 4:
            data = data[:i]
        else:
            j = rng.randrange(len(data) + 1)
            data[j:j] = data[i:i + rng.randint(1, 16)]
    return bytes(data)


def seed_requests() -> list[tuple[str, bytes]]:
    """Valid requests of each method, the starting points of the mutations."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        predict_pb2,
    )

    from ampflow.serving.model_format import image_example

    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = MODEL
    predict.inputs["images"].CopyFrom(tf.make_tensor_proto(np.ones((2, 8, 8, 1), np.float32)))
    typed = predict_pb2.PredictRequest()
    typed.model_spec.name = MODEL
    typed.inputs["images"].float_val.extend([1.0, 2.0])
    typed.inputs["images"].dtype = 1
    for d in (2, 8, 8, 1):
        typed.inputs["images"].tensor_shape.dim.add().size = d
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = MODEL
    classify.model_spec.signature_name = "classify"
    classify.input.example_list.examples.append(image_example(np.ones((8, 8, 1))))
    meta = get_model_metadata_pb2.GetModelMetadataRequest()
    meta.model_spec.name = MODEL
    meta.metadata_field.append("signature_def")
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = MODEL
    return [("Predict", predict.SerializeToString()), ("Predict", typed.SerializeToString()),
            ("Classify", classify.SerializeToString()),
            ("GetModelMetadata", meta.SerializeToString()),
            ("GetModelStatus", status.SerializeToString())]


def fuzz(address: str, mutated: int, seed: int = 0, server: ServerProcess | None = None) -> dict:
    """Send the hand-made requests and `mutated` byte-mutated ones; every answer is a code."""
    import grpc

    rng = random.Random(seed)
    rss_before = server.rss_mb if server else None
    table, codes = [], {}
    with grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 64 * 1024 * 1024)]) as channel:
        calls = {m: channel.unary_unary(p) for m, p in _PATHS.items()}

        def send(method: str, data: bytes) -> tuple[str, str]:
            try:
                calls[method](data, timeout=30)
                return "OK", ""
            except grpc.RpcError as e:
                return e.code().name, e.details() or ""

        for name, method, data in hand_made_requests():
            code, message = send(method, data)
            table.append({"request": name, "bytes": len(data), "code": code,
                          "message": message[:160]})
        seeds = seed_requests()
        for _ in range(mutated):
            method, data = rng.choice(seeds)
            code, _message = send(method, mutate(data, rng))
            codes[code] = codes.get(code, 0) + 1
        good_method, good = seeds[0]
        alive_code, _ = send(good_method, good)
    return {"hand_made": table, "mutated": mutated, "mutated_codes": codes,
            "good_request_after": alive_code,
            "rss_mb_before": rss_before, "rss_mb_after": server.rss_mb if server else None,
            "server_alive": server.alive() if server else None}


def fuzz_with_server(workdir: Path, mutated: int, seed: int = 0) -> dict:
    """Fuzz a fresh `ampflow serve` process (warmed up first so RSS is comparable)."""
    store, base = workdir / "fuzz-store", workdir / "fuzz-serving" / MODEL
    write_store(store, (1,))
    base.mkdir(parents=True)
    install(store, base, 1)
    server = ServerProcess(base, workdir / "fuzz-server.log")
    try:
        fuzz(server.address, 200, seed + 1)  # warm-up: first-use allocations are not growth
        return fuzz(server.address, mutated, seed, server)
    finally:
        server.stop()


# ---- report -------------------------------------------------------------------------------------

def to_markdown(report: dict) -> str:
    lines = ["# Serving reliability", ""]
    if "soak" in report:
        s = report["soak"]
        lines += [
            f"Soak: {s['clients']} clients x {s['seconds']:.0f} s, versions pushed at "
            + ", ".join(f"{k} {v:.1f}s" for k, v in s["events_s"].items()) + ".", "",
            "| requests | failed | by code | p50 ms | p99 ms | versions answered | corrupt v3 "
            "answers | v4 answers before its copy finished | RSS first / last / max MB |",
            "|---:|---:|---|---:|---:|---|---:|---:|---|",
            f"| {s['requests']} | {s['failures']} | {s['failures_by_code'] or '-'} | "
            f"{s['p50_ms']:.2f} | {s['p99_ms']:.2f} | {s['versions_answered']} | "
            f"{s['corrupt_v3_answers']} | {s['v4_answers_before_copy_finished']} | "
            f"{s['rss_mb']['first']:.0f} / {s['rss_mb']['last']:.0f} / "
            f"{s['rss_mb']['max']:.0f} |", ""]
    if "fuzz" in report:
        f = report["fuzz"]
        lines += [
            f"Fuzz: {f['mutated']} byte-mutated requests -> {f['mutated_codes']}; a good "
            f"request afterwards: {f['good_request_after']}; server RSS "
            f"{f['rss_mb_before']:.0f} -> {f['rss_mb_after']:.0f} MB.", "",
            "| request | bytes | code | message |", "|---|---:|---|---|"]
        for row in f["hand_made"]:
            message = row["message"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {row['request']} | {row['bytes']} | {row['code']} | {message} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--clients", type=int, default=32, help="soak client threads")
    p.add_argument("--seconds", type=float, default=120.0, help="soak duration (0 = no soak)")
    p.add_argument("--fuzz", type=int, default=10_000,
                   help="byte-mutated requests (0 = no fuzz)")
    p.add_argument("--out", default="benchmarks/results", help="output dir")
    args = p.parse_args(argv)
    report: dict = {"machine": f"{os.cpu_count()} CPUs"}
    with tempfile.TemporaryDirectory(prefix="ampflow-soak-") as tmp:
        if args.seconds > 0:
            report["soak"] = soak(Path(tmp), args.clients, args.seconds)
            print(json.dumps({k: v for k, v in report["soak"].items()
                              if k != "timeline_per_second"}, indent=1), flush=True)
        if args.fuzz > 0:
            report["fuzz"] = fuzz_with_server(Path(tmp), args.fuzz)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serving_soak.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "serving_soak.md").write_text(to_markdown(report))
    print(to_markdown(report))
    soak_ok = "soak" not in report or (
        report["soak"]["failures"] == 0 and report["soak"]["corrupt_v3_answers"] == 0
        and report["soak"]["v4_answers_before_copy_finished"] == 0)
    fuzz_ok = "fuzz" not in report or (report["fuzz"]["server_alive"] and
                                       report["fuzz"]["good_request_after"] == "OK")
    return 0 if soak_ok and fuzz_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
