"""train_scaling.py's reports: each measurement as JSON and Markdown under --out."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from train_scaling_runs import ALL_GROUPS


def write_ci(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    size = f"_{report['image_size']}" if report["image_size"] else ""
    stem = out / f"loop_vs_fit_ci_{report['model']}{size}_{report['policy']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    low, high = report["ci95"]
    med = {k: statistics.median(v) for k, v in report["samples"].items()}
    text = (
        f"# The loop vs Keras fit: {report['model']}"
        f"{' at ' + str(report['image_size']) + '²' if report['image_size'] else ''}, "
        f"{report['policy']}, XLA {'on' if report['xla'] else 'off'}, batch {report['batch']}\n\n"
        f"One process, twin models, {report['pairs']} alternating pairs (ABBA) of one epoch of "
        f"{report['steps_per_chunk']} steps each, after a warm-up epoch each; img/s from the "
        f"epoch log (training steps only). {report['cpus']} cores shared with other jobs "
        f"(load average {report['load_average'][0]:.1f}). CPU flags: "
        f"{' '.join(report['cpu_flags'])}.\n\n"
        f"- loop / fit: **{report['ratio']:.3f}×** (geometric mean of the pairs), 95 % interval "
        + (f"{low:.3f}–{high:.3f}" if low else "n/a") + "\n"
        f"- median img/s: loop {med['loop']:.1f}, fit {med['fit']:.1f}\n"
        f"- per pair: {', '.join(f'{r:.2f}' for r in report['ratios'])}\n")
    stem.with_suffix(".md").write_text(text)
    print(text)


def write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_scaling_{report['model']}" + (
        f"_{report['image_size']}" if report["image_size"] else "") + (
        "" if report["groups"] == list(ALL_GROUPS) else "_" + "_".join(report["groups"]))
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    size = f" at {report['image_size']}²" if report["image_size"] else ""
    lines = [f"# Training loop throughput: {report['model']}{size}, batch "
             f"{report['per_replica_batch']} per replica, {report['cpus']} CPUs", "",
             f"{report['timed_epochs']} timed epochs after a warm-up epoch, "
             f"{report['repeats']} interleaved sweep(s); images/s are global (all workers). "
             f"{report['note']}.", "",
             "| group | configuration | policy | XLA | global batch | img/s (median) | "
             "range over epochs |", "|---|---|---|---|---:|---:|---:|"]
    for r in report["rows"]:
        if "error" in r:
            lines.append(f"| {r['group']} | {r['config']} | {r['policy']} | | | {r['error']} | |")
            continue
        lo, hi = r["range"]
        lines.append(f"| {r['group']} | {r['config']} | {r['policy']} | "
                     f"{'on' if r['xla'] else 'off'} | {r['global_batch']} | "
                     f"{r['images_per_sec']:.1f} | {lo:.1f}–{hi:.1f} |")
    ratios = report["ratios"]
    lines.append("")
    sweeps = report.get("per_sweep", {})

    def spread(key):
        values = sweeps.get(key) or []
        return (f" (per sweep: {', '.join(f'{v:.2f}' for v in values)})" if values else "")

    for key, what in (("", "packed all-reduce (now the default)"),
                      ("_former_allreduce", "former all-reduce (--no-packed-allreduce)"),
                      ("_compute_dtype_allreduce", "packed, --allreduce-dtype compute")):
        if "speedup_2_workers" + key in ratios:
            lines.append(f"- 2 workers vs 1 (one core each), {what}: "
                         f"{ratios['speedup_2_workers' + key]:.2f}×, scaling efficiency "
                         f"{ratios['scaling_efficiency' + key]:.0%}"
                         f"{spread('speedup_2_workers' + key)}.")
    if "independent_vs_2x_one" in ratios:
        lines.append(
            f"- The host's own ceiling: two independent 1-core processes at once (no "
            f"communication) deliver {ratios['independent_vs_2x_one']:.0%} of 2 × one process "
            f"alone (per sweep, their sum / one alone: "
            f"{', '.join(f'{v:.2f}' for v in sweeps.get('independent_vs_one', []))}); "
            "against that ceiling the 2 workers reach: " + ", ".join(
                f"{what} {ratios['vs_independent' + key]:.0%}" for key, what in (
                    ("", "packed"), ("_former_allreduce", "former"),
                    ("_compute_dtype_allreduce", "compute-dtype"))
                if "vs_independent" + key in ratios) + ".")
    if sweeps.get("packed_vs_former_allreduce"):
        lines.append(f"- packed vs former all-reduce, 2 workers, same sweep: per sweep "
                     f"{', '.join(f'{v:.2f}' for v in sweeps['packed_vs_former_allreduce'])}×.")
    if "loop_vs_fit" in ratios:
        lines.append(f"- run_train's loop vs the Keras fit path, one process: "
                     f"{ratios['loop_vs_fit']:.2f}×{spread('loop_vs_fit')}.")
    tel = report.get("telemetry") or {}
    if "paired_median_cost" in tel:
        costs = tel["paired_costs"]
        lines.append(
            f"- Loss-scale telemetry (mixed_float16, XLA {'on' if tel['xla'] else 'off'}, one "
            f"process, epochs alternating) recorded every step vs never: "
            f"{tel['paired_median_cost']:+.1%} of the throughput (paired median over "
            f"{len(costs)} epoch pairs of {tel['steps_per_epoch']} steps; range "
            f"{min(costs):+.1%} to {max(costs):+.1%}; every step: "
            f"{statistics.median(tel['every_step']):.0f} img/s, never: "
            f"{statistics.median(tel['never']):.0f} img/s). Timed alone, one recorded step "
            f"costs the host {tel['record_us']:.0f} µs = {tel['record_fraction_of_step']:.2%} "
            f"of a {tel['step_ms']:.1f} ms step.")
    elif "error" in tel:
        lines.append(f"- Telemetry measurement failed: {tel['error']}")
    if report.get("cpu_flags"):
        lines.append(f"- Host: {report['cpus']} cores, load average "
                     f"{report['load_average'][0]:.1f} at the end; CPU flags: "
                     f"{' '.join(report['cpu_flags'])}.")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_profile(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    size = f"_{report['image_size']}" if report["image_size"] else ""
    stem = out / f"train_scaling_profile_{report['model']}{size}_{report['policy']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    one, twos = report["one_worker"]["ms"], [w["ms"] for w in report["two_workers"]]
    def cell(values: dict, name: str) -> str:
        return f"{values[name]:.2f}" if name in values else "—"

    rows = [f"| {name} | {cell(one, name)} | " + " | ".join(cell(w, name) for w in twos) + " |"
            for name in twos[0]]
    two = {k: statistics.fmean(w[k] for w in twos) for k in twos[0]}
    # The 1-worker step is the same loop; with 4 steps per call, its own 4-steps-per-call time.
    efficiency = {k: one.get(k if k.endswith("4_per_call") else "step_packed",
                             one["step_packed"]) / two[k]
                  for k in ("step_former", "step_packed", "step_packed_compute",
                            "step_packed_4_per_call") if k in two}
    lines = [
        f"# Where a 2-worker step goes: {report['model']}"
        f"{' at ' + str(report['image_size']) + '²' if report['image_size'] else ''}, "
        f"{report['policy']}, batch {report['per_replica_batch']} per replica", "",
        f"ms per call, the median of {report['rounds']} alternating rounds of "
        f"{report['steps_per_round']} calls (benchmarks/train_scaling.py --profile-step). "
        "The 1-worker column is one process pinned to one core (no TF_CONFIG: its "
        "collectives are no-ops, and its one step is the step_packed row); workers 0 and 1 "
        "are two processes pinned to one core each, "
        f"MultiWorkerMirroredStrategy over loopback. {report['cpus']} cores shared with other "
        f"jobs (load average {report['load_average'][0]:.1f}); CPU flags: "
        f"{' '.join(report['cpu_flags'])}.", "",
        "| piece | 1 worker | " + " | ".join(f"worker {i}" for i in range(len(twos))) + " |",
        "|---|---:|" + "---:|" * len(twos), *rows, "",
        f"- 2-worker step, former all-reduce: {two['step_former']:.2f} ms; packed: "
        f"{two['step_packed']:.2f} ms ({two['step_former'] / two['step_packed']:.2f}× faster)"
        + (f"; packed in the compute dtype: {two['step_packed_compute']:.2f} ms"
           if "step_packed_compute" in two else "")
        + (f"; 4 packed steps per call: {two['step_packed_4_per_call']:.2f} ms a step"
           if "step_packed_4_per_call" in two else "") + ".",
        "- Scaling efficiency these imply (1-worker step / 2-worker step, the same "
        "per-replica batch): " + ", ".join(f"{k.removeprefix('step_')} {v:.0%}"
                                           for k, v in efficiency.items()) + ".",
        f"- Of the packed 2-worker step: forward/backward {two['forward_backward']:.2f} ms "
        f"(1 worker: {one['forward_backward']:.2f}), input {two['input']:.2f} ms "
        f"(1 worker: {one['input']:.2f}: each worker makes the whole global batch and keeps "
        f"its share), one gradient + statistics all-reduce "
        f"{two['grad_and_stats_all_reduce_float32']:.2f} ms; a scalar all-reduce alone costs "
        f"{two['scalar_all_reduce']:.2f} ms (the per-collective latency).",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
