r"""Fidelity at model scale: AMP vs float32, and every TFLite variant, for three models, one run.

For each model (small_cnn, resnet50, mobilenet_v2) on the offline 28×28 MNIST (`ampflow_mnist`,
4,000 train / 1,000 test images) this runs the pipeline's own steps, on the same data and seed:

1. `run_train` under float32 (the baseline) and under each AMP policy (mixed_bfloat16,
   mixed_float16), with the step's own precision/XLA handling (XLA on for float16 on a CPU);
2. `run_evaluate` on each AMP model with the float32-trained baseline: AMP vs its float32 twin
   (argmax agreement, max relative logit diff and its bound, accuracy drop) and AMP-trained vs
   float32-trained accuracy (delta, paired standard error, the gate's bound);
3. `run_export` (the float32 twin as a SavedModel) and `run_convert` (all four TFLite variants:
   accuracy, agreement with the SavedModel, size, single-image latency under XNNPACK, and the
   full_int8 speedup over float32);
4. serving: the export behind ampflow's gRPC server (TF Serving's API), answers compared with
   the SavedModel, single-image Predict latency.

Each model runs in its own subprocess (isolation, a per-model timeout); results are written as
JSON + Markdown (`fidelity.json`, `fidelity.md`) with the wall time of each phase. A gate that
fails is a result, not a crash: it is reported in the table (export is then forced, and marked).

    python benchmarks/fidelity.py --smoke            # minutes: a few steps per model
    python benchmarks/fidelity.py --out benchmarks/results   # the full run (long on 2 CPUs)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODELS = ("small_cnn", "resnet50", "mobilenet_v2")
POLICIES = ("mixed_bfloat16", "mixed_float16")
VARIANTS = ("float32", "float16", "dynamic_range", "full_int8")
# Full run: enough steps that BatchNormalization's moving statistics (momentum 0.99, see
# src/ampflow/modeling/models.py) describe the data and the nets train; small_cnn has no BN.
FULL_EPOCHS = {"small_cnn": 6, "resnet50": 6, "mobilenet_v2": 12}
SMOKE = {"epochs": 1, "steps_per_epoch": 3, "test_limit": 200, "latency_runs": 10,
         "representative_size": 32}


def main() -> int:
    args = _parse()
    if args.worker:
        result = _worker(args)
        Path(args.result_file).write_text(json.dumps(result, indent=2))
        return 0
    start = time.perf_counter()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ampflow-fidelity-"))
    data_dir = _prepare(workdir)
    results = [_run_model(args, model, data_dir, workdir) for model in args.models]
    report = {
        "benchmark": "fidelity",
        "mode": "smoke" if args.smoke else "full",
        "dataset": "ampflow_mnist (4,000 train / 1,000 test, 28x28x1)",
        "image_size": args.image_size,
        "batch_size": args.batch_size,
        "epochs": {m: _epochs(args, m) for m in args.models},
        "steps_per_epoch": args.steps_per_epoch,
        "test_limit": args.test_limit,
        "tflite_threads": args.tflite_threads,
        "policies": list(args.policies),
        "environment": _environment(),
        "wall_seconds": time.perf_counter() - start,
        "models": results,
    }
    _write(report, Path(args.out), args.smoke)
    if not args.workdir and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all("error" not in m for m in results) else 1


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="a few steps per model, 200 test images: checks the script, not the models")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--image-size", type=int, default=32,
                   help="in-model resize for resnet50/mobilenet_v2 (keras.applications' minimum)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=None,
                   help=f"epochs per model (default: full {FULL_EPOCHS}, smoke 1)")
    p.add_argument("--steps-per-epoch", type=int, default=None,
                   help="cap steps per epoch (default: the whole split; smoke 3)")
    p.add_argument("--test-limit", type=int, default=None,
                   help="evaluate/convert on the first N test images (default: all 1,000)")
    p.add_argument("--latency-runs", type=int, default=100, help="timed TFLite invocations")
    p.add_argument("--representative-size", type=int, default=200,
                   help="calibration images for full_int8")
    p.add_argument("--tflite-threads", type=int, default=1,
                   help="interpreter threads for the TFLite timing (1: steadier on shared CPUs)")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per model")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--workdir", default=None, help="keep every artifact here (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="do not delete the temp workdir")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smoke:
        apply_smoke(args, SMOKE)
    return args


def apply_smoke(args, smoke: dict) -> None:
    """--smoke's sizes where the user set none (steps, test texts) or a larger one (runs)."""
    args.steps_per_epoch = args.steps_per_epoch or smoke["steps_per_epoch"]
    args.test_limit = args.test_limit or smoke["test_limit"]
    args.latency_runs = min(args.latency_runs, smoke["latency_runs"])
    args.representative_size = min(args.representative_size, smoke["representative_size"])


