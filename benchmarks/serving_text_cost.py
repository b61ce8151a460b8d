r"""What a text request costs `ampflow serve`: memory and time against its tokens (issue 50).

bert_tiny (float32, seeded; the weights do not change the cost) at cap 128 on the offline review
snippets' vocabulary, exported by the exporter's own `save_text_servable`, served by `ampflow
serve --server local` in its own process, one fresh process per setting:
  cap           the same weights behind a fixed 128 input (every request padded to the cap),
                no token limit, one run per request: what an earlier round measured (8 requests
                of 1,024 short strings: 21 s, 2.36 GB);
  buckets       padded to each text's length bucket, no token limit and no slices;
  buckets+slices  the defaults (--max-request-tokens 65536, --max-execution-tokens 8192);
  (--malloc: the last again with glibc's mmap threshold pinned: MALLOC_MMAP_THRESHOLD_).
For each: the server's RSS after loading and one request, its peak (VmHWM) and its RSS after a
burst of 8 concurrent gRPC requests of 1,024 strings of 4 bytes (4 KB each), then after a second
burst; the burst's wall time and each request's latency beside its tokens. On the bucket
servers: p50 over gRPC of 32 short snippets, 1 long text among 31 short, and 32 long texts.

    .venv/bin/python benchmarks/serving_text_cost.py --workdir /tmp/text-cost
Writes benchmarks/results/serving_text_cost.{json,md} (the host's CPU flags and load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host import cpu_capabilities, git_commit, load_average, simd_flags  # noqa: E402

OUT = Path(__file__).parent / "results"
CAP, MODEL = 128, "reviews"
SETTINGS = {  # name: (model dir, flags)
    "cap": ("cap", ("--max-request-tokens", "0", "--max-execution-tokens", "0")),
    "buckets": ("buckets", ("--max-request-tokens", "0", "--max-execution-tokens", "0")),
    "buckets+slices": ("buckets", ()),
}
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def main() -> int:
    args = _parse()
    args.workdir.mkdir(parents=True, exist_ok=True)
    snippets = _snippets()
    models = _export(args.workdir, snippets)
    settings = dict(SETTINGS)
    if args.malloc:
        settings["buckets+slices, mmap threshold 128 KB"] = SETTINGS["buckets+slices"]
    report = {"benchmark": "serving_text_cost", "model": "bert_tiny", "cap": CAP,
              "host": {"cpu": cpu_capabilities(), "simd_flags": simd_flags(),
                       "load_before": load_average()},
              "commit": git_commit(("serving",)), "burst": {"requests": 8, "strings": 1024,
                                                             "bytes_per_string": 4},
              "settings": []}
    for name, (model, flags) in settings.items():
        env = MALLOC_ENV if "mmap" in name else {}
        row = _measure(name, models[model], flags, env, snippets, args.workdir)
        report["settings"].append(row)
        print(json.dumps(row), flush=True)
    report["host"]["load_after"] = load_average()
    OUT.mkdir(exist_ok=True)
    (OUT / "serving_text_cost.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / "serving_text_cost.md").write_text("\n".join(markdown(report)) + "\n")
    return 0


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--reps", type=int, default=10, help="calls per mixed-length request kind")
    p.add_argument("--malloc", action="store_true",
                   help="also the defaults with glibc's mmap threshold pinned at 128 KB")
    return p.parse_args()


def _snippets() -> list[str]:
    from ampflow.data.offline_rotten_tomatoes import load_snippets

    rows, _ = load_snippets()
    return [text for _, text, _, _ in rows]


def _export(workdir: Path, snippets: list[str]) -> dict[str, Path]:
    """bert_tiny twice: length-following (buckets) and behind a fixed 128 input (cap)."""
    import keras

    from ampflow.components.export_savedmodel.text_signatures import (
        length_buckets_of,
        save_text_servable,
    )
    from ampflow.modeling.models import make_text_model
    from ampflow.modeling.tokenizer import TokenizerConfig, fit_tokenizer

    tokenizer = fit_tokenizer(snippets, TokenizerConfig(max_sequence_length=CAP))
    keras.utils.set_random_seed(0)
    model = make_text_model("bert_tiny", CAP, tokenizer.vocabulary_size, 2,
                            policy="float32").model
    ids = keras.Input((CAP,), dtype="int32")
    bases = {}
    for name, keras_model in (("buckets", model), ("cap", keras.Model(ids, model(ids)))):
        version = workdir / name / MODEL / "1"
        if not version.exists():
            save_text_servable(keras_model, tokenizer, ["fresh", "rotten"], version)
            (version / "ampflow_export.json").write_text(json.dumps(
                {"input": {"length_buckets": length_buckets_of(keras_model, CAP)}}))
        bases[name] = version.parent
    return bases


def _status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of `pid`, in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(line.split()[1]) / 1024, 1)
    return out


def _burst(client, texts: list[bytes]) -> dict:
    """8 requests of `texts` at once: the wall time and each request's latency."""
    def one(_):
        start = time.perf_counter()
        client.predict(MODEL, texts)
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        latencies = sorted(pool.map(one, range(8)))
    return {"wall_s": round(time.perf_counter() - start, 2),
            "latency_s": [round(s, 2) for s in latencies]}


