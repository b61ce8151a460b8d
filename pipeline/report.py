"""What `ampflow run-local` and `ampflow demo` print and save: headlines, numbers, where things are.

Each step's headline number as it ends, the closing results table (also saved in the workdir
as results.txt and results.json), and the failed gate checks when the gate stops a run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ampflow.artifacts.throughput import ThroughputUnit, throughput_unit
from ampflow.data.modality import MODALITY_IMAGE, is_text

RESULTS_JSON = "results.json"
RESULTS_TEXT = "results.txt"


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
    info = _json(art.get("prepare-data", {}).get("data"), "dataset_info.json") or {}
    unit = _unit(info)
    if is_text(info):
        out["data.texts"] = _splits(info, "texts")
        out["data.skipped"] = skipped_by_reason(info)
    pretrained = _json(art.get("pretrain", {}).get("model"), "pretraining.json")
    if pretrained:  # --pretrain-epochs: the encoder train fine-tuned
        losses = pretrained["masked_lm_loss_per_epoch"]
        out["pretrain.masked_lm_loss"] = (f"{losses[0]:.3f} (epoch 1) -> {losses[-1]:.3f} "
                                          f"(epoch {len(losses)}), {pretrained['texts']} texts")
    meta = _json(art.get("train", {}).get("model"), "metadata.json")
    if meta:
        out["train.policy"] = meta["precision"]["policy"]
        out["train.xla"] = meta["xla"]["effective"]
        out["train.val_accuracy"] = meta["final_metrics"].get("val_accuracy")
        if meta.get("tokenizer"):
            out["train.tokenizer"] = _tokenizer(meta["tokenizer"])
        out[f"train.{unit.metric}"] = meta[
            "throughput_examples_per_sec"]
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
        out.update(training_parity(metrics, unit))
        out.update(release_quality(metrics, unit))
        out["parity.gate"] = "passed" if metrics.get("gate", {}).get("passed") else "FAILED"
    verdict = _json(art.get("evaluate-parity", {}).get("verdict"), "verdict.json") or {}
    from ampflow.components.evaluate_parity.serving_gate import SERVING_VERDICT_FILE

    compared = _json(art.get("compare-serving", {}).get("comparison"), SERVING_VERDICT_FILE)
    if compared:
        out.update(release_quality(compared.get("metrics") or {}, unit) or
                   {"release.vs_serving": compared.get("message")})
    out.update(gate_notes([*(verdict.get("notes") or []),
                           *((compared or {}).get("notes") or [])]))
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


IMAGES = throughput_unit(MODALITY_IMAGE)


def _unit(info: dict[str, Any]) -> ThroughputUnit:
    """Texts for a text dataset (its dataset_info.json), images otherwise."""
    return throughput_unit(info.get("modality"))


def _splits(info: dict[str, Any], plural: str) -> str:
    return ", ".join(f"{n} {name}" for name, n in info.get("splits", {}).items()) + f" {plural}"


def skipped_by_reason(info: dict[str, Any]) -> str:
    """`1 file or row left out (not UTF-8: 1)`, or `none left out`: dataset_info.json's count."""
    skipped = info.get("skipped_files") or {}
    count = int(skipped.get("count") or 0)
    if not count:
        return "none left out"
    reasons = ", ".join(f"{reason}: {n}" for reason, n in
                        (skipped.get("by_reason") or {}).items())
    return f"{count} {'file or row' if count == 1 else 'files or rows'} left out ({reasons})"


def _tokenizer(tokenizer: dict[str, Any]) -> str:
    """`sequence length 32, 1,204 ids in use (of 20,000)`: the text model's input."""
    return (f"sequence length {tokenizer['max_sequence_length']}, "
            f"{tokenizer['vocabulary_in_use']:,} ids in use (of "
            f"{tokenizer['vocabulary_size']:,})")


