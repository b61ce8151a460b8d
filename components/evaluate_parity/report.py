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

PER_CLASS_PNG = "per_class_accuracy.png"
LOGIT_DIFF_PNG = "logit_diff_histogram.png"
LOSS_SCALE_PNG = "loss_scale_history.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_per_class_accuracy(
    path: Path, class_names: list[str], series: dict[str, np.ndarray]
) -> Path:
    """Grouped bars of per-class accuracy, one bar per model (AMP, FP32 twin, baseline)."""
    plt = _pyplot()
    width_in = min(14.0, max(6.0, 0.25 * len(class_names) * len(series) + 2.0))
    fig, ax = plt.subplots(figsize=(width_in, 3.6))
    width = 0.8 / max(1, len(series))
    positions = np.arange(len(class_names))
    for i, (label, values) in enumerate(series.items()):
        ax.bar(positions + i * width, np.nan_to_num(values, nan=0.0), width, label=label)
    ax.set_xticks(positions + width * (len(series) - 1) / 2, class_names, rotation=45)
    lowest = float(np.nanmin(np.concatenate(list(series.values())), initial=0.8))
    ax.set_ylim(min(0.8, lowest) - 0.02, 1.0)
    ax.set_ylabel("top-1 accuracy (recall)")
    ax.set_title("Per-class accuracy")
    ax.legend(loc="lower right", fontsize="small")
    return _save(fig, path)


def plot_logit_diff_histogram(path: Path, abs_diff: np.ndarray, bound: float | None) -> Path:
    """Histogram of |logit(AMP) - logit(FP32 twin)| on a log x-axis (zeros shown at the floor)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    if abs_diff.size:
        floor = 1e-8
        values = np.maximum(abs_diff, floor)
        bins = np.logspace(math.log10(floor), math.log10(max(values.max(), 10 * floor)) + 0.1, 50)
        ax.hist(values, bins=bins, color="tab:blue")
        ax.set_xscale("log")
        if bound is not None and math.isfinite(bound):
            ax.axvline(bound, color="tab:red", linestyle="--", label="gate bound (absolute)")
            ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no finite logit differences", ha="center", transform=ax.transAxes)
    ax.set_xlabel("|logit difference|")
    ax.set_ylabel("count (examples × classes)")
    ax.set_title("AMP vs float32 twin: |logit difference|")
    return _save(fig, path)


def plot_loss_scale_history(path: Path, history: list[dict[str, Any]], policy: str) -> Path:
    """The dynamic loss scale and skipped steps over training, from loss_scale_history.json."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
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
        ax.legend(loc="upper left", fontsize="small")
        twin.legend(loc="lower right", fontsize="small")
    else:
        ax.text(0.5, 0.5, f"no loss scaling under {policy}\n(only float16 needs it)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    ax.set_title("Loss-scale history (training)")
    return _save(fig, path)


def render_markdown(metrics: dict[str, Any], verdict: dict[str, Any]) -> str:
    """The report: verdict, gate table, accuracy table, training parity, plots."""
    ctx = metrics["context"]
    status = "PASSED" if verdict["passed"] else "FAILED"
    lines = [
        f"# FP32 parity: {status}",
        "",
        f"Model `{ctx['model_name']}` trained under `{ctx['policy']}` (compute dtype "
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
    lines += ["", "## Inference parity (numerics: AMP vs its float32 twin, same weights)", "",
              "| measure | value |", "|---|---|"]
    for key in ("amp_accuracy", "fp32_twin_accuracy", "accuracy_drop_points", "argmax_agreement",
                "max_abs_logit_diff", "mean_abs_logit_diff", "max_relative_logit_diff",
                "amp_nonfinite_logits"):
        lines.append(f"| {key} | {_cell(metrics.get(key))} |")
    if "baseline_accuracy" in metrics:
        lines += _training_section(metrics, ctx)
    lines += _per_class_table(metrics["per_class_accuracy"])
    lines += ["", "## Plots", "", f"![per-class accuracy]({PER_CLASS_PNG})", "",
              f"![logit differences]({LOGIT_DIFF_PNG})", "",
              f"![loss-scale history]({LOSS_SCALE_PNG})", ""]
    return "\n".join(lines)


def _training_section(metrics: dict[str, Any], ctx: dict[str, Any]) -> list[str]:
    """AMP-trained vs float32-trained: accuracy, the paired test, the speedup with its noise."""
    m = metrics
    lines = [
        "", "## Training parity (AMP-trained vs float32-trained, same data and seed)", "",
        f"- accuracy: AMP {_pct(m['amp_accuracy'])} vs float32 {_pct(m['baseline_accuracy'])}: "
        f"{_signed(m['baseline_accuracy_delta_points'])} points "
        f"(paired SE {_cell(m['baseline_delta_stderr_points'])})",
        f"- images only one model gets right: {int(m['baseline_amp_only_correct'])} only AMP, "
        f"{int(m['baseline_only_correct'])} only float32; one-sided McNemar p = "
        f"{_cell(m['baseline_mcnemar_p_value'])} ({m.get('baseline_mcnemar_method', '')})",
        f"- AMP training speedup: {_cell(m['training_speedup'])}× ± "
        f"{_cell(m['training_speedup_stderr'])} (SE; AMP {_cell(m['amp_train_img_per_s'])} ± "
        f"{_cell(m['amp_train_img_per_s_stdev'])} img/s vs float32 "
        f"{_cell(m['baseline_train_img_per_s'])} ± {_cell(m['baseline_train_img_per_s_stdev'])}"
        f" img/s, mean ± SD over {_cell(m['training_speedup_epochs_measured'])} epochs; "
        "measured in two separate tasks)",
        "",
        "| measure | value |",
        "|---|---|",
    ]
    for key in ("baseline_accuracy", "baseline_accuracy_delta_points",
                "baseline_delta_stderr_points", "baseline_mcnemar_p_value",
                "baseline_argmax_agreement", "training_speedup", "training_speedup_stderr",
                "train_time_ratio"):
        lines.append(f"| {key} | {_cell(m.get(key))} |")
    lines += [f"- note: {note}" for note in ctx.get("baseline_notes") or []]
    return lines


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


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
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
