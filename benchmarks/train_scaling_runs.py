"""train_scaling.py's subprocess runs: one fresh process per configuration.

Each configuration of the scaling and loop-vs-fit groups is a fresh `ampflow train` (or
fit-path) process; here are those runs, their medians and ratios, and the telemetry
measurement's process.

Side by side in one run: main interleaves the configurations sweep by sweep, and the
ratios are also given per sweep (the same sweep's configurations ran back to back).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ALL_GROUPS = ("scaling", "loop_vs_fit", "telemetry")
# Worker processes run the benchmark's own CLI (its hidden --*-worker modes).
SCRIPT = str(Path(__file__).with_name("train_scaling.py"))
BEFORE = "2 workers, 1 core each, former all-reduce"
AFTER = "2 workers, 1 core each"
COMPUTE = "2 workers, 1 core each, compute-dtype all-reduce"
INDEPENDENT = "2 independent 1-core processes (no communication)"


def configs(args) -> dict[str, dict]:
    """Configuration name -> how to run it (run_train via the CLI, or the rebuilt fit path)."""
    p = args.policy
    two = {"loop": "run_train", "policy": p, "workers": 2, "pin": 1, "group": "scaling"}
    scaling = {
        "1 worker, 1 core": {"loop": "run_train", "policy": p, "workers": 1, "pin": 1,
                             "group": "scaling"},
        INDEPENDENT: {"loop": "run_train", "policy": p, "workers": 1, "pin": 1,
                      "independent": True, "group": "scaling"},
        BEFORE: {**two, "flags": ["--no-packed-allreduce"]},
        AFTER: two,
    }
    if p.startswith("mixed"):
        scaling[COMPUTE] = {**two, "flags": ["--allreduce-dtype", "compute"]}
    if args.pack_bytes:
        scaling[f"2 workers, 1 core each, packs of {args.pack_bytes} B"] = {
            **two, "flags": ["--allreduce-bytes-per-pack", str(args.pack_bytes)]}
    return {
        **scaling,
        "run_train loop, 1 process": {"loop": "run_train", "policy": p, "workers": 1,
                                      "group": "loop_vs_fit"},
        "keras fit path, 1 process": {"loop": "fit", "policy": p, "workers": 1,
                                      "group": "loop_vs_fit"},
    }


def train_flags(args, data_dir, out, spec) -> list[str]:
    flags = ["--data-dir", data_dir, "--output-dir", str(out), "--model", args.model,
             "--precision", spec["policy"], "--batch-size", str(args.batch_size),
             "--epochs", str(1 + args.epochs), "--seed", "1",
             "--telemetry-every-n-steps", str(spec.get("telemetry", 1))]
    if args.image_size:
        flags += ["--image-size", str(args.image_size)]
    if args.steps:
        flags += ["--steps-per-epoch", str(args.steps)]
    return flags + spec.get("flags", [])


def run(args, data_dir: str, name: str, spec: dict) -> dict:
    if spec.get("independent"):
        return run_independent(args, data_dir, spec)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model"
        flags = train_flags(args, data_dir, out, spec)
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        preexec = None
        if spec["loop"] == "fit":
            cmd = [sys.executable, SCRIPT, "--fit-worker", "--output-dir", str(out),
                   "--model", args.model, "--batch-size", str(args.batch_size),
                   "--epochs", str(args.epochs), "--policy", spec["policy"],
                   "--data-dir", data_dir] + (["--steps", str(args.steps)] if args.steps else []) \
                + (["--image-size", str(args.image_size)] if args.image_size else [])
        elif spec["workers"] > 1:
            cmd = [sys.executable, "-m", "ampflow.cli", "train", *flags,
                   "--workers", str(spec["workers"]), "--cpus-per-worker", str(spec["pin"])]
        else:
            cmd = [sys.executable, "-m", "ampflow.cli", "train", *flags]
            if spec.get("pin"):
                env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1",
                           OMP_NUM_THREADS="1")

                def preexec():
                    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        began = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=env, preexec_fn=preexec)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout:.0f} s"}
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
        meta = json.loads((out / "metadata.json").read_text())
    epochs = [e["examples_per_sec"] for e in meta["epochs"][1:]]
    return {"images_per_sec": statistics.median(epochs), "epoch_images_per_sec": epochs,
            "wall_s": time.monotonic() - began, "xla": meta["xla"]["effective"],
            "global_batch": meta.get("distribution", {}).get("global_batch_size",
                                                             args.batch_size)}


def run_independent(args, data_dir: str, spec: dict) -> dict:
    """Two 1-worker runs at once, each pinned to its own core, with no collectives.

    The sum of their img/s is what two cores of this (shared) host deliver with no
    communication at all: the ceiling of two single-core workers here.
    """
    cores = sorted(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1")
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for i in range(2):
            out = Path(tmp) / f"model{i}"
            outs.append(out)
            core = {cores[i % len(cores)]}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "ampflow.cli", "train",
                 *train_flags(args, data_dir, out, spec)], env=env, text=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                preexec_fn=lambda core=core: os.sched_setaffinity(0, core)))
        errors = [p.communicate(timeout=args.timeout)[1] for p in procs]
        if any(p.returncode for p in procs):
            return {"error": next(e for p, e in zip(procs, errors, strict=True)
                                  if p.returncode).strip().splitlines()[-1][:300]}
        metas = [json.loads((out / "metadata.json").read_text()) for out in outs]
    per_process = [[e["examples_per_sec"] for e in m["epochs"][1:]] for m in metas]
    epochs = [a + b for a, b in zip(*per_process, strict=False)]
    return {"images_per_sec": statistics.median(epochs), "epoch_images_per_sec": epochs,
            "wall_s": time.monotonic() - began, "xla": metas[0]["xla"]["effective"],
            "global_batch": args.batch_size}


def merge(name: str, spec: dict, runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    row = {"config": name, "group": spec["group"], "policy": spec["policy"],
           "workers": spec["workers"], "loop": spec["loop"], "runs": len(ok)}
    if not ok:
        return {**row, "error": runs[-1]["error"]}
    per_epoch = [x for r in ok for x in r["epoch_images_per_sec"]]
    return {**row, "images_per_sec": statistics.median(r["images_per_sec"] for r in ok),
            "range": [min(per_epoch), max(per_epoch)], "xla": ok[0]["xla"],
            "global_batch": ok[0]["global_batch"]}


def ratios(rows: dict[str, dict]) -> dict:
    def ips(name):
        return rows.get(name, {}).get("images_per_sec")

    out = {}
    one = ips("1 worker, 1 core")
    for key, name in (("", AFTER), ("_former_allreduce", BEFORE),
                      ("_compute_dtype_allreduce", COMPUTE)):
        two = ips(name)
        if one and two:
            out["speedup_2_workers" + key] = two / one
            out["scaling_efficiency" + key] = two / (2 * one)
        ceiling = ips(INDEPENDENT)
        if ceiling and two:
            out["vs_independent" + key] = two / ceiling
    if ceiling and one:
        out["independent_vs_2x_one"] = ceiling / (2 * one)
    loop, fit = ips("run_train loop, 1 process"), ips("keras fit path, 1 process")
    if loop and fit:
        out["loop_vs_fit"] = loop / fit
    return out


def paired_ratios(runs: dict[str, list[dict]]) -> dict[str, list[float]]:
    """The same ratios within each sweep (configurations run back to back): less drift."""
    pairs = {"speedup_2_workers": (AFTER, "1 worker, 1 core"),
             "speedup_2_workers_former_allreduce": (BEFORE, "1 worker, 1 core"),
             "speedup_2_workers_compute_dtype_allreduce": (COMPUTE, "1 worker, 1 core"),
             "packed_vs_former_allreduce": (AFTER, BEFORE),
             "independent_vs_one": (INDEPENDENT, "1 worker, 1 core"),
             "packed_vs_independent": (AFTER, INDEPENDENT),
             "loop_vs_fit": ("run_train loop, 1 process", "keras fit path, 1 process")}
    out: dict[str, list[float]] = {}
    for key, (a, b) in pairs.items():
        for x, y in zip(runs.get(a, []), runs.get(b, []), strict=False):
            if "images_per_sec" in x and "images_per_sec" in y:
                out.setdefault(key, []).append(x["images_per_sec"] / y["images_per_sec"])
    return out


def telemetry_cost(args, data_dir: str) -> dict:
    """Telemetry every step vs never (only the per-epoch guard), alternating in one process.

    Epoch by epoch in ONE process: machine-load drift hits both sides alike, unlike separate
    processes.
    """
    cmd = [sys.executable, SCRIPT, "--telemetry-worker", "--data-dir", data_dir,
           "--model", args.model, "--batch-size", str(args.batch_size),
           "--telemetry-epochs", str(args.telemetry_epochs)] \
        + (["--steps", str(args.steps)] if args.steps else []) \
        + (["--image-size", str(args.image_size)] if args.image_size else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    on, off = result["every_step"], result["never"]
    result["cost"] = 1 - statistics.median(on) / statistics.median(off)
    # paired: each "every step" epoch against the "never" epoch right after it
    result["paired_costs"] = [1 - a / b for a, b in zip(on, off, strict=False)]
    result["paired_median_cost"] = statistics.median(result["paired_costs"])
    print(f"telemetry every step vs never: {result['paired_median_cost']:+.1%} (paired median)",
          flush=True)
    return result


def cpu_flags() -> list[str]:
    from train_memory import _cpu_flags as flags

    return flags()
