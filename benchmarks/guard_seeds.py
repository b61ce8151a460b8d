r"""The loss-scale guard on a healthy run: issue 37's user builder, seeds 1–4, histories kept.

Trains `docs/examples/user-model` (`example_models.net:build`) through the real `ampflow train`
(one subprocess per seed) under `mixed_float16` on the digits that `ampflow prepare-data` makes
by default, batch 32 (44 steps an epoch), 6 epochs, and keeps each run's
`loss_scale_history.json` in the result. Per seed it reports the skipped steps (at which step),
the scale's path (start → lowest → end), whether the run finished or which guard rule stopped
it, val_accuracy, and the verdict of the PRE-ISSUE-37 rate rule replayed on the same history
(`old_rate_rule_verdict`): the numbers behind README's guard row and docs/explanation/amp-checks.md.
Which seed skips where depends on the CPU's float16 rounding, so the file is named by host.

    python benchmarks/guard_seeds.py --smoke     # 1 seed, 1 epoch: checks the script
    python benchmarks/guard_seeds.py             # seeds 1-4, 6 epochs → guard_seeds_<host>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import bench_host  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
USER_MODEL = ROOT / "docs" / "examples" / "user-model"
BUILDER = "example_models.net:build"
SEEDS = (1, 2, 3, 4)
EPOCHS = 6
BATCH_SIZE = 32
# The rule train used before issue 37 (components/train/run/telemetry.py at 64de209^, `_check`):
# stop when more than 5 % of the steps after a 50-step warm-up were skipped, judged from 20.
OLD_RULE = {"floor": 1.0, "max_skipped_fraction": 0.05, "warmup_steps": 50, "min_window": 20}


def old_rate_rule_verdict(history: list[dict], rule: dict = OLD_RULE) -> dict:
    """The pre-issue-37 rate rule replayed on a recorded history: where it would have stopped.

    A copy of the old `LossScaleTelemetry._check`, run on each recorded step in order, so the
    histories kept here show what that rule decided on the same runs. Returns
    `{"stopped": False}` or the step, the counts and the old message's fraction.
    """
    base = None  # skipped steps at the end of the warm-up
    for entry in history:
        step, scale, skipped = entry["step"], entry["loss_scale"], entry["skipped_steps"]
        if scale < rule["floor"]:
            return {"stopped": True, "step": step, "why": f"scale {scale:g} under the floor"}
        if step == rule["warmup_steps"] or (base is None and step > rule["warmup_steps"]):
            base = skipped
        if base is None:
            continue
        window = step - rule["warmup_steps"]
        if window < rule["min_window"]:
            continue
        fraction = (skipped - base) / window
        if fraction > rule["max_skipped_fraction"]:
            return {"stopped": True, "step": step, "skipped_after_warmup": skipped - base,
                    "steps_after_warmup": window, "fraction": fraction,
                    "why": f"{fraction:.1%} of the {window} steps after warm-up were skipped"}
    return {"stopped": False}


def skipped_at(history: list[dict]) -> list[int]:
    """The steps that were skipped: where the cumulative skipped count grows."""
    steps, before = [], 0
    for entry in history:
        if entry["skipped_steps"] > before:
            steps.append(entry["step"])
        before = entry["skipped_steps"]
    return steps


def stopping_rule(message: str | None) -> str | None:
    """Which rule of components/train/run/guard.py a `TrainingDivergedError` line names."""
    if not message:
        return None
    for needle, rule in (("non-finite (", "non_finite_loss"), ("below the floor", "floor"),
                         ("in a row", "consecutive_skipped"), ("of the last", "sustained_rate")):
        if needle in message:
            return rule
    return "other"


def summarize_seed(seed: int, history: list[dict], returncode: int, error: str | None,
                   metadata: dict | None) -> dict:
    """One seed's row: skipped steps, the scale's path, the guard's result, the old rule's."""
    scales = [h["loss_scale"] for h in history]
    metrics = (metadata or {}).get("final_metrics", {})
    return {
        "seed": seed,
        "finished": returncode == 0,
        "stopped_by": None if returncode == 0 else stopping_rule(error) or "crash",
        "error": error,
        "steps": history[-1]["step"] if history else 0,
        "skipped_steps": len(skipped_at(history)),
        "skipped_at": skipped_at(history),
        "scale_path": {"start": scales[0], "lowest": min(scales), "end": scales[-1]}
        if scales else None,
        "val_accuracy": metrics.get("val_accuracy"),
        "old_rate_rule": old_rate_rule_verdict(history),
    }


def summarize(seeds: list[dict]) -> dict:
    """The ranges over every seed (what the README row quotes), not a best round."""
    def span(values):
        values = [v for v in values if v is not None]
        return [min(values), max(values)] if values else None

    return {
        "seeds": len(seeds),
        "finished": sum(s["finished"] for s in seeds),
        "skipped_steps_range": span(s["skipped_steps"] for s in seeds),
        "steps_range": span(s["steps"] for s in seeds),
        "lowest_scale_range": span(s["scale_path"]["lowest"] for s in seeds if s["scale_path"]),
        "val_accuracy_range": span(s["val_accuracy"] for s in seeds),
        "old_rule_stops_seeds": [s["seed"] for s in seeds if s["old_rate_rule"]["stopped"]],
    }


def _train(seed: int, epochs: int, data_dir: Path, out: Path) -> dict:
    """One seed through `ampflow train` in its own process; its history, metadata, error line."""
    argv = [sys.executable, "-m", "ampflow.cli", "train", "--data-dir", str(data_dir),
            "--output-dir", str(out), "--model", BUILDER, "--model-path", str(USER_MODEL),
            "--precision", "mixed_float16", "--epochs", str(epochs), "--seed", str(seed),
            "--batch-size", str(BATCH_SIZE)]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = [line for line in done.stderr.splitlines() if line.startswith("ampflow train")]
    history_file, metadata_file = out / "loss_scale_history.json", out / "metadata.json"
    history = json.loads(history_file.read_text()) if history_file.exists() else []
    metadata = json.loads(metadata_file.read_text()) if metadata_file.exists() else None
    row = summarize_seed(seed, history, done.returncode,
                         lines[-1] if done.returncode and lines else None, metadata)
    row["seconds"] = round(time.perf_counter() - start, 1)
    row["xla"] = (metadata or {}).get("xla")
    row["steps_per_epoch"] = (metadata or {}).get("steps_per_epoch")
    row["loss_scale_history"] = history  # the run's loss_scale_history.json, as written
    return row


def _host(capabilities: dict) -> dict:
    import tensorflow as tf

    return {"cpu": capabilities["model_name"], "cores": os.cpu_count(),
            "simd_flags": bench_host.simd_flags(), "cpu_kind": bench_host.cpu_kind(capabilities),
            "fp16_units": capabilities["fp16_units"], "onednn_isa": capabilities["onednn_isa"],
            "device": bench_host.device(), "tensorflow": tf.__version__,
            "python": platform.python_version(), "shared": True}


def host_name(capabilities: dict) -> str:
    """A short name for the file: the CPU family and its widest float unit (epyc_avx2, ...)."""
    model = capabilities.get("model_name", "").lower()
    family = next((f for f in ("epyc", "xeon", "ryzen") if f in model), "cpu")
    flags = set(bench_host.simd_flags())
    widest = "amx" if any(f.startswith("amx") for f in flags) else (
        "avx512" if any(f.startswith("avx512") for f in flags) else "avx2")
    return f"{family}_{widest}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="1 seed, 1 epoch: checks the script")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args()
    seeds, epochs = (args.seeds[:1], 1) if args.smoke else (args.seeds, args.epochs)
    capabilities = bench_host.cpu_capabilities()
    report = {"what": __doc__.split("\n\n")[0], "mode": "smoke" if args.smoke else "full",
              "builder": f"{BUILDER} (docs/examples/user-model)", "precision": "mixed_float16",
              "dataset": "ampflow prepare-data's default (digits)", "batch_size": BATCH_SIZE,
              "epochs": epochs, "old_rate_rule": OLD_RULE, "commit": bench_host.git_commit(),
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "host": _host(capabilities), "load_1_5_15_start": bench_host.load_average()}
    with tempfile.TemporaryDirectory(prefix="ampflow-guard-seeds-") as work:
        data_dir = Path(work) / "data"
        subprocess.run([sys.executable, "-m", "ampflow.cli", "prepare-data", "--output-dir",
                        str(data_dir)], check=True, capture_output=True)
        rows = [_train(s, epochs, data_dir, Path(work) / f"seed{s}") for s in seeds]
    report.update(load_1_5_15_end=bench_host.load_average(),
                  finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  summary=summarize(rows), runs=rows)
    stem = f"guard_seeds_{host_name(capabilities)}" + ("_smoke" if args.smoke else "")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(report))
    print(out / f"{stem}.md")
    return 0


def _scale(path: dict | None) -> str:
    return "–" if path is None else f"{path['start']:g} → {path['lowest']:g} → {path['end']:g}"


def _old(verdict: dict) -> str:
    if not verdict["stopped"]:
        return "finishes"
    if "steps_after_warmup" not in verdict:
        return f"stops at step {verdict['step']}: {verdict['why']}"
    return (f"stops at step {verdict['step']} ({verdict['skipped_after_warmup']} of "
            f"{verdict['steps_after_warmup']} steps after warm-up: {verdict['fraction']:.1%})")


def markdown(report: dict) -> str:
    """The report as a table: one row per seed, then the ranges over every seed."""
    host, summary = report["host"], report["summary"]
    xla = {str((r.get("xla") or {}).get("effective")) for r in report["runs"]}
    lines = [
        f"# Loss-scale guard, issue 37's user builder, seeds ({report['mode']} run)", "",
        f"{report['builder']}, {report['precision']}, {report['dataset']}, batch "
        f"{report['batch_size']}, {report['epochs']} epoch(s), through `ampflow train`. Host: "
        f"{host['cpu']}, {host['cores']} cores, SIMD {', '.join(host['simd_flags'])}, oneDNN "
        f"{host['onednn_isa']}, float16 units: {', '.join(host['fp16_units']) or 'none'}; TF "
        f"{host['tensorflow']}; XLA (train's choice): {', '.join(sorted(xla))}; load "
        f"{report['load_1_5_15_start']} → {report['load_1_5_15_end']} (shared). Commit "
        f"{(report['commit'].get('commit') or '?')[:10]}.", "",
        "The old rate rule is the pre-issue-37 one (more than 5 % of the steps after a 50-step "
        "warm-up skipped, judged from 20), replayed on each run's recorded history.", "",
        "| seed | steps | skipped steps (at step) | scale start → lowest → end | result | "
        "val_accuracy | old rate rule |", "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        result = "finished" if r["finished"] else f"stopped: {r['stopped_by']}"
        acc = "–" if r["val_accuracy"] is None else f"{r['val_accuracy']:.4f}"
        lines.append(f"| {r['seed']} | {r['steps']} | {r['skipped_steps']} "
                     f"({', '.join(map(str, r['skipped_at'])) or 'none'}) | "
                     f"{_scale(r['scale_path'])} | {result} | {acc} | {_old(r['old_rate_rule'])} |")
    lines += ["", f"Every seed: {summary['finished']} of {summary['seeds']} finished; skipped "
              f"steps {_span(summary['skipped_steps_range'], 'd')}, val_accuracy "
              f"{_span(summary['val_accuracy_range'], '.4f')}, lowest scale "
              f"{_span(summary['lowest_scale_range'], 'g')}; the old rule stops "
              f"{_seeds(summary['old_rule_stops_seeds'])}."]
    return "\n".join(lines) + "\n"


def _seeds(seeds: list[int]) -> str:
    if not seeds:
        return "no seed"
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def _span(values: list | None, spec: str) -> str:
    if not values:
        return "–"
    low, high = (format(v, spec) for v in values)
    return low if low == high else f"{low}–{high}"


if __name__ == "__main__":
    sys.exit(main())