def _epochs(args, model: str) -> int:
    if args.epochs:
        return args.epochs
    return SMOKE["epochs"] if args.smoke else FULL_EPOCHS[model]


def _prepare(workdir: Path) -> Path:
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    return run_prepare_data(PrepareDataConfig(output_dir=workdir / "data",
                                              dataset="ampflow_mnist")).output_dir


def _run_model(args, model: str, data_dir: Path, workdir: Path) -> dict:
    """Run one model's whole sweep in a subprocess; an error becomes the model's row."""
    result_file = workdir / f"{model}.json"
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--data-dir", str(data_dir),
           "--workdir", str(workdir / model), "--result-file", str(result_file),
           "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
           "--epochs", str(_epochs(args, model)), "--latency-runs", str(args.latency_runs),
           "--representative-size", str(args.representative_size),
           "--tflite-threads", str(args.tflite_threads), "--policies", *args.policies]
    for flag, value in (("--steps-per-epoch", args.steps_per_epoch),
                        ("--test-limit", args.test_limit)):
        if value:
            cmd += [flag, str(value)]
    print(f"[fidelity] {model}: {' '.join(cmd[2:])}", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, timeout=args.timeout, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    except subprocess.TimeoutExpired:
        return {"model": model, "error": f"timed out after {args.timeout:.0f} s"}
    log = workdir / f"{model}.log"
    log.write_text(done.stdout)
    if done.returncode != 0 or not result_file.is_file():
        tail = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
        return {"model": model, "error": f"exit {done.returncode}: {tail[0][:300]}",
                "log": str(log)}
    result = json.loads(result_file.read_text())
    result["wall_seconds"] = time.perf_counter() - start
    print(f"[fidelity] {model}: done in {result['wall_seconds']:.0f} s", flush=True)
    return result


def _worker(args) -> dict:
    """Baseline + each AMP policy: train, evaluate, export, convert; return the model's rows."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    work = Path(args.workdir)
    timings: dict[str, float] = {}
    baseline_dir = _timed(timings, "train float32", lambda: _train(args, "float32", work))
    rows = []
    for policy in args.policies:
        model_dir = _timed(timings, f"train {policy}", lambda p=policy: _train(args, p, work))
        row = {"policy": policy}
        row.update(_timed(timings, f"evaluate {policy}",
                          lambda m=model_dir, p=policy: _evaluate(args, m, baseline_dir, work, p)))
        export_dir, forced = _timed(timings, f"export {policy}",
                                    lambda m=model_dir, p=policy, r=row: _export(
                                        args, m, work, p, r["parity_gate_passed"]))
        row["export_forced"] = forced
        row["tflite"] = _timed(timings, f"convert {policy}",
                               lambda e=export_dir, p=policy: _convert(args, e, work, p))
        row["serving"] = _timed(timings, f"serve {policy}", lambda e=export_dir: _serve(args, e))
        rows.append(row)
    return {"model": args.model, "baseline": _train_summary(baseline_dir), "rows": rows,
            "phase_seconds": timings}


def _timed(timings: dict, name: str, fn):
    start = time.perf_counter()
    try:
        return fn()
    finally:
        timings[name] = time.perf_counter() - start


def _train(args, policy: str, work: Path) -> Path:
    from ampflow.components.train import TrainConfig, run_train

    return run_train(TrainConfig(
        data_dir=Path(args.data_dir), output_dir=work / f"model-{policy}", model=args.model,
        image_size=None if args.model == "small_cnn" else args.image_size, precision=policy,
        epochs=args.epochs, batch_size=args.batch_size, steps_per_epoch=args.steps_per_epoch,
    )).output_dir


def _train_summary(model_dir: Path) -> dict:
    meta = json.loads((model_dir / "metadata.json").read_text())
    return {"policy": meta["precision"]["policy"], "xla": meta.get("xla", {}).get("effective"),
            "train_images_per_sec": meta.get("throughput_examples_per_sec"),
            "train_seconds": meta.get("train_seconds"),
            "steps_per_epoch": meta.get("steps_per_epoch"), "epochs": len(meta.get("epochs", [])),
            "final_train_accuracy": meta.get("final_metrics", {}).get("accuracy")}


def _evaluate(args, model_dir: Path, baseline_dir: Path, work: Path, policy: str) -> dict:
    from ampflow.components.evaluate_parity import EvaluateConfig, run_evaluate

    result = run_evaluate(EvaluateConfig(
        model_dir=model_dir, data_dir=Path(args.data_dir), output_dir=work / f"eval-{policy}",
        baseline_model_dir=baseline_dir, limit=args.test_limit, fail_on_gate=False))
    m = result.metrics
    bound = next(c["threshold"] for c in m["gate"]["checks"]
                 if c["name"] == "baseline_accuracy_delta_points")
    return {
        "train": _train_summary(model_dir),
        "num_test_images": m["num_examples"],
        "amp_accuracy": m["amp_accuracy"],
        "twin_accuracy": m["fp32_twin_accuracy"],
        "twin_agreement": m["argmax_agreement"],
        "max_relative_logit_diff": m["max_relative_logit_diff"],
        "relative_logit_bound": m["context"]["relative_logit_bound"],
        "max_abs_logit_diff": m["max_abs_logit_diff"],
        "baseline_accuracy": m["baseline_accuracy"],
        "baseline_delta_points": m["baseline_accuracy_delta_points"],
        "baseline_delta_stderr_points": m["baseline_delta_stderr_points"],
        "baseline_drop_bound_points": -bound,
        "training_speedup": m["training_speedup"],
        "parity_gate_passed": result.passed,
        "failed_checks": [c["name"] for c in m["gate"]["checks"] if not c["passed"]],
    }


def _export(args, model_dir: Path, work: Path, policy: str, gate_passed: bool):
    from ampflow.components.export_savedmodel import ExportConfig, run_export

    result = run_export(ExportConfig(
        model_dir=model_dir, data_dir=Path(args.data_dir), export_base=work / f"export-{policy}",
        eval_dir=work / f"eval-{policy}", force=not gate_passed, num_parity_images=64))
    return result.version_dir, result.forced


def _convert(args, export_dir: Path, work: Path, policy: str) -> dict:
    from ampflow.components.convert_tflite import ConvertConfig, run_convert
    from ampflow.errors import GateFailedError

    out = work / f"tflite-{policy}"
    try:
        run_convert(ConvertConfig(
            saved_model_dir=export_dir, data_dir=Path(args.data_dir), output_dir=out,
            test_limit=args.test_limit, latency_runs=args.latency_runs,
            representative_size=args.representative_size, num_threads=args.tflite_threads))
    except GateFailedError:
        pass  # the report is published before the gate raises; a failed variant is a result
    report = json.loads((out / "report.json").read_text())
    variants = {}
    for name, v in report["variants"].items():
        variants[name] = {
            "accuracy": v["accuracy"], "agreement": v["agreement"],
            "max_abs_prob_diff": v["max_abs_prob_diff"], "size_bytes": v["size_bytes"],
            "latency_ms_median": v["timing"]["latency_ms_median"],
            "latency_ms_p95": v["timing"]["latency_ms_p95"],
            "edge_max_abs_diff": v["edge"].get("max_abs_diff"), "passed": v["passed"],
        }
    f32, i8 = variants.get("float32"), variants.get("full_int8")
    speedup = (f32["latency_ms_median"] / i8["latency_ms_median"]
               if f32 and i8 and i8["latency_ms_median"] else None)
    return {"saved_model_accuracy": report["saved_model"]["accuracy"],
            "saved_model_latency_ms": report["saved_model"]["timing"]["latency_ms_median"],
            "variants": variants, "int8_speedup_over_float32": speedup}


def _serve(args, version_dir: Path) -> dict:
    """Serve the export over gRPC (ampflow's TF Serving-compatible server): answers and latency.

    The answers must equal the SavedModel's; latency is one image per Predict on loopback.
    """
    import numpy as np

    from ampflow.components.convert_tflite.checks import SavedModelReference
    from ampflow.data import load_arrays
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server

    images, _ = load_arrays(Path(args.data_dir), "test", limit=32)
    images = images.astype(np.float32)
    expected = SavedModelReference(version_dir, "serving_default").predict(images, 32)
    name = version_dir.parent.name
    server = start_local_server(ServerConfig(models=(ModelConfig(name, version_dir.parent),),
                                             host="127.0.0.1", port=0, grace_s=1.0))
    try:
        client = PredictionClient(server.address, timeout_s=120.0)
        try:
            client.wait_until_available(name, timeout=300)
            served = client.predict(name, images).outputs["probabilities"]
            latencies = []
            for i in range(args.latency_runs):
                start = time.perf_counter()
                client.predict(name, images[i % len(images)][None])
                latencies.append(1000 * (time.perf_counter() - start))
        finally:
            client.close()
    finally:
        server.stop(0.5)
    return {"max_abs_prob_diff_vs_saved_model": float(np.max(np.abs(served - expected))),
            "latency_ms_median": float(np.median(latencies)),
            "latency_ms_p95": float(np.percentile(latencies, 95)), "requests": len(latencies)}


def _environment() -> dict:
    import tensorflow as tf

    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {"tensorflow": tf.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "cpu_bf16": sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"}),
            "cpu_fp16": sorted(flags & {"avx512_fp16", "amx_fp16"})}


def _fmt(value, spec: str, missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


def _write(report: dict, out: Path, smoke: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = "fidelity_smoke" if smoke else "fidelity"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    env = report["environment"]
    lines = [
        f"# Fidelity: AMP vs float32 and TFLite variants ({report['mode']} run)", "",
        f"{report['dataset']}; resnet50/mobilenet_v2 resized to {report['image_size']}² inside "
        f"the model; batch {report['batch_size']}; epochs {report['epochs']}; "
        f"test images per row: see n. TF {env['tensorflow']}, {env['cpu_count']} CPUs, "
        f"bf16 CPU units: {', '.join(env['cpu_bf16']) or 'none (bfloat16 runs emulated)'}. "
        f"Whole run: {report['wall_seconds'] / 60:.1f} min.", "",
        *([f"**Smoke run**: {report['steps_per_epoch']} steps per model, so the models are "
           "untrained (BatchNormalization's moving statistics still at their initial values: "
           "near-constant predictions). The numbers check the script end to end; they say "
           "nothing about fidelity.", ""] if report["mode"] == "smoke" else []),
        "## AMP vs float32", "",
        "Twin = the AMP model's weights run under float32 (inference rounding only); baseline = a "
        "model trained under float32 on the same data and seed (training damage too). Bound = "
        "the gate's relative logit bound; SE = paired standard error of the accuracy delta.", "",
        "| model | policy | n | AMP acc | twin agreement | max rel. logit diff (bound) | "
        "float32-trained acc | AMP − float32 (SE) | train img/s AMP / f32 | gate |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in report["models"]:
        if "error" in m:
            lines.append(f"| {m['model']} | – | | | | | | | | error: {m['error']} |")
            continue
        base = m["baseline"]
        for r in m["rows"]:
            gate = "passed" if r["parity_gate_passed"] else "FAILED: " + ", ".join(
                r["failed_checks"])
            lines.append(
                f"| {m['model']} | {r['policy']} | {r['num_test_images']} | "
                f"{r['amp_accuracy']:.2%} | {r['twin_agreement']:.2%} | "
                f"{r['max_relative_logit_diff']:.1e} ({r['relative_logit_bound']:.1e}) | "
                f"{r['baseline_accuracy']:.2%} | {r['baseline_delta_points']:+.2f} pt "
                f"({r['baseline_delta_stderr_points']:.2f}) | "
                f"{_fmt(r['train']['train_images_per_sec'], '.1f')} / "
                f"{_fmt(base['train_images_per_sec'], '.1f')} | {gate} |")
    lines += [
        "", "## TFLite variants (from the float32 twin of each AMP model)", "",
        f"Agreement = argmax agreement with the SavedModel; latency = one image, `invoke()` "
        f"median, XNNPACK, {report['tflite_threads']} thread(s); int8 speedup = float32 latency "
        "/ full_int8 latency.", "",
        "| model | policy | variant | accuracy | agreement | size KiB | latency ms | gate |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for m in report["models"]:
        for r in m.get("rows", []):
            t = r["tflite"]
            for name in [v for v in VARIANTS if v in t["variants"]]:
                v = t["variants"][name]
                lines.append(f"| {m['model']} | {r['policy']} | {name} | {v['accuracy']:.2%} | "
                             f"{v['agreement']:.2%} | {v['size_bytes'] / 1024:.0f} | "
                             f"{v['latency_ms_median']:.2f} | "
                             f"{'passed' if v['passed'] else 'FAILED'} |")
            lines.append(f"| {m['model']} | {r['policy']} | **int8 speedup** | | | | "
                         f"**{_fmt(t['int8_speedup_over_float32'], '.2f')}×** | |")
    lines += [
        "", "## Served over gRPC (ampflow's TF Serving-compatible server, loopback)", "",
        "| model | policy | max \\|Δp\\| vs SavedModel | p50 ms | p95 ms |",
        "|---|---|---:|---:|---:|",
    ]
    for m in report["models"]:
        for r in m.get("rows", []):
            v = r["serving"]
            lines.append(f"| {m['model']} | {r['policy']} | "
                         f"{v['max_abs_prob_diff_vs_saved_model']:.1e} | "
                         f"{v['latency_ms_median']:.2f} | {v['latency_ms_p95']:.2f} |")
    lines += ["", "## Wall time per phase (s)", ""]
    for m in report["models"]:
        if "phase_seconds" in m:
            phases = ", ".join(f"{k} {v:.0f}" for k, v in m["phase_seconds"].items())
            lines.append(f"- {m['model']} ({m['wall_seconds']:.0f} s): {phases}")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
