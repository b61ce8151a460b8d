"""The per-variant metadata JSON and the comparison report (report.json + report.md).

The metadata JSON is what an app developer needs next to a .tflite: which tensors to feed, in
which dtype, how to (de)quantize, and the labels, so nobody reads the flatbuffer to find out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampflow.artifacts.throughput import throughput_unit
from ampflow.components.convert_tflite.variants import SPECS
from ampflow.files import write_json_atomic

_INT8_INPUT = ("Input is int8: q = clip(round(x / scale) + zero_point, -128, 127) with x the raw "
               "float32 pixel value 0..255 and (scale, zero_point) the input tensor's.")
_INT8_OUTPUT = ("probabilities are int8: p = (q - zero_point) * scale with the output tensor's "
                "(scale, zero_point); class_ids are int64 class indices into labels.")
_FLOAT_IO = ("Input float32 raw pixel values 0..255 [batch, H, W, C] (no rescaling: the model "
             "rescales inside); outputs float32 probabilities and int64 class_ids.")


def variant_metadata(variant: str, io: dict, labels: list[str], saved_model_dir: Path, config,
                     metrics: dict, checks: list, passed: bool,
                     representative: dict | None, sha256: str) -> dict[str, Any]:
    """The `<variant>.json` written beside `<variant>.tflite`."""
    spec = SPECS[variant]
    int_in = any(d["quantization"] and d["dtype"] != "float32" for d in io["inputs"].values())
    int_out = any(d["quantization"] and d["dtype"] != "float32" for d in io["outputs"].values())
    usage = [_INT8_INPUT if int_in else "", _INT8_OUTPUT if int_out else ""]
    import tensorflow as tf

    return {
        "variant": variant,
        "file": f"{variant}.tflite",
        "sha256": sha256,
        "converter": {"tensorflow": tf.__version__},
        "description": spec.description,
        "signature_key": config.signature_key,
        "source_saved_model": str(saved_model_dir),
        "quantization": {"weights": spec.weights, "activations": spec.activations,
                         "integer_io": bool(int_in or int_out),
                         "representative_dataset": representative},
        "inputs": io["inputs"],
        "outputs": io["outputs"],
        "usage": " ".join(u for u in usage if u) or _FLOAT_IO,
        "labels": labels,
        "metrics": metrics,
        "gate": {"passed": passed, "checks": checks},
    }


def write_reports(directory: Path, report: dict) -> None:
    """Write report.json and report.md into `directory`."""
    write_json_atomic(directory / "report.json", report)
    tmp = directory / ".report.md.tmp"
    tmp.write_text(render_markdown(report))
    tmp.replace(directory / "report.md")


def render_markdown(report: dict) -> str:
    """A table comparing every variant with the SavedModel, then the gate verdict.

    Throughput is in the data's unit (`img/s`, `texts/s`: ampflow.artifacts.throughput); report.json
    keeps its field name, `throughput_images_per_sec`, for either kind.
    """
    ref = report["saved_model"]
    batch = report["config"]["batch_size"]
    rate = throughput_unit(report.get("modality")).rate
    lines = [
        "# TFLite conversion report",
        "",
        f"Source: `{ref['saved_model_dir']}` — verdict: "
        f"**{'PASSED' if report['passed'] else 'FAILED'}**",
        "",
        f"| model | size (KiB) | x smaller than float32 | top-1 acc | drop (pts) | agreement "
        f"| max abs dprob | p50 ms | p95 ms | {rate} (batch {batch}) | LiteRT | gate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        _row("SavedModel", ref["size_bytes"], None, ref["accuracy"], None, None, None,
             ref["timing"], "—", "reference"),
    ]
    for name, v in report["variants"].items():
        edge = v["edge"]
        edge_cell = "skipped" if edge["status"] != "ran" else (
            f"agreement {edge['agreement']:.4f}, max diff {edge['max_abs_diff']:.1e}"
            if edge.get("rule") == "gate" else f"same (max diff {edge['max_abs_diff']:.1e})")
        lines.append(_row(name, v["size_bytes"], v.get("size_ratio_vs_float32"), v["accuracy"],
                          v["accuracy_drop_points"], v["agreement"], v["max_abs_prob_diff"],
                          v["timing"], edge_cell, "pass" if v["passed"] else "**FAIL**"))
    for name, v in report["variants"].items():
        if v.get("failed_examples"):
            ran = v.get("agreement_where_ran")
            lines += ["", f"{name} fails in the interpreter on {v['failed_examples']} of "
                      f"{v['num_examples']} test examples (counted wrong above; not timed; "
                      f"agreement on the others {'—' if ran is None else format(ran, '.4f')}):"
                      f" {v.get('first_error')}"]
    lines += ["", "## Gates", ""]
    for name, v in report["variants"].items():
        for c in v["checks"]:
            mark = "pass" if c["passed"] else "FAIL"
            lines.append(f"- {name}: {c['name']} = {c['value']:.6g} "
                         f"(must be {c['op']} {c['threshold']:g}) — {mark}")
    env = report["environment"]
    lines += ["", f"Measured with TensorFlow {env['tensorflow']} on {env['machine']} "
              f"({env['cpu_count']} CPUs, threads={env['num_threads'] or 'default'}, "
              f"{env['delegate']}); latency is invoke() on a batch of one after warm-up.", ""]
    if not report["edge_check"]["enabled"]:
        lines += [f"LiteRT edge check skipped: {report['edge_check']['reason']}", ""]
    return "\n".join(lines)


def _row(name, size, ratio, acc, drop, agreement, diff, timing, edge, gate) -> str:
    def fmt(value, spec):
        return "—" if value is None else format(value, spec)

    timing = timing or {}  # None: the model failed on some inputs, so it was not timed
    return (f"| {name} | {size / 1024:.1f} | {fmt(ratio, '.2f')} | {acc:.4f} | {fmt(drop, '.2f')} "
            f"| {fmt(agreement, '.4f')} | {fmt(diff, '.2e')} "
            f"| {fmt(timing.get('latency_ms_median'), '.3f')} "
            f"| {fmt(timing.get('latency_ms_p95'), '.3f')} "
            f"| {fmt(timing.get('throughput_images_per_sec'), '.0f')} | {edge} | {gate} |")
