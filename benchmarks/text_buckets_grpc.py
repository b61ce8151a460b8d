"""The gRPC part of text_length_buckets.py (issue 50): the two text SavedModels, each served.

The same two exports as the in-process part (the length-following model, padded to each
request's bucket, and the same weights behind a fixed cap input), each served by its own `ampflow
serve --server local` child process with the default flags; ampflow's own `PredictionClient`
sends raw review snippets over loopback gRPC as a user would. Each request goes to both servers
one after the other, the order swapped every round, so a shared host's load hits both alike.
Kinds of request: 1 snippet, 32 snippets, and 1 long text (past the cap) among 31 snippets.

Here so that text_length_buckets.py stays one file of a reasonable size; it imports nothing
from there (that script passes in its snippets and its exports' folders).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
from bench_host import load_average

MODEL = "reviews"
KINDS = ("1", "32", "1_long_31")
ARMS = ("buckets", "max_length")


def requests_of(texts: list[str], kind: str, calls: int) -> list[list[bytes]]:
    """`calls` requests of `kind`, real snippets in order (the long text: 8 snippets joined)."""
    utf8 = [t.encode("utf-8") for t in texts]
    size = 1 if kind == "1" else 32
    requests = [utf8[i:i + size] for i in range(0, len(utf8) - size + 1, size)][:calls]
    if kind == "1_long_31":
        long = b" ".join(utf8[:8])
        requests = [[long, *request[1:]] for request in requests]
    return requests


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100): a value that was measured."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(np.ceil(q / 100 * len(ordered))) - 1))]


def row_of(model: str, kind: str, texts_per_request: int, seconds: dict[str, list[float]],
           answers: dict[str, list[np.ndarray]]) -> dict:
    """One table row: p50/p99/texts/s per arm, their ratio, and how the answers compare."""
    bucketed = np.concatenate(answers["buckets"])
    padded = np.concatenate(answers["max_length"])
    row = {"model": model, "kind": kind, "texts_per_request": texts_per_request,
           "calls_per_arm": len(seconds["buckets"]),
           "max_abs_diff": float(np.abs(bucketed - padded).max()),
           "same_classes": float((bucketed.argmax(-1) == padded.argmax(-1)).mean()),
           "answers_compared": int(len(bucketed)), "load": load_average()}
    for arm in ARMS:
        row[arm] = {"p50_ms": round(1000 * statistics.median(seconds[arm]), 2),
                    "p99_ms": round(1000 * percentile(seconds[arm], 99), 2),
                    "texts_per_s": round(texts_per_request / statistics.mean(seconds[arm]), 1)}
    row["speedup"] = round(row["buckets"]["texts_per_s"] / row["max_length"]["texts_per_s"], 2)
    return row


def _timed_call(client, request: list[bytes]) -> tuple[float, np.ndarray]:
    began = time.perf_counter()
    result = client.predict(MODEL, request)
    return time.perf_counter() - began, np.asarray(result.outputs["probabilities"])


def _measure_kind(clients: dict, requests: list[list[bytes]], rounds: int):
    """Each request to both servers in turn (order swapped each round); warm-up first."""
    answers = {arm: [_timed_call(c, r)[1] for r in requests] for arm, c in clients.items()}
    seconds: dict[str, list[float]] = {arm: [] for arm in clients}
    for repeat in range(rounds):
        order = ARMS if repeat % 2 == 0 else ARMS[::-1]
        for request in requests:
            for arm in order:
                seconds[arm].append(_timed_call(clients[arm], request)[0])
    return seconds, answers


def grpc_serving(texts: list[str], exports: dict[str, dict[str, Path]], workdir: Path,
                 calls: int, rounds: int) -> list[dict]:
    """For each model: both exports served at once, every kind of request measured on both."""
    from contextlib import ExitStack

    from ampflow.serving.client import PredictionClient
    from ampflow.serving.testing import ServeProcess

    rows = []
    for name, bases in exports.items():
        with ExitStack() as stack:
            clients = {}
            for arm in ARMS:
                server = stack.enter_context(ServeProcess(
                    MODEL, bases[arm], workdir / f"serve_{name}_{arm}.log"))
                clients[arm] = stack.enter_context(
                    PredictionClient(server.address, timeout_s=600, retries=0))
            for kind in KINDS:
                requests = requests_of(texts, kind, calls)
                seconds, answers = _measure_kind(clients, requests, rounds)
                rows.append(row_of(name, kind, len(requests[0]), seconds, answers))
                print(f"grpc {name} {kind}: {rows[-1]['speedup']}x", flush=True)
    return rows


KIND_NAMES = {"1": "1 snippet", "32": "32 snippets", "1_long_31": "1 long + 31 snippets"}


def markdown_lines(rows: list[dict]) -> list[str]:
    """The gRPC table of text_length_buckets' Markdown (nothing when the part did not run)."""
    if not rows:
        return []
    lines = ["", "## Serving over gRPC (`ampflow serve` per export, `PredictionClient`, raw "
             "snippets in, interleaved)", "",
             "| model | request | buckets p50 / p99 ms | buckets texts/s | max_length p50 / p99 "
             "ms | max_length texts/s | × | same classes | max abs diff | calls each |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        fast, slow = r["buckets"], r["max_length"]
        lines.append(
            f"| {r['model']} | {KIND_NAMES.get(r['kind'], r['kind'])} | {fast['p50_ms']} / "
            f"{fast['p99_ms']} | {fast['texts_per_s']} | {slow['p50_ms']} / {slow['p99_ms']} | "
            f"{slow['texts_per_s']} | {r['speedup']}× | {100 * r['same_classes']:.1f} % of "
            f"{r['answers_compared']} | {r['max_abs_diff']:.1e} | {r['calls_per_arm']} |")
    return lines
