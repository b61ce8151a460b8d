"""Reliability of `ampflow serve`: a soak with hot reloads, and a fuzz of hostile requests.

soak: N clients x T seconds (default 32 x 120) of gRPC Predict against `ampflow serve` (its own
process), while new versions are pushed mid-run: version 2 (atomic rename), a corrupt
version 3, a version 4 copied in slowly file by file, and version 5 (atomic rename). Reports
requests, failures by code, p50/p99 latency, which version answered over time, whether the
corrupt or the half-copied version ever answered, and the server's RSS drift.

fuzz (serving_fuzz.py): byte-mutated Predict/Classify/metadata/status requests (default 10,000)
plus hand-made bad requests (the 52-byte huge-shape request and others), each answered with a
status code; checks the server is alive afterwards and reports its RSS before and after, and the
table request -> code -> message.

    .venv/bin/python benchmarks/serving_soak.py                      # soak 32 x 120 s + fuzz 10k
    .venv/bin/python benchmarks/serving_soak.py --clients 8 --seconds 20 --fuzz 2000  # smoke
Writes JSON (and Markdown) to --out; exits 1 when any soak request failed, the corrupt or
half-copied version answered, or the server died.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the fuzz half lives beside it

import serving_fuzz  # noqa: E402

MODEL = serving_fuzz.MODEL


# ---- pushing versions ---------------------------------------------------------------------------

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

def _wait_showing_progress(seconds: float, clients: int, start: float, outs: list[list],
                           events: dict[str, float]) -> None:
    """Sleep out the soak, showing its seconds, requests so far and the last version pushed."""
    from ampflow.progress import Progress

    def values():
        return {"requests": sum(len(out) for out in outs),
                "last push": (list(events) or [None])[-1]}

    with Progress(max(1, round(seconds)), f"soak ({clients} clients)", unit="s",
                  show_rate=False) as progress:
        while (left := start + seconds - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            progress.update(max(0, round(time.monotonic() - start) - progress.n), values=values)

LAST_VERSION = 5  # the last version the pusher installs
LAST_VERSION_WAIT_S = 60.0  # how long past `seconds` the clients run until it answers


def soak(workdir: Path, clients: int, seconds: float, poll_s: float = 0.5,
         flags: tuple[str, ...] = (), own_connections: bool = False) -> dict:
    """`clients` threads query for `seconds` while versions 2-5 are pushed (see the plan).

    `flags`: more `ampflow serve` flags (`--workers 2`: the server's RSS is then the
    supervisor's alone). `own_connections`: each client on its own TCP connection, as separate
    client processes would be (gRPC gives all channels of a process to one address one shared
    connection unless their channel arguments differ: here the message limit, by a byte per
    client), so that `--workers` gets connections to spread.

    Version 5 lands at 75 % of the run; the clients keep going past `seconds` (up to
    LAST_VERSION_WAIT_S) until it has answered once, so a loaded machine's slower reload is
    waited for rather than reported as a reload that never reached the clients.
    """
    import grpc
    import numpy as np

    from ampflow.serving.client import PredictionClient
    from ampflow.serving.testing import (
        ServeProcess,
        install_version,
        sample_images,
        write_model_version,
    )

    store, base = workdir / "store", workdir / "serving" / MODEL
    for version in (1, 2, 4, 5):
        write_model_version(store, version, model_name=MODEL)
    install_version(store, base, 1)
    server = ServeProcess(MODEL, base, workdir / "soak-server.log", "--grace-s", "2",
                          "--file-system-poll-wait-seconds", str(poll_s), *flags,
                          stop_timeout_s=30)
    images = sample_images(1, seed=3)
    records: list[tuple[float, int | None, str, float]] = []
    lock = threading.Lock()
    stop = threading.Event()
    start = time.monotonic()
    events: dict[str, float] = {}
    rss: list[tuple[float, float]] = []
    last_version_answered = threading.Event()

    outs: list[list] = [[] for _ in range(clients)]  # one per client: counted while running

    def client_loop(index: int):
        out = outs[index]
        extra = {"max_message_bytes": (64 << 20) + index} if own_connections else {}
        with PredictionClient(server.address, timeout_s=10, retries=0, **extra) as client:
            client.input_specs(MODEL)
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    version, code = client.predict(MODEL, images).version, "OK"
                    if version == LAST_VERSION:
                        last_version_answered.set()
                except Exception as e:  # recorded by code
                    version, code = None, getattr(getattr(e, "code", None), "name", None) or \
                        type(e).__name__
                out.append((t0 - start, version, code, time.monotonic() - t0))
        with lock:
            records.extend(out)

    def pusher():
        plan = [(0.2, "v2 (atomic rename)", lambda: install_version(store, base, 2)),
                (0.35, "v3 corrupt", lambda: _install_corrupt(store, base, 3)),
                (0.5, "v4 slow copy started", None),
                (0.75, "v5 (atomic rename)",
                 lambda: install_version(store, base, LAST_VERSION))]
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

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    helpers = [threading.Thread(target=pusher), threading.Thread(target=sampler)]
    try:
        for t in threads + helpers:
            t.start()
        _wait_showing_progress(seconds, clients, start, outs, events)
        last_version_answered.wait(LAST_VERSION_WAIT_S)
    finally:
        ran_s = time.monotonic() - start
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
        "clients": clients, "seconds": seconds, "seconds_run": ran_s,
        "requests": len(records),
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
    from ampflow.serving.testing import install_version

    install_version(store, base, version, source=1,
                    edit=lambda tmp: (tmp / "saved_model.pb").write_bytes(
                        b"\x00this is not a SavedModel"))


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
            report["fuzz"] = serving_fuzz.fuzz_with_server(Path(tmp), args.fuzz)
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