def training_parity(metrics: dict[str, Any], unit: ThroughputUnit = IMAGES) -> dict[str, str]:
    """AMP-trained vs float32-trained accuracy and the AMP training speedup, as printed."""
    from ampflow.components.evaluate_parity.training import speedup_text

    if "baseline_accuracy" not in metrics:
        return {}
    m = {k: (float("nan") if v is None else v) for k, v in metrics.items()}
    return {
        "parity.float32_trained_accuracy": f"{m['baseline_accuracy']:.4f}",
        "parity.amp_vs_float32_trained": (
            f"{m['baseline_accuracy_delta_points']:+.2f} points (paired SE "
            f"{m['baseline_delta_stderr_points']:.2f}; right only under AMP: "
            f"{int(m['baseline_amp_only_correct'])}, only under float32: "
            f"{int(m['baseline_only_correct'])} {unit.plural}; McNemar p = "
            f"{m['baseline_mcnemar_p_value']:.3g}; {_detects(m, 'baseline', unit)})"),
        "parity.amp_training_speedup": speedup_text(
            m, f"{m['amp_train_img_per_s']:.0f} vs {m['baseline_train_img_per_s']:.0f} "
               f"{unit.rate}"),
    }


def _detects(m: dict[str, Any], prefix: str, unit: ThroughputUnit) -> str:
    """`detects >= 46.0 points on 18 texts`: the paired test's detectable drop, as printed."""
    drop = m.get(f"{prefix}_detectable_drop_points")
    if not isinstance(drop, (int, float)) or drop != drop:  # an older run: not recorded
        return "detectable drop not recorded"
    n = int(m.get("num_examples") or 0)
    if drop == float("inf"):
        return f"no drop detectable on {n} {unit.plural}"
    return f"detects >= {drop:.1f} points on {n} {unit.plural}"


def gate_notes(notes: list[Any]) -> dict[str, str]:
    """The verdicts' notes (a split too small, a test too weak, a forced deploy), one row each.

    Shown for every decision, passed or failed, so a run on a small split says what its gate
    could not tell.
    """
    texts = [note for note in notes if isinstance(note, str)]
    return {f"gate.note {i}": note for i, note in enumerate(texts, 1)}


def release_quality(metrics: dict[str, Any], unit: ThroughputUnit | None = None
                    ) -> dict[str, str]:
    """The accuracy against chance and against the model serving (when one was), as printed."""
    unit = unit or IMAGES
    m = {k: (float("nan") if v is None else v) for k, v in metrics.items()}
    out = {}
    if "chance_accuracy" in m:
        out["release.vs_chance"] = (f"accuracy {m['amp_accuracy']:.4f} vs chance "
                                    f"{m['chance_accuracy']:.4f} (binomial p = "
                                    f"{m['chance_binomial_p_value']:.3g})")
    if "serving_accuracy" in m:
        out["release.vs_serving"] = (
            f"version {int(m['serving_version'])}: {m['serving_accuracy']:.4f}, "
            f"{m['serving_accuracy_delta_points']:+.2f} points (right only now: "
            f"{int(m['serving_new_only_correct'])}, only served: "
            f"{int(m['serving_only_correct'])} {unit.plural}; McNemar p = "
            f"{m['serving_mcnemar_p_value']:.3g}; {_detects(m, 'serving', unit)})")
        if isinstance(metrics.get("serving_outcome"), str):
            out["release.vs_serving"] += (f"; {metrics['serving_rule']}: "
                                          f"{metrics['serving_outcome']}")
    return out


def results(result, served: dict[str, Any] | None = None) -> dict[str, Any]:
    """The rows of the closing table, unformatted: the run's key metrics, then serving's."""
    rows = key_metrics(result)
    if served:
        rows.update({"serving.version": served["version"],
                     "serving.grpc_accuracy": f"{served['served_accuracy']:.4f} on "
                                              f"{served['served_examples']} test images",
                     "serving.grpc_p50_ms (1 image)": f"{served['grpc_p50_ms']:.2f}"})
    return rows