def _measure(name: str, base: Path, flags, env: dict, snippets: list[str], workdir: Path) -> dict:
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.testing import ServeProcess

    words = [w.encode() for w in " ".join(snippets).lower().split() if len(w) == 4][:1024]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        server = ServeProcess(MODEL, base, workdir / f"{name.replace(' ', '_')}.log", *flags)
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    with server, PredictionClient(server.address, timeout_s=600, retries=0) as client:
        client.predict(MODEL, [b"a fine film"])
        row = {"setting": name, "flags": list(flags), "env": env, "load": load_average(),
               "rss_loaded_mb": _status(server.proc.pid)["VmRSS"],
               "burst_tokens_each": 1024 * (CAP if name == "cap" else 16)}
        row["burst1"] = _burst(client, words)
        time.sleep(3)
        row["after_burst1_mb"] = _status(server.proc.pid)
        row["burst2"] = _burst(client, words)
        time.sleep(3)
        row["after_burst2_mb"] = _status(server.proc.pid)
        if name != "cap":
            row["mixed_p50_ms"] = _mixed(client, snippets, row)
    return row


def _mixed(client, snippets: list[str], row: dict) -> dict:
    """p50 of 32 short, 1 long + 31 short, 32 long, interleaved (10 calls each)."""
    short = [s.encode() for s in snippets if len(s.encode()) <= 32][:31]
    long = " ".join(snippets[:8]).encode()  # > 128 words: the cap's bucket
    kinds = {"32_short": short + short[:1], "1_long_31_short": [long] + short,
             "32_long": [long] * 32}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for texts in kinds.values():
        client.predict(MODEL, texts)  # warm
    for _ in range(10):
        for kind, texts in kinds.items():
            start = time.perf_counter()
            client.predict(MODEL, texts)
            times[kind].append(1000 * (time.perf_counter() - start))
    row["mixed_tokens"] = {"32_short": 32 * 16, "1_long_31_short": 128 + 31 * 16,
                           "32_long": 32 * 128}
    return {kind: round(statistics.median(values), 1) for kind, values in times.items()}


def markdown(report: dict) -> list[str]:
    host = report["host"]
    lines = [f"# A text request's cost in `ampflow serve` — {host['cpu'].get('model_name', '?')}",
             "", f"SIMD: {' '.join(host['simd_flags'])}; load average before "
             f"{host['load_before']}, after {host['load_after']} (a shared host).", "",
             "8 concurrent gRPC requests of 1,024 strings of 4 bytes, twice; bert_tiny at cap "
             "128. RSS in MB (peak = VmHWM since the process started).", "",
             "| setting | tokens each | RSS loaded | burst 1 wall s | latencies s | RSS after 1 "
             "| peak after 1 | burst 2 wall s | RSS after 2 | peak after 2 |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in report["settings"]:
        lines.append(
            f"| {r['setting']} | {r['burst_tokens_each']:,} | {r['rss_loaded_mb']} | "
            f"{r['burst1']['wall_s']} | {', '.join(map(str, r['burst1']['latency_s']))} | "
            f"{r['after_burst1_mb']['VmRSS']} | {r['after_burst1_mb']['VmHWM']} | "
            f"{r['burst2']['wall_s']} | {r['after_burst2_mb']['VmRSS']} | "
            f"{r['after_burst2_mb']['VmHWM']} |")
    lines += ["", "Mixed lengths, p50 ms over gRPC (10 calls each, interleaved):", "",
              "| setting | 32 short (512 tokens) | 1 long + 31 short (624) | 32 long (4,096) |",
              "|---|---:|---:|---:|"]
    for r in report["settings"]:
        if "mixed_p50_ms" in r:
            m = r["mixed_p50_ms"]
            lines.append(f"| {r['setting']} | {m['32_short']} | {m['1_long_31_short']} | "
                         f"{m['32_long']} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
