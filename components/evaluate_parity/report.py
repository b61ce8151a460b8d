"""The human side of the evaluation: PNG plots and a Markdown report (later a KFP Markdown).

Plots use matplotlib's Agg backend: no display exists in a pipeline container. Every plot is
written even when it has little to show (a bfloat16 model has no loss scale), so the set of
files an evaluation produces never depends on the model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.throughput import throughput_unit
from ampflow.components.evaluate_parity.training import speedup_text

PER_CLASS_PNG = "per_class_accuracy.png"
LOGIT_DIFF_PNG = "logit_diff_histogram.png"
LOSS_SCALE_PNG = "loss_scale_history.png"
CONFUSION_PNG = "confusion_matrix.png"
REFERENCE_SERIES = "fp32_twin"  # what the per-class differences are measured against
_ANNOTATE_MAX_CLASSES = 30  # beyond this, cell counts and tick labels would be unreadable


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def per_class_figure(class_names: list[str], series: dict[str, np.ndarray]):
    """Per-class accuracy from 0 to 1 (bars), and each model minus the float32 twin (points).

    The accuracy axis starts at 0, so bar heights compare honestly; the differences, which a
    0-to-1 axis cannot show, get a panel of their own with its own scale in points.
    """
    plt = _pyplot()
    width_in = min(14.0, max(6.0, 0.25 * len(class_names) * len(series) + 2.0))
    fig, (ax, diff_ax) = plt.subplots(2, 1, figsize=(width_in, 5.2), sharex=True,
                                      height_ratios=(2.2, 1), layout="constrained")
    width = 0.8 / max(1, len(series))
    positions = np.arange(len(class_names))
    colors = {}
    for i, (label, values) in enumerate(series.items()):
        bars = ax.bar(positions + i * width, np.nan_to_num(values, nan=0.0), width, label=label)
        colors[label] = bars.patches[0].get_facecolor() if bars.patches else "tab:gray"
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("top-1 accuracy (recall)")
    ax.set_title("Per-class accuracy")
    reference = series.get(REFERENCE_SERIES)
    diffs = {label: 100.0 * (np.asarray(values, float) - np.asarray(reference, float))
             for label, values in series.items()
             if reference is not None and label != REFERENCE_SERIES}
    for i, label in enumerate(series):
        if label in diffs:  # below its own bar of the top panel
            diff_ax.bar(positions + i * width, np.nan_to_num(diffs[label], nan=0.0), width,
                        color=colors[label])
    diff_ax.axhline(0.0, color="black", linewidth=0.8)
    largest = max((float(np.nanmax(np.abs(d), initial=0.0)) for d in diffs.values()),
                  default=0.0)
    if diffs and largest == 0.0:
        diff_ax.text(0.5, 0.75, "the same accuracy on every class", ha="center",
                     transform=diff_ax.transAxes, fontsize="small")
    limit = max(1.0, 1.2 * largest) if math.isfinite(largest) else 1.0
    diff_ax.set_ylim(-limit, limit)
    diff_ax.set_ylabel(f"minus {REFERENCE_SERIES}\n(points)")
    diff_ax.set_xticks(positions + width * (len(series) - 1) / 2,
                       _tick_labels(class_names), rotation=45)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside upper right", fontsize="small",
               ncols=len(series))
    return fig


def plot_per_class_accuracy(
    path: Path, class_names: list[str], series: dict[str, np.ndarray]
) -> Path:
    """Write `per_class_figure` as a PNG."""
    return _save(per_class_figure(class_names, series), path)


def plot_logit_diff_histogram(path: Path, abs_diff: np.ndarray, bound: float | None) -> Path:
    """Histogram of |logit(AMP) - logit(FP32 twin)| on a log x-axis (zeros shown at the floor)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.6), layout="constrained")
    if abs_diff.size:
        floor = 1e-8
        values = np.maximum(abs_diff, floor)
        bins = np.logspace(math.log10(floor), math.log10(max(values.max(), 10 * floor)) + 0.1, 50)
        ax.hist(values, bins=bins, color="tab:blue")
        ax.set_xscale("log")
        if bound is not None and math.isfinite(bound):
            ax.axvline(bound, color="tab:red", linestyle="--", label="gate bound (absolute)")
            fig.legend(loc="outside upper right", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no finite logit differences", ha="center", transform=ax.transAxes)
    ax.set_xlabel("|logit difference|")
    ax.set_ylabel("count (examples × classes)")
    ax.set_title("AMP vs float32 twin: |logit difference|")
    return _save(fig, path)


def loss_scale_figure(history: list[dict[str, Any]], policy: str):
    """The dynamic loss scale (left axis) and cumulative skipped steps (right axis) over steps.

    One legend for both lines, outside the plotting area, so it never covers either line.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.8), layout="constrained")
    if history:
        steps = [h["step"] for h in history]
        ax.step(steps, [h["loss_scale"] for h in history], where="post", label="loss scale")
        ax.set_yscale("log", base=2)
        ax.set_xlabel("training step")
        ax.set_ylabel("loss scale")
        skipped = [h.get("skipped_steps", 0) for h in history]
        twin = ax.twinx()
        twin.plot(steps, skipped, color="tab:red", label="skipped steps (cumulative)")
        twin.set_ylabel("skipped steps")
        twin.set_ylim(bottom=0)
        handles, labels = ax.get_legend_handles_labels()
        more_handles, more_labels = twin.get_legend_handles_labels()
        fig.legend(handles + more_handles, labels + more_labels, loc="outside upper center",
                   fontsize="small", ncols=2)
    else:
        ax.text(0.5, 0.5, f"no loss scaling under {policy}\n(only float16 needs it)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    ax.set_title("Loss-scale history (training)")
    return fig


def plot_loss_scale_history(path: Path, history: list[dict[str, Any]], policy: str) -> Path:
    """Write `loss_scale_figure` (from loss_scale_history.json) as a PNG."""
    return _save(loss_scale_figure(history, policy), path)


def confusion_figure(class_names: list[str], matrix: np.ndarray, twin_matrix: np.ndarray):
    """The AMP model's confusion matrix (rows: true class, columns: predicted), with counts.

    Cells where the float32 twin's count differs are outlined: with perfect inference parity
    there are none.
    """
    plt = _pyplot()
    matrix, twin_matrix = np.asarray(matrix), np.asarray(twin_matrix)
    n = len(class_names)
    side = min(12.0, max(4.5, 0.45 * n + 2.0))
    fig, ax = plt.subplots(figsize=(side + 1.0, side), layout="constrained")
    image = ax.imshow(matrix, cmap="Blues", interpolation="nearest")
    fig.colorbar(image, ax=ax, shrink=0.8, label="examples")
    if n <= _ANNOTATE_MAX_CLASSES:
        threshold = matrix.max() / 2 if matrix.size else 0
        for (row, col), count in np.ndenumerate(matrix):
            if count:
                ax.text(col, row, str(int(count)), ha="center", va="center", fontsize="small",
                        color="white" if count > threshold else "black")
        ax.set_xticks(range(n), class_names, rotation=45)
        ax.set_yticks(range(n), class_names)
    differ = np.argwhere(matrix != twin_matrix)
    for row, col in differ:
        ax.add_patch(_pyplot().Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False,
                                         edgecolor="tab:red", linewidth=2))
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(f"Confusion matrix (AMP model)\n{len(differ)} cells differ from the float32 "
                 "twin (outlined)")
    return fig


def plot_confusion_matrix(path: Path, class_names: list[str], matrix: np.ndarray,
                          twin_matrix: np.ndarray) -> Path:
    """Write `confusion_figure` as a PNG."""
    return _save(confusion_figure(class_names, matrix, twin_matrix), path)


def _tick_labels(names: list[str]) -> list[str]:
    """Class names as tick labels; too many to read: every k-th only."""
    if len(names) <= _ANNOTATE_MAX_CLASSES:
        return names
    step = math.ceil(len(names) / _ANNOTATE_MAX_CLASSES)
    return [name if i % step == 0 else "" for i, name in enumerate(names)]


def render_markdown(metrics: dict[str, Any], verdict: dict[str, Any]) -> str:
    """The report: verdict, gate table, release quality, accuracy table, training parity, plots."""
    ctx = metrics["context"]
    status = "PASSED" if verdict["passed"] else "FAILED"
    lines = [
        f"# FP32 parity: {status}",
        "",
        f"Model `{ctx.get('architecture', ctx.get('model_name'))}` trained under "
        f"`{ctx['policy']}` (compute dtype "
        f"`{ctx['compute_dtype']}`), evaluated on {metrics['num_examples']} examples of the "
        f"`{ctx['split']}` split against its float32 twin (same weights, float32 policy)"
        + (" and against a model trained under float32." if "baseline_accuracy" in metrics
           else "."),
        "",
        "## Gate",
        "",
        "| check | measured | threshold | result |",
        "|---|---|---|---|",
    ]
    for check in verdict["checks"]:
        lines.append(f"| {check['name']} | {_cell(check['value'])} | {check['op']} "
                     f"{_cell(check['threshold'])} | {'pass' if check['passed'] else '**FAIL**'} |")
    lines += _release_section(verdict)
    lines += ["", "## Inference parity (numerics: AMP vs its float32 twin, same weights)", "",
              "| measure | value |", "|---|---|"]
    for key in ("amp_accuracy", "fp32_twin_accuracy", "accuracy_drop_points", "argmax_agreement",
                "max_abs_logit_diff", "mean_abs_logit_diff", "max_relative_logit_diff",
                "amp_nonfinite_logits"):
        lines.append(f"| {key} | {_cell(metrics.get(key))} |")
    if "baseline_accuracy" in metrics:
        lines += _training_section(metrics, ctx)
    lines += _amp_check_section(ctx.get("amp_check"))
    lines += _per_class_table(metrics["per_class_accuracy"])
    lines += ["", "## Plots", "", f"![per-class accuracy]({PER_CLASS_PNG})", "",
              f"![confusion matrix]({CONFUSION_PNG})", "",
              f"![logit differences]({LOGIT_DIFF_PNG})", "",
              f"![loss-scale history]({LOSS_SCALE_PNG})", ""]
    return "\n".join(lines)


def _release_section(verdict: dict[str, Any]) -> list[str]:
    """Above chance, the absolute thresholds and the model serving: each outcome in words."""
    release = [c for c in verdict["checks"] if c["name"].startswith(_RELEASE_CHECKS)]
    serving = (verdict.get("baselines") or {}).get("serving")
    lines = ["", "## Release quality (absolute, and against the model serving)", ""]
    lines += [f"- {'pass' if c['passed'] else '**FAIL**'}: {c.get('reason') or c['description']}"
              for c in release]
    if serving and serving.get("version") is None:
        lines.append(f"- no comparison with a served model: {serving['base_path']}: "
                     f"{serving.get('why_none')}")
    elif not serving:
        lines.append("- no comparison with a served model: no serving target")
    lines += [f"- note: {note}" for note in verdict.get("notes") or []]
    return lines


_RELEASE_CHECKS = ("chance_", "serving_", "min_accuracy", "threshold:")


def _training_section(metrics: dict[str, Any], ctx: dict[str, Any]) -> list[str]:
    """AMP-trained vs float32-trained: accuracy, the paired test, the speedup with its noise."""
    m, unit = metrics, throughput_unit(ctx.get("modality")).rate
    plural = throughput_unit(ctx.get("modality")).plural
    lines = [
        "", "## Training parity (AMP-trained vs float32-trained, same data and seed)", "",
        f"- accuracy: AMP {_pct(m['amp_accuracy'])} vs float32 {_pct(m['baseline_accuracy'])}: "
        f"{_signed(m['baseline_accuracy_delta_points'])} points "
        f"(paired SE {_cell(m['baseline_delta_stderr_points'])})",
        f"- {plural} only one model gets right: {int(m['baseline_amp_only_correct'])} only AMP, "
        f"{int(m['baseline_only_correct'])} only float32; one-sided McNemar p = "
        f"{_cell(m['baseline_mcnemar_p_value'])} ({m.get('baseline_mcnemar_method', '')})",
        "- AMP training speedup: " + speedup_text(m, (
            f"AMP {_mean_sd(m, 'amp_train_img_per_s', unit)} vs float32 "
            f"{_mean_sd(m, 'baseline_train_img_per_s', unit)}, the mean of "
            f"{_cell(m['training_speedup_epochs_measured'])} timed epoch(s); measured in two "
            "separate tasks")),
        *_memory_lines(m),
        "",
        "| measure | value |",
        "|---|---|",
    ]
    for key in ("baseline_accuracy", "baseline_accuracy_delta_points",
                "baseline_delta_stderr_points", "baseline_mcnemar_p_value",
                "baseline_detectable_drop_points", "baseline_argmax_agreement",
                "training_speedup", "training_speedup_stderr", "train_time_ratio",
                *_MEMORY_KEYS):
        if key in _MEMORY_KEYS and key not in m:
            continue  # a model trained before train recorded its memory
        lines.append(f"| {key} | {_cell(m.get(key))} |")
    lines += [f"- note: {note}" for note in ctx.get("baseline_notes") or []]
    return lines


_MEMORY_KEYS = ("amp_train_peak_memory_bytes", "baseline_train_peak_memory_bytes",
                "train_peak_memory_ratio")


def _amp_check_section(check: dict[str, Any] | None, max_rows: int = 20) -> list[str]:
    """What the AMP check found before training (train's amp_report.json), as a short table."""
    if not check:
        return []
    lines = ["", "## AMP check (before the first epoch)", ""]
    if check.get("summary"):
        lines += [check["summary"], ""]
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(check.get("dtype_counts", {}).items()))
    if counts:
        lines += [f"Layers per compute/variable dtype: {counts}.", ""]
    findings = check.get("findings", [])
    if findings:
        lines += ["| finding | layer | severity |", "|---|---|---|"]
        lines += [f"| {f['kind']} | {f.get('layer') or '-'} | {f['severity']} |"
                  for f in findings[:max_rows]]
        if len(findings) > max_rows:
            lines.append(f"| … {len(findings) - max_rows} more in amp_report.json | | |")
    lines += [f"- fixed: {fix}" for fix in check.get("fixes", [])]
    lines += [f"- warning: {w}" for w in check.get("warnings", [])]
    return lines


def _memory_lines(m: dict[str, Any]) -> list[str]:
    """The peak training memory beside the speedup: both peaks and their ratio, where recorded."""
    amp, base = m.get("amp_train_peak_memory_bytes"), m.get("baseline_train_peak_memory_bytes")
    if amp is None and base is None:
        return []
    amp_text = (f"AMP {_mib(amp)} ({m.get('amp_train_peak_memory_source')})" if amp is not None
                else "AMP not recorded")
    base_text = (f"float32 {_mib(base)} ({m.get('baseline_train_peak_memory_source')})"
                 if base is not None else "float32 not recorded")
    ratio = m.get("train_peak_memory_ratio")
    tail = f": {ratio:.2f}× float32 ({ratio - 1:+.0%})" if ratio is not None else ""
    return [f"- peak training memory: {amp_text} vs {base_text}{tail}; each run's own peak, "
            "on the device it trained on"]


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB" if value >= 2**20 else f"{value / 2**20:.2f} MiB"


def _pct(value: float) -> str:
    return f"{100 * value:.2f} %"


def _signed(value: float) -> str:
    return f"{value:+.2f}" if math.isfinite(value) else str(value)


def _per_class_table(per_class: dict[str, dict[str, float | None]]) -> list[str]:
    models = list(per_class)
    classes = list(next(iter(per_class.values())))
    lines = ["", "## Per-class accuracy", "", "| class | " + " | ".join(models) + " |",
             "|---|" + "---|" * len(models)]
    for name in classes:
        lines.append(f"| {name} | " + " | ".join(_cell(per_class[m][name]) for m in models) + " |")
    return lines


def _mean_sd(m: dict[str, Any], key: str, unit: str) -> str:
    """`41.2 texts/s (SD 0.8)`, or no SD where one timed epoch leaves none (not `± nan`)."""
    sd = m.get(f"{key}_stdev")
    finite = isinstance(sd, (int, float)) and math.isfinite(sd)
    return f"{_cell(m[key])} {unit}" + (f" (SD {_cell(sd)})" if finite else "")


def _cell(value: Any) -> str:
    """A metric as report.md shows it: NaN (nothing to estimate it from) and None are n/a."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def inline_images(markdown: str, directory: Path) -> str:
    """Replace `![alt](file.png)` links with data URIs so the report is one self-contained file.

    The KFP UI shows a `Markdown` artifact on its own, without the PNGs beside it.
    """
    import base64
    import re

    def embed(match: re.Match) -> str:
        path = directory / match.group(2)
        if not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"![{match.group(1)}](data:image/png;base64,{data})"

    return re.sub(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)", embed, markdown)