def results_table(rows: dict[str, Any]) -> str:
    """The closing table as printed (and saved as results.txt): one row per headline number."""
    width = max(len(k) for k in rows)
    lines = ["Results", "-" * (width + 40)]
    lines += [f"{k.ljust(width)}  {_fmt(v)}" for k, v in rows.items()]
    return "\n".join(lines)


def save_results(workdir: Path, result, rows: dict[str, Any], logs: dict[str, Path],
                 served: dict[str, Any] | None = None) -> Path:
    """Write results.json (raw values) and results.txt (the table as printed) into `workdir`.

    The numbers of the latest run can so be read again; returns the text file's path.
    `served`: the demo's serving numbers, unformatted (results.json's "serving").
    """
    workdir = Path(workdir)
    text = workdir / RESULTS_TEXT
    text.write_text(results_table(rows) + "\n")
    (workdir / RESULTS_JSON).write_text(json.dumps({
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_dir": str(result.run_dir),
        "results": rows,
        "serving": served or {},
        "logs": {task: str(path) for task, path in logs.items()},
    }, indent=2, default=str, ensure_ascii=False) + "\n")
    return text


def step_headline(task: str, task_dir: Path) -> str:
    """The number a user looks at first for one finished task of the pipeline."""
    for prefix, headline in _HEADLINES.items():
        if task.startswith(prefix):
            try:
                return headline(Path(task_dir))
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                return ""
    return ""


def _data_headline(task_dir: Path) -> str:
    info = _json(task_dir / "data", "dataset_info.json") or {}
    if not info:
        return ""
    text = f"{info['name']}: {_splits(info, _unit(info).plural)}"
    return f"{text}; {skipped_by_reason(info)}" if is_text(info) else text


def _train_headline(task_dir: Path) -> str:
    meta = _json(task_dir / "model", "metadata.json")
    if not meta:
        return ""
    unit = throughput_unit(meta.get("modality"))
    text = (f"{meta['precision']['policy']}, XLA {'on' if meta['xla']['effective'] else 'off'}: "
            f"val_accuracy {meta['final_metrics']['val_accuracy']:.4f}, "
            f"{meta['throughput_examples_per_sec']:.0f} {unit.rate}")
    if meta.get("tokenizer"):
        text += f", sequence length {meta['tokenizer']['max_sequence_length']}"
    scale = meta.get("loss_scale", {})
    if scale.get("enabled"):
        text += (f", loss scale {scale['final']:g} ({scale['skipped_steps']} of "
                 f"{scale['steps']} steps skipped)")
    return text


def _evaluate_headline(task_dir: Path) -> str:
    metrics = _json(task_dir / "verdict", "metrics.json")
    verdict = _json(task_dir / "verdict", "verdict.json")
    if not metrics or not verdict:
        return ""
    checks = verdict["checks"]
    text = (f"gate {'PASS' if verdict['passed'] else 'FAIL'} "
            f"({sum(c['passed'] for c in checks)} of {len(checks)} checks): "
            f"agreement {metrics['argmax_agreement']:.4f}, "
            f"accuracy drop {metrics['accuracy_drop_points']:.2f} points vs the float32 twin")
    if metrics.get("baseline_accuracy_delta_points") is not None:
        text += f", {metrics['baseline_accuracy_delta_points']:+.2f} vs float32-trained"
    if metrics.get("serving_accuracy_delta_points") is not None:
        text += (f", {metrics['serving_accuracy_delta_points']:+.2f} vs serving version "
                 f"{int(metrics['serving_version'])}")
    return text


def _gate_headline(task_dir: Path) -> str:
    return "passed: export may go on"


