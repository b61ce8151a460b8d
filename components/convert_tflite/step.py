"""convert: SavedModel → TFLite in four variants, each checked against the SavedModel and gated.

Reads the export step's SavedModel (docs/ARTIFACTS.md: `serving_default` takes float32 raw
pixels, returns `probabilities` and `class_ids`) and the prepared dataset. Writes into
`output_dir` (through a temp dir renamed into place): `<variant>.tflite` + `<variant>.json` per
variant, `report.json`, `report.md` and `config.json`. A failed gate still publishes the report
(a verdict is an artifact) and then raises `GateFailedError`.

A text SavedModel (ampflow_export.json `"modality": "text"`) is converted from its `token_ids`
signature, with token ids of real sentences and the vocabulary copied beside the variants
(text_inputs.py); `_inputs_of` asks modalities.py once for the SavedModel's (image_inputs.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.versions import list_versions
from ampflow.components.convert_tflite.config import ConvertConfig
from ampflow.components.convert_tflite.edge import edge_check, edge_gates, edge_plan
from ampflow.components.convert_tflite.variants import SavedModelConverter
from ampflow.errors import ConfigError, GateFailedError, ModelConfigError
from ampflow.files import ensure_writable_dir, staging_dir, write_json_atomic
from ampflow.serving.model_format import CLASS_IDS_OUTPUT, PROBABILITIES_OUTPUT

log = logging.getLogger(__name__)

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class VariantResult:
    """One produced variant: where it is, what it measured, whether it passed its gate."""

    variant: str
    tflite_path: Path
    metadata_path: Path
    size_bytes: int
    metrics: dict[str, Any]
    checks: list[dict[str, Any]]
    passed: bool


@dataclass(frozen=True)
class ConvertResult:
    """What `run_convert` produced; paths are final (after the rename into place)."""

    output_dir: Path
    report_json: Path
    report_md: Path
    variants: dict[str, VariantResult]
    reference: dict[str, Any]
    passed: bool


def run_convert(config: ConvertConfig) -> ConvertResult:
    """Convert, check and gate every requested variant; write the models and the report."""
    from ampflow.components.convert_tflite.report import write_reports
    from ampflow.data import load_dataset_info

    ensure_writable_dir(Path(config.output_dir).parent, "output_dir's parent")
    edge = edge_plan(config)  # before any compute: edge_check=True without LiteRT fails now
    saved_model_dir = resolve_saved_model_dir(config.saved_model_dir)
    info = load_dataset_info(config.data_dir)
    inputs = _inputs_of(saved_model_dir, info, config)  # the one place that decides modality
    reference, labels = inputs.reference, inputs.labels
    ref_probs = reference.predict(inputs.reference_inputs, config.batch_size,
                                  desc="check the SavedModel")
    ref_summary = _reference_summary(reference, saved_model_dir, inputs.reference_inputs,
                                     labels, ref_probs, config)
    labels_list = _labels(saved_model_dir, info)
    results: dict[str, VariantResult] = {}
    converter = SavedModelConverter(saved_model_dir, inputs.signature_key,  # one for all
                                    loaded=reference.loaded)  # not loaded again
    with staging_dir(config.output_dir, replaces="report.json") as tmp:
        shipped = inputs.ship(tmp)
        for i, variant in enumerate(config.variants, 1):
            position = f"{variant} (variant {i}/{len(config.variants)})"
            log.info("%s: converting", position)  # one opaque call; full_int8 calibrates
            results[variant] = _convert_and_check(
                config, variant, converter, inputs, tmp, ref_probs, ref_summary, labels_list,
                edge, position)
        _add_size_ratios(results)
        passed = all(r.passed for r in results.values())
        report = _report_payload(config, ref_summary, results, edge, passed)
        report["modality"] = inputs.modality  # the data's and the SavedModel's
        if shipped:
            report["shipped_files"] = shipped
        write_reports(tmp, report)
        write_json_atomic(tmp / CONFIG_FILE, _config_dict(config))
    output_dir = Path(config.output_dir)
    results = {v: _relocate(r, output_dir) for v, r in results.items()}
    result = ConvertResult(output_dir, output_dir / REPORT_JSON, output_dir / REPORT_MD,
                           results, ref_summary, passed)
    if not passed:
        raise GateFailedError(_gate_message(results, result.report_md))
    return result


def resolve_saved_model_dir(path: str | os.PathLike) -> Path:
    """A version dir as given, or the highest numbered version below a model dir (TF Serving)."""
    path = Path(path)
    if (path / "saved_model.pb").is_file():
        return path
    versions = list_versions(path)  # the one rule of serving/model_format.py, as a server reads
    if not versions:  # a flag naming no SavedModel: a configuration error (exit 2)
        raise ModelConfigError(
            f"saved_model_dir must be a SavedModel version dir (holding saved_model.pb) or a "
            f"model dir with numbered versions. Received: saved_model_dir={str(path)!r}")
    return path / str(versions[-1])


def _convert_and_check(config, variant, converter: SavedModelConverter, inputs, tmp: Path,
                       ref_probs, ref_summary, labels_list, edge,
                       position: str | None = None) -> VariantResult:
    from ampflow.components.convert_tflite import checks
    from ampflow.components.convert_tflite.explain import explain_unfrozen_variables
    from ampflow.components.convert_tflite.report import variant_metadata

    saved_model_dir = Path(converter.saved_model_dir)
    examples, labels, key = inputs.model_inputs, inputs.labels, inputs.signature_key
    representative = inputs.representative(config) if variant == "full_int8" else None
    flatbuffer = converter.convert(variant, representative=representative,
                                   int8_io=config.int8_io,
                                   input_shape=inputs.reference.input_shape)
    path = tmp / f"{variant}.tflite"
    path.write_bytes(flatbuffer)
    runner = checks.TFLiteRunner(path, signature_key=key, num_threads=config.num_threads)
    if runner.tensor_dtypes().get("object"):  # resource tensors: variables left unfrozen
        raise explain_unfrozen_variables(variant=variant, source=str(saved_model_dir))
    position = position or variant
    out, failures = _predict_each_that_runs(runner, examples, config.batch_size,
                                            f"check {position}")
    metrics = _accuracy_metrics(out, labels, ref_probs, ref_summary["accuracy"])
    metrics["size_bytes"] = len(flatbuffer)
    metrics.update(failures)
    runs = out["ran"]
    metrics["timing"] = dataclasses.asdict(runner.time(
        examples[runs], runs=config.latency_runs, warmup=config.warmup_runs,
        batch_size=config.batch_size)) if runs.all() else None
    metrics["tensor_dtypes"] = runner.tensor_dtypes()
    metrics["edge"] = (edge_check(config, path, examples, out, edge, variant=variant,
                                  ref_probs=ref_probs, labels=labels, position=position,
                                  signature_key=key)
                       if runs.all() else {"status": "skipped",
                                           "reason": "the model fails to run on some inputs"})
    gate_checks = _gate_checks(config, variant, metrics)
    passed = all(c["passed"] for c in gate_checks)
    log.info("%s: %d bytes, accuracy %.4f, agreement %.4f, gate %s", variant, len(flatbuffer),
             metrics["accuracy"], metrics["agreement"], "passed" if passed else "FAILED")
    meta_path = tmp / f"{variant}.json"
    rep_info = None
    if representative is not None:
        rep_info = {"split": "train", "size": len(representative), "seed": config.seed}
    metadata = variant_metadata(
        variant, runner.io_details(), labels_list, saved_model_dir, config, metrics,
        gate_checks, passed, rep_info, hashlib.sha256(flatbuffer).hexdigest())
    metadata["signature_key"] = key
    write_json_atomic(meta_path, metadata | inputs.variant_extras())
    return VariantResult(variant, path, meta_path, len(flatbuffer), metrics, gate_checks, passed)


def _predict_each_that_runs(runner, examples, batch_size: int, desc: str):
    """The variant's outputs, and which examples it could not run on (and the first error).

    A model that converts may still fail in the interpreter on some inputs (a kernel's own
    check: full_int8's DIV refuses a quantized divisor whose int8 value is 0). Then each
    example is run alone, so the report can say how many fail and how the rest agree; a failed
    example answers nothing (class -1, probabilities NaN), wrong for accuracy and agreement.
    """
    try:
        out = runner.predict(examples, batch_size, desc=desc)
        return out | {"ran": np.ones(len(examples), bool)}, {"failed_examples": 0}
    except (RuntimeError, ValueError) as e:
        first_error = str(e).strip().splitlines()[0]
    log.warning("%s: the interpreter fails on a batch (%s); running each example alone",
                desc, first_error)
    probs, ids, ran = [], [], []
    for example in examples:
        try:
            one = runner.predict(example[None], 1)
            probs.append(one[PROBABILITIES_OUTPUT][0])
            ids.append(int(one[CLASS_IDS_OUTPUT][0]))
            ran.append(True)
        except (RuntimeError, ValueError):
            probs.append(None)
            ids.append(-1)
            ran.append(False)
    width = next((len(p) for p in probs if p is not None), 1)
    probs = np.stack([p if p is not None else np.full(width, np.nan, np.float32)
                      for p in probs])
    failed = int(len(ran) - sum(ran))
    answers = {PROBABILITIES_OUTPUT: probs, CLASS_IDS_OUTPUT: np.asarray(ids),
               "ran": np.asarray(ran)}
    return answers, {"failed_examples": failed, "first_error": first_error}


def _accuracy_metrics(out, labels, ref_probs, ref_accuracy: float) -> dict[str, Any]:
    probs, ids = out[PROBABILITIES_OUTPUT], np.asarray(out[CLASS_IDS_OUTPUT])
    accuracy = float(np.mean(ids == labels))
    ran = out.get("ran", np.ones(len(ids), bool))
    diff = np.abs(probs[ran].astype(np.float64) - ref_probs[ran])
    if not ran.any():
        diff = np.zeros(1)
    agrees = ids == np.argmax(ref_probs, axis=-1)
    extra = {} if ran.all() else {  # how the examples it could run on agree
        "agreement_where_ran": float(np.mean(agrees[ran])) if ran.any() else None}
    return extra | {
        "accuracy": accuracy,
        "accuracy_drop_points": (ref_accuracy - accuracy) * 100.0,
        "agreement": float(np.mean(agrees)),
        "max_abs_prob_diff": float(diff.max()),
        "mean_abs_prob_diff": float(diff.mean()),
        "num_examples": int(len(labels)),
    }


def _gate_checks(config: ConvertConfig, variant: str, metrics: dict) -> list[dict[str, Any]]:
    triples = list(config.gates_for(variant))
    if metrics["failed_examples"]:  # a model that fails in the interpreter: said as a gate
        triples.append(("failed_examples", "<=", 0))
    values = {name: metrics[name] for name, _, _ in triples}
    for name, op, threshold, value in edge_gates(config, variant, metrics["edge"]):
        triples.append((name, op, threshold))
        values[name] = value
    checks = []
    for name, op, threshold in triples:
        value = values[name]
        ok = value >= threshold if op == ">=" else value <= threshold
        checks.append({"name": name, "value": value, "op": op, "threshold": threshold,
                       "passed": bool(ok)})
    return checks


def _gate_message(results: dict[str, VariantResult], report: Path) -> str:
    failed = [f"{r.variant}: {c['name']} must be {c['op']} {c['threshold']:g}. Received: "
              f"{c['name']}={c['value']:.6g}"
              for r in results.values() for c in r.checks if not c["passed"]]
    return f"TFLite gate failed ({'; '.join(failed)}). See {report}"


def _inputs_of(saved_model_dir: Path, info: dict, config: ConvertConfig):
    """The conversion inputs for the SavedModel's modality (modalities.py): asked here, once.

    The data's modality (dataset_info.json) must be the SavedModel's (ampflow_export.json).
    """
    from ampflow.components.convert_tflite.modalities import inputs_of, savedmodel_modality
    from ampflow.data.modalities import modality_of

    data, model = modality_of(info), savedmodel_modality(saved_model_dir)
    if data is not model:
        raise ConfigError(f"data_dir must hold the data of the SavedModel ({model.name})."
                          f" Received: {data.name} data in {config.data_dir}")
    return inputs_of(model, saved_model_dir, info, config)


def _reference_summary(reference, saved_model_dir: Path, images, labels, probs, config):
    timing = reference.time(images, runs=config.latency_runs, warmup=config.warmup_runs,
                            batch_size=config.batch_size)
    size = sum(p.stat().st_size for p in saved_model_dir.rglob("*")
               if p.is_file() and "assets.extra" not in p.parts)
    return {
        "saved_model_dir": str(saved_model_dir),
        "accuracy": float(np.mean(np.argmax(probs, axis=-1) == labels)),
        "size_bytes": size,
        "timing": dataclasses.asdict(timing),
        "input_shape": list(reference.input_shape),
    }


def _labels(saved_model_dir: Path, info: dict) -> list[str]:
    path = saved_model_dir / "assets" / "labels.txt"
    if path.is_file():
        return [line for line in path.read_text().splitlines() if line]
    return [str(name) for name in info.get("class_names", [])]


def _add_size_ratios(results: dict[str, VariantResult]) -> None:
    if "float32" not in results:
        return
    base = results["float32"].size_bytes
    for r in results.values():
        r.metrics["size_ratio_vs_float32"] = base / r.size_bytes


def _report_payload(config, ref_summary, results, edge, passed) -> dict:
    import platform

    import tensorflow as tf

    return {
        "passed": passed,
        "saved_model": ref_summary,
        "variants": {v: {"file": r.tflite_path.name, "metadata": r.metadata_path.name,
                         "passed": r.passed, "checks": r.checks, **r.metrics}
                     for v, r in results.items()},
        "edge_check": {k: v for k, v in edge.items() if k != "enabled"} | {
            "enabled": edge["enabled"]},
        "environment": {"tensorflow": tf.__version__, "machine": platform.machine(),
                        "cpu_count": os.cpu_count(), "num_threads": config.num_threads,
                        "delegate": "XNNPACK (interpreter default)"},
        "config": _config_dict(config),
    }


def _relocate(result: VariantResult, output_dir: Path) -> VariantResult:
    return dataclasses.replace(result, tflite_path=output_dir / result.tflite_path.name,
                               metadata_path=output_dir / result.metadata_path.name)


def _config_dict(config: ConvertConfig) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v)
            for k, v in dataclasses.asdict(config).items()}
