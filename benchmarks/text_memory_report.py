"""The output of benchmarks/text_memory.py: its console lines, JSON and Markdown."""

from __future__ import annotations

import json
from pathlib import Path

GIB = 2**30


def _gib(value) -> str:
    return f"{value / GIB:.2f}" if value is not None else "–"


def _mib(value) -> str:
    return f"{value / 2**20:,.0f}" if value is not None else "–"


def _x(value) -> str:
    return f"{value:.2f}×" if value is not None else "–"


def _walls(report: dict) -> str:
    merged = report.get("merged_runs")
    if not merged:
        return f"Wall time {report['wall_seconds']:.0f} s."
    return ("Merged from runs in parallel on the same host: " + "; ".join(
        f"{r['file']} {r['wall_seconds']:.0f} s (load {r['load_average'][0]:.0f})"
        for r in merged) + ".")


def _fixed_note(c: dict) -> str:
    if c.get("fixed_from"):
        return f" (from {c['fixed_from']})"
    floor = f", floor {_mib(c['floor_bytes'])}" if c.get("floor_bytes") else ""
    return f" (fit b{','.join(map(str, c['fit_batches']))}{floor})"


def _pct(value) -> str:
    return f"{value:.1%}" if value is not None else "–"


def _loo(loo: dict | None) -> str:
    return f"{loo['relative_error']:+.1%} (b{loo['batch']})" if loo else "–"


def print_config(c: dict) -> None:
    head = f"{c['model']:>10} seq {c['sequence_length']:>4} {c['policy']:>15}"
    points = ", ".join(f"b{p['batch']}={_mib(p['allocator_peak_bytes'])}"
                       if "allocator_peak_bytes" in p else f"b{p['batch']}: not run"
                       for p in c["points"])
    print(f"{head}  {points} MiB  fixed {_mib(c.get('fixed_bytes'))} MiB  per example "
          f"{_mib(c.get('per_example_bytes'))} MiB  {c.get('error', '')}", flush=True)


def write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = "text_memory" + (f"_{report['tag']}" if report["tag"] else "")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    (out / f"{stem}.md").write_text("\n".join(_markdown(report)) + "\n")
    print("\n".join(_markdown(report)))


def _markdown(report: dict) -> list[str]:
    cpu, limits = report["cpu"], report["limits_gib"]
    lines = [f"# BERT training memory per policy, and the batch that fits: {report['device']}",
             "", f"{report['loop']}; {report['optimizer']}; {report['data']}; vocabulary "
             f"{report['vocabulary_size']:,}, {report['num_classes']} classes; XLA "
             f"{'on' if report['xla'] else 'off'} for every policy; {report['steps']} steps per "
             "batch, each batch in its own region of one fresh subprocess per (model, sequence, "
             "policy). Peak = the TF allocator's peak above what the process held before the "
             "model was built (`PeakMemory`, components/train/run/memory.py).", "",
             "## Peak per batch, and the fit `peak = fixed + per_example × batch`", "",
             "| model | seq | policy | measured peaks MiB (batch: peak) | fixed MiB | weights+grads"
             "+Adam MiB | per example MiB | × float32 | max residual | leave-one-out error "
             "| activation share (at batch) |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in report["configs"]:
        points = ", ".join(f"{p['batch']}: {_mib(p['allocator_peak_bytes'])}"
                           if "allocator_peak_bytes" in p else f"{p['batch']}: not run"
                           for p in c["points"])
        if "error" in c:
            lines.append(f"| {c['model']} | {c['sequence_length']} | {c['policy']} | {points} "
                         f"| {c['error']}; {'; '.join(c['notes'])} | | | | | | |")
            continue
        loo = c.get("leave_one_out")
        lines.append(
            f"| {c['model']} | {c['sequence_length']} | {c['policy']} | {points} | "
            f"{_mib(c['fixed_bytes'])}{_fixed_note(c)} | {_mib(c['weights_grads_adam_bytes'])} | "
            f"{_mib(c['per_example_bytes'])} | {_x(c.get('per_example_ratio_vs_float32'))} | "
            f"{_pct(c['max_relative_residual'])} | "
            f"{_loo(loo)} | "
            f"{c['activation_share_at_largest']:.0%} ({c['largest_measured_batch']}) |")
    lines += ["", f"## The batch that fits a device limit, and accumulation at an effective "
              f"batch of {report['effective_batch']}", "",
              "From the fit (`floor((limit − fixed) / per_example)`), not run: these batches are "
              "beyond this machine. K = accumulation steps (micro-batch = the largest divisor of "
              "the effective batch that fits); saved = float32's K − the policy's.", "",
              "| model | seq | policy | " + " | ".join(
                  f"fits {x:g} GiB (× f32) | K at {report['effective_batch']} (saved)"
                  for x in limits) + " |",
              "|---|---:|---|" + "---:|---:|" * len(limits)]
    for c in report["configs"]:
        if "error" in c:
            continue
        cells = []
        for x in limits:
            e = c["limits"][str(x)]
            saved = e.get("accumulation_steps_saved")
            cells += [f"{e['batch_that_fits']} ({_x(e.get('batch_ratio_vs_float32'))})",
                      f"{e['accumulation_steps'] or '–'}"
                      + (f" ({saved:+d})" if saved is not None else "")]
        lines.append(f"| {c['model']} | {c['sequence_length']} | {c['policy']} | "
                     + " | ".join(cells) + " |")
    claim = report["claim"]
    lines += ["", f"## The seed's claim: {claim['model']}, sequence {claim['sequence_length']}, "
              f"batch {claim['batch_size']}", "",
              f"Seed: {claim['float32_gb']:g} GB in float32 → {claim['amp_gb']:g} GB with AMP "
              f"({claim['claim_ratio']:.2f}×). Predicted here from the fit (GB = 10⁹ bytes):", ""]
    for policy, p in claim["predicted"].items():
        lines.append(f"- {policy}: {p['gb']:.1f} GB ({_x(p['ratio_vs_float32'])} float32)")
    lines += ["", f"Host: {cpu['model_name']}, {report['cores']} cores (load average "
              f"{', '.join(f'{x:.1f}' for x in report['load_average'])} at the end); bf16 "
              f"units: {', '.join(cpu['bf16_units']) or 'none'}; fp16 units: "
              f"{', '.join(cpu['fp16_units']) or 'none'}; oneDNN ISA: {cpu['onednn_isa']}; "
              f"flags: {' '.join(cpu['flags'])}. TensorFlow {report['versions']['tensorflow']}, "
              f"Keras {report['versions']['keras']}. {_walls(report)} "
              f"Every worker ran under a {report['cap_gib']} GiB RSS guard.", ""]
    for c in report["configs"]:
        extra = [n for n in c["notes"] if not n.startswith("worker's largest")]
        extra += [f"batch {p['batch']}: {p.get('not_run') or p.get('out_of_memory')}"
                  for p in c["points"] if "allocator_peak_bytes" not in p]
        if extra:
            lines.append(f"- {c['model']} {c['sequence_length']} {c['policy']}: "
                         + "; ".join(extra))
    return lines