def _compare_headline(task_dir: Path) -> str:
    from ampflow.components.evaluate_parity.serving_gate import SERVING_VERDICT_FILE

    verdict = _json(task_dir / "comparison", SERVING_VERDICT_FILE)
    if not verdict:
        return ""
    metrics = verdict.get("metrics") or {}
    if "serving_accuracy" not in metrics:
        return verdict["message"]
    outcome = f", {metrics['serving_outcome']}" if "serving_outcome" in metrics else ""
    return (f"{'PASS' if verdict['passed'] else 'FAIL'}{outcome}: "
            f"{metrics['serving_accuracy_delta_points']:+.2f} points vs serving version "
            f"{int(metrics['serving_version'])} (McNemar p = "
            f"{metrics['serving_mcnemar_p_value']:.3g}; "
            f"{_detects(metrics, 'serving', _unit(_data_info(task_dir)))})")


def _data_info(task_dir: Path) -> dict[str, Any]:
    """The run's dataset_info.json, from a task dir's sibling prepare-data (for its unit)."""
    return _json(Path(task_dir).parent / "prepare-data" / "data", "dataset_info.json") or {}


def _serving_gate_headline(task_dir: Path) -> str:
    return "passed: deploy may go on"


def _pretrain_headline(task_dir: Path) -> str:
    report = _json(task_dir / "model", "pretraining.json")  # components/pretrain's report
    if not report:
        return ""
    losses = report["masked_lm_loss_per_epoch"]
    return (f"{report['texts']} texts, masked-LM loss {losses[0]:.3f} (epoch 1) -> "
            f"{losses[-1]:.3f} (epoch {len(losses)})")


def _export_headline(task_dir: Path) -> str:
    saved = task_dir / "saved_model"
    versions = sorted(str(p.relative_to(saved)) for p in saved.glob("*/*") if p.is_dir())
    return f"SavedModel version {', '.join(versions)}" if versions else ""


def _convert_headline(task_dir: Path) -> str:
    report = _json(task_dir / "tflite", "report.json")
    if not report:
        return ""
    variants = report["variants"]
    passed = sum(bool(v["passed"]) for v in variants.values())
    sizes = ", ".join(f"{name} {v['size_bytes'] / 1024:.0f} KiB" for name, v in variants.items())
    return f"{passed} of {len(variants)} variants checked and passed: {sizes}"


def _deploy_headline(task_dir: Path) -> str:
    endpoint = _json(task_dir / "endpoint")
    if not endpoint:
        return ""
    return f"{endpoint['target']}: version {endpoint['version']} → {endpoint['model_path']}"


_HEADLINES = {"prepare-data": _data_headline, "pretrain": _pretrain_headline,
              "train": _train_headline,
              "evaluate-parity": _evaluate_headline, "parity-gate": _gate_headline,
              "compare-serving": _compare_headline, "serving-gate": _serving_gate_headline,
              "export-savedmodel": _export_headline, "convert-tflite": _convert_headline,
              "deploy-serving": _deploy_headline}


def gate_failure(evaluate_dir: Path) -> tuple[list[str], list[str]]:
    """The failed checks of an evaluate task's verdict (`name: why`), and its notes.

    A check is explained by its sentence or its measured value against its threshold; a note
    says what no check can (a test split too small to decide). ([], []) when the gate passed
    or the verdict cannot be read.
    """
    from ampflow.artifacts.verdict import explain_check, load_verdict
    from ampflow.errors import ModelLoadError

    try:
        verdict = load_verdict(Path(evaluate_dir) / "verdict")
    except (ModelLoadError, OSError):
        return [], []
    if verdict["passed"]:
        return [], []
    notes = [n for n in verdict.get("notes") or [] if isinstance(n, str)]
    return [explain_check(c) for c in verdict["failed_checks"]], notes


def serving_failure(compare_dir: Path) -> str | None:
    """Why the comparison with the model serving refused the model; None if it passed.

    The refusal carries the paired numbers and what the test could detect.
    """
    from ampflow.components.evaluate_parity.serving_gate import SERVING_VERDICT_FILE, refusal

    verdict = _json(Path(compare_dir) / "comparison", SERVING_VERDICT_FILE)
    if not verdict or verdict.get("passed") is not False:
        return None
    return refusal(verdict)


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
