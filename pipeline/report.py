"""What `ampflow run-local` and `ampflow demo` print: where each artifact is, and the numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def summarize_run(result) -> str:
    """Artifact locations by task, then the key metrics of the run."""
    lines = [f"\nampflow run-local: done — run dir {result.run_dir}", "", "Artifacts:"]
    for task, outputs in result.artifacts.items():
        for name, path in outputs.items():
            if name == "executor_output.json":
                continue
            lines.append(f"  {task:<22} {name:<12} {path}")
    lines += ["", "Key metrics:"]
    for key, value in key_metrics(result).items():
        lines.append(f"  {key:<34} {_fmt(value)}")
    return "\n".join(lines)


def key_metrics(result) -> dict[str, Any]:
    """The numbers a user looks at first, read from the artifacts' own JSON files."""
    art = result.artifacts
    out: dict[str, Any] = {}
    meta = _json(art.get("train", {}).get("model"), "metadata.json")
    if meta:
        out["train.policy"] = meta["precision"]["policy"]
        out["train.xla"] = meta["xla"]["effective"]
        out["train.val_accuracy"] = meta["final_metrics"].get("val_accuracy")
        out["train.throughput_img_per_s"] = meta["throughput_examples_per_sec"]
        scale = meta["loss_scale"]
        if scale.get("enabled"):
            out["train.loss_scale_final"] = scale["final"]
            out["train.skipped_steps"] = f"{scale['skipped_steps']} of {scale['steps']}"
    metrics = _json(art.get("evaluate-parity", {}).get("verdict"), "metrics.json")
    if metrics:
        for key in ("amp_accuracy", "fp32_twin_accuracy", "accuracy_drop_points",
                    "argmax_agreement", "max_abs_logit_diff", "max_relative_logit_diff"):
            if key in metrics:
                out[f"parity.{key}"] = metrics[key]
        out.update(training_parity(metrics))
        out["parity.gate"] = "passed" if metrics.get("gate", {}).get("passed") else "FAILED"
    saved = art.get("export-savedmodel", {}).get("saved_model")
    if saved and Path(saved).is_dir():
        versions = sorted(str(p.relative_to(saved)) for p in Path(saved).glob("*/*")
                          if p.is_dir())
        out["export.version_dirs"] = ", ".join(versions)
    report = _json(art.get("convert-tflite", {}).get("tflite"), "report.json")
    for name, v in (report or {}).get("variants", {}).items():
        timing = v.get("timing", {})
        out[f"tflite.{name}"] = (f"acc {v['accuracy']:.4f}, agree {v['agreement']:.4f}, "
                                 f"{v['size_bytes'] / 1024:.1f} KiB, p50 "
                                 f"{timing.get('latency_ms_median', float('nan')):.3f} ms, "
                                 f"edge {v.get('edge', {}).get('status', 'n/a')}")
    endpoint = _json(art.get("deploy-serving", {}).get("endpoint"))
    if endpoint:
        out["deploy"] = f"{endpoint.get('target')} → {endpoint.get('model_path')}"
    return out


def training_parity(metrics: dict[str, Any]) -> dict[str, str]:
    """AMP-trained vs float32-trained accuracy and the AMP training speedup, as printed."""
    if "baseline_accuracy" not in metrics:
        return {}
    m = {k: (float("nan") if v is None else v) for k, v in metrics.items()}
    return {
        "parity.float32_trained_accuracy": f"{m['baseline_accuracy']:.4f}",
        "parity.amp_vs_float32_trained": (
            f"{m['baseline_accuracy_delta_points']:+.2f} points (paired SE "
            f"{m['baseline_delta_stderr_points']:.2f}; right only under AMP: "
            f"{int(m['baseline_amp_only_correct'])}, only under float32: "
            f"{int(m['baseline_only_correct'])} images; McNemar p = "
            f"{m['baseline_mcnemar_p_value']:.3g})"),
        "parity.amp_training_speedup": (
            f"{m['training_speedup']:.3g}x ± {m['training_speedup_stderr']:.2g} (SE; "
            f"{m['amp_train_img_per_s']:.0f} vs {m['baseline_train_img_per_s']:.0f} img/s)"),
    }


def results_table(result, served: dict[str, Any]) -> str:
    """The demo's closing table: one row per stage with its headline number."""
    metrics = key_metrics(result)
    rows = [(k, _fmt(v)) for k, v in metrics.items()]
    rows += [("serving.version", served["version"]),
             ("serving.grpc_accuracy", f"{served['served_accuracy']:.4f} on "
                                       f"{served['served_examples']} test images"),
             ("serving.grpc_p50_ms (1 image)", f"{served['grpc_p50_ms']:.2f}")]
    width = max(len(k) for k, _ in rows)
    lines = ["", "Results", "-" * (width + 40)]
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    return "\n".join(lines)


def _json(path, name: str | None = None) -> dict | None:
    if path is None:
        return None
    file = Path(path) / name if name else Path(path)
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return None


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
