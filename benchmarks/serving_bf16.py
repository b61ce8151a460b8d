"""bfloat16 inference vs float32 (issue 42 point 4): one image and batched, side by side in one run.

Serves one float32 SavedModel twice from one `ampflow serve` server, as model `f32` and as
model `bf16` (`compute_precision="bfloat16"`: TF's oneDNN bfloat16 rewrite, per model), and
measures, interleaved round by round (the order alternates), on the same images:
- in process: `SavedModelServable.run` (what a request's model call costs in the server), one
  image (latency p50/p95) and a batch (images/s);
- over gRPC on loopback: `PredictionClient.predict` to the same server, one image and a batch.

Models: ResNet-50 (Keras, random weights, float32, `--image-size`): compute-bound, where the
CPU's bf16 units can show; and the serving tests' tiny contract model (one 64x10 MatMul):
overhead-bound, where they cannot. Also recorded: the bfloat16 ops the runtime executed (run
metadata of each bf16 model's first call), the largest |probability difference| between the
two answers, the CPU's flags, the load average before and after (the host is shared: the JSON
says so), TF's version. A CPU without AVX512_BF16/AMX-BF16 gets a result that says why and
no numbers (serve refuses bfloat16 there).

    .venv/bin/python benchmarks/serving_bf16.py --out benchmarks/results/serving_bf16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("float32", "bfloat16")
NAMES = {"float32": "f32", "bfloat16": "bf16"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/serving_bf16"),
                   help="output path without extension (.json and .md are written)")
    p.add_argument("--models", nargs="+", default=["resnet50", "tiny"],
                   choices=["resnet50", "tiny"])
    p.add_argument("--image-size", type=int, default=96, help="ResNet-50's input size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per precision")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="time per measurement (one image, batch) per round")
    p.add_argument("--no-grpc", action="store_true", help="in process only")
    p.add_argument("--note", default="", help="recorded as is (e.g. what else ran)")
    return p.parse_args(argv)


# ---- host ---------------------------------------------------------------------------------

def host_info() -> dict:
    """CPU model, its vector/matrix flags, cores, load: what the numbers ran on."""
    from ampflow.serving import cpu_features

    flags = cpu_features.read_cpu_flags()
    model = platform.processor()
    try:
        model = next((ln.split(":", 1)[1].strip()
                      for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), model)
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
    return {"cpu": model, "cores": os.cpu_count(), "flags": [f for f in wanted if f in flags],
            "bf16_native": bool(cpu_features.bf16_flags(flags)),
            "python": platform.python_version()}


# ---- models -------------------------------------------------------------------------------

def write_resnet50(base: Path, size: int) -> Path:
    """ResNet-50 (random weights, float32) behind the serving contract, as version 1."""
    import keras
    import tensorflow as tf

    from ampflow.serving.model_format import CLASS_IDS_OUTPUT, PROBABILITIES_OUTPUT

    keras.mixed_precision.set_global_policy("float32")
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=10)

    class Served(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, size, size, 3], tf.float32,
                                                    "images")])
        def serve(self, images):
            probabilities = self.model(images / 127.5 - 1.0, training=False)
            return {PROBABILITIES_OUTPUT: probabilities,
                    CLASS_IDS_OUTPUT: tf.argmax(probabilities, axis=-1, output_type=tf.int64)}

    module = Served()
    path = base / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def write_model(kind: str, base: Path, size: int) -> tuple[Path, tuple[int, ...]]:
    if kind == "resnet50":
        return write_resnet50(base, size), (size, size, 3)
    from ampflow.serving.testing import DEFAULT_SHAPE, write_model_version

    return write_model_version(base, 1, warmup=False), DEFAULT_SHAPE


# ---- measuring ----------------------------------------------------------------------------

def timed(call, seconds: float, min_calls: int = 5) -> list[float]:
    """Seconds per call of `call`, for about `seconds` (one untimed call first)."""
    call()
    samples, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(samples) < min_calls:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def summarize(one: list[float], batch: list[float], batch_size: int) -> dict:
    return {"one_image_p50_ms": statistics.median(one) * 1e3,
            "one_image_p95_ms": float(np.percentile(one, 95)) * 1e3,
            "one_image_calls": len(one),
            "batch_images_per_s": batch_size / statistics.median(batch),
            "batch_calls": len(batch)}


def rss_mb() -> float:
    """This process's resident memory (Linux /proc)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_mb() -> float:
    """Resident MB after gc and glibc's malloc_trim: what is live, not freed temporaries.

    A load's temporary copies (the frozen graph's) stay in RSS until the allocator returns them.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return rss_mb()


def memory_cost(path: Path, shape: tuple[int, ...], loads: int = 2) -> dict:
    """MB a version adds loaded and warm (one call), per precision, and after unloading it.

    Loaded `loads` times each, one after the other (a version swap), so a leak would show as
    an `after_unload` that keeps growing. `peak_rss_mb`: the raw RSS rise before trimming.
    """
    from ampflow.serving.models.servable import SavedModelServable

    images = np.zeros((1, *shape), np.float32)
    out = {}
    for precision in PRECISIONS:
        rows = []
        for _ in range(loads):
            before = live_mb()
            servable = SavedModelServable("m", 1, path, precision)
            servable.run("serving_default", {"images": images})
            peak = rss_mb()
            loaded = live_mb()
            del servable
            rows.append({"loaded_warm_mb": loaded - before, "peak_rss_mb": peak - before,
                         "after_unload_mb": live_mb() - before})
        out[precision] = rows
    return out


def measure_model(kind: str, args, work: Path) -> dict:
    from ampflow.serving import compute_precision
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server

    base = work / kind
    version, shape = write_model(kind, base, args.image_size)
    memory = memory_cost(version, shape)
    models = tuple(ModelConfig(NAMES[p], base, compute_precision=p) for p in PRECISIONS)
    server = start_local_server(ServerConfig(models=models, host="127.0.0.1", port=0,
                                             enable_warmup=False,
                                             file_system_poll_wait_seconds=0))
    try:
        servables = {p: server.registry.resolve(NAMES[p], None, None) for p in PRECISIONS}
        rng = np.random.default_rng(0)
        one = rng.uniform(0, 255, (1, *shape)).astype(np.float32)
        batch = rng.uniform(0, 255, (args.batch_size, *shape)).astype(np.float32)
        evidence = {p: compute_precision.bf16_graph_evidence(
            lambda s=servables[p]: s.run("serving_default", {"images": batch}))
            for p in PRECISIONS}
        answers = {p: servables[p].run("serving_default", {"images": batch})["probabilities"]
                   for p in PRECISIONS}
        client = None
        if not args.no_grpc:
            from ampflow.serving.client import PredictionClient

            client = PredictionClient(server.address, timeout_s=120)
        rounds = []
        for r in range(args.rounds):
            order = PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]
            row = {}
            for p in order:
                s = servables[p]
                row[f"in_process_{p}"] = summarize(
                    timed(lambda s=s: s.run("serving_default", {"images": one}), args.seconds),
                    timed(lambda s=s: s.run("serving_default", {"images": batch}), args.seconds),
                    args.batch_size)
                if client is not None:
                    name = NAMES[p]
                    row[f"grpc_{p}"] = summarize(
                        timed(lambda n=name: client.predict(n, one), args.seconds),
                        timed(lambda n=name: client.predict(n, batch), args.seconds),
                        args.batch_size)
            rounds.append(row)
            print(f"{kind} round {r + 1}: " + ", ".join(
                f"{k} {v['one_image_p50_ms']:.2f} ms / {v['batch_images_per_s']:.0f} img/s"
                for k, v in row.items()), flush=True)
        if client is not None and hasattr(client, "close"):
            client.close()
    finally:
        server.stop(0)
    diff = np.abs(answers["bfloat16"].astype(np.float64) - answers["float32"])
    agree = np.argmax(answers["bfloat16"], 1) == np.argmax(answers["float32"], 1)
    return {"model": kind, "input_shape": list(shape), "batch_size": args.batch_size,
            "rewrite": {p: evidence[p] for p in PRECISIONS}, "memory": memory,
            "rounds": rounds,
            "ratios": ratios(rounds),
            "batch_answers": {"max_abs_prob_diff": float(diff.max()),
                              "argmax_agreement": float(agree.mean())}}


def ratios(rounds: list[dict]) -> dict:
    """bf16 over float32 per path: medians of the per-round ratios (>1: bf16 faster)."""
    out = {}
    for path in ("in_process", "grpc"):
        if f"{path}_float32" not in rounds[0]:
            continue
        latency = [r[f"{path}_float32"]["one_image_p50_ms"] / r[f"{path}_bfloat16"][
            "one_image_p50_ms"] for r in rounds]
        throughput = [r[f"{path}_bfloat16"]["batch_images_per_s"] / r[f"{path}_float32"][
            "batch_images_per_s"] for r in rounds]
        out[path] = {"one_image_speedup": statistics.median(latency),
                     "one_image_speedup_range": [min(latency), max(latency)],
                     "batch_throughput_ratio": statistics.median(throughput),
                     "batch_throughput_ratio_range": [min(throughput), max(throughput)]}
    return out


# ---- output -------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    host = result["host"]
    lines = [
        "# bfloat16 inference vs float32 (`ampflow serve --compute-precision bfloat16`)", "",
        f"Host: {host['cpu']}, {host['cores']} cores, flags {', '.join(host['flags'])}; "
        f"TF {result['tensorflow']}. **Shared host**: load average "
        f"{result['load_before'][0]:.2f} before, {result['load_after'][0]:.2f} after "
        f"(1 min). {result['rounds']} interleaved rounds of {result['seconds']:g} s per "
        "measurement; medians of per-round values. " + (result["note"] or ""), ""]
    if "skipped" in result:
        return "\n".join([*lines, f"Skipped: {result['skipped']}", ""])
    for model in result["models"]:
        lines += [f"## {model['model']} (input {model['input_shape']}, batch "
                  f"{model['batch_size']})", "",
                  "| path | precision | one image p50 ms | p95 ms | batch images/s |",
                  "|---|---|---:|---:|---:|"]
        for path in ("in_process", "grpc"):
            for p in PRECISIONS:
                key = f"{path}_{p}"
                if key not in model["rounds"][0]:
                    continue
                rows = [r[key] for r in model["rounds"]]
                lines.append(
                    f"| {path.replace('_', ' ')} | {p} | "
                    f"{statistics.median(x['one_image_p50_ms'] for x in rows):.2f} | "
                    f"{statistics.median(x['one_image_p95_ms'] for x in rows):.2f} | "
                    f"{statistics.median(x['batch_images_per_s'] for x in rows):.1f} |")
        lines += ["", "| path | one image: float32 / bf16 latency | batch: bf16 / float32 "
                      "images/s |", "|---|---:|---:|"]
        for path, r in model["ratios"].items():
            lines.append(f"| {path.replace('_', ' ')} | {r['one_image_speedup']:.2f}x "
                         f"({r['one_image_speedup_range'][0]:.2f}-"
                         f"{r['one_image_speedup_range'][1]:.2f}) | "
                         f"{r['batch_throughput_ratio']:.2f}x "
                         f"({r['batch_throughput_ratio_range'][0]:.2f}-"
                         f"{r['batch_throughput_ratio_range'][1]:.2f}) |")
        bf16 = model["rewrite"]["bfloat16"]
        lines += ["", f"Executed graph of the bf16 model: {bf16['bfloat16_nodes']} nodes in "
                      f"bfloat16 ({', '.join(bf16['bfloat16_ops'])}); float32 model: "
                      f"{model['rewrite']['float32']['bfloat16_nodes']}. On the batch: max "
                      f"|probability difference| {model['batch_answers']['max_abs_prob_diff']:.3g},"
                      f" argmax agreement {model['batch_answers']['argmax_agreement']:.3f} "
                      "(random weights: the deploy gate measures a trained model). Variables "
                      f"read by the executed bf16 graph: {variable_reads(bf16)}.",
                  "", memory_line(model["memory"]), ""]
    return "\n".join(lines)


def variable_reads(evidence: dict) -> str:
    ops = evidence.get("ops")
    if ops is None:
        return "not recorded"
    return "yes (ReadVariableOp)" if "ReadVariableOp" in ops else "none (frozen)"


def memory_line(memory: dict) -> str:
    per = "; ".join(f"{p}: " + ", ".join(
        f"{r['loaded_warm_mb']:.0f} MB (raw RSS rise {r.get('peak_rss_mb', float('nan')):.0f}, "
        f"after unload {r['after_unload_mb']:+.0f})" for r in memory[p]) for p in PRECISIONS)
    return ("Live memory a version adds, loaded and warm (one call; gc and malloc_trim before "
            f"reading RSS), loaded twice in turn (a swap), and what stays after unloading: {per}.")


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    result = {"benchmark": "serving_bf16", "host": host_info(), "tensorflow": tf.__version__,
              "shared": True, "load_before": list(os.getloadavg()), "rounds": args.rounds,
              "seconds": args.seconds, "note": args.note}
    if not result["host"]["bf16_native"]:
        result["skipped"] = ("this CPU has neither AVX512_BF16 nor AMX-BF16: ampflow serve "
                             "refuses --compute-precision bfloat16 here (oneDNN would emulate "
                             "it, slower than float32)")
        print(result["skipped"])
    else:
        with tempfile.TemporaryDirectory(prefix="ampflow-bf16-bench-") as work:
            result["models"] = [measure_model(kind, args, Path(work)) for kind in args.models]
    result["load_after"] = list(os.getloadavg())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
