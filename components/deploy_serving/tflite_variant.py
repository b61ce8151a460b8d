"""Publish one TFLite variant the convert step produced as the served version, and its canary.

A variant is refused before anything is published when the convert report does not list it,
its gate failed, its sha256 is not the converter's, it does not load, or its answers to the
recorded examples break its own gate. The canary expects the variant's own answers (a quantized
model answers differently from the SavedModel), and checks those against the SavedModel's within
the variant's gate, on the examples it can tell apart. Why, with the measurements:
docs/explanation/design-notes.md, "tflite_variant.py".
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.canary_examples import CanaryExamples
from ampflow.components.deploy_serving.model_store import SignatureSpec
from ampflow.errors import ConfigError, ModelLoadError
from ampflow.serving.model_format import CLASS_IDS_OUTPUT, PROBABILITIES_OUTPUT
from ampflow.serving.model_format import DEFAULT_SIGNATURE as SIGNATURE

REPORT_JSON = "report.json"  # convert_tflite/step.py's REPORT_JSON (step.py imports TF-heavy code)
# The gate checks of the converter's report that compare the variant with the SavedModel
# on examples without labels: metric name -> how it is measured on the recorded examples.
_SAVED_MODEL_CHECKS = ("agreement", "max_abs_prob_diff")


@dataclass(frozen=True)
class TFLiteVariant:
    """One variant of the convert output, as its report describes it."""

    name: str
    tflite: Path
    metadata: Path
    checks: tuple[dict[str, Any], ...]  # the report's gate checks of this variant
    measured_max_prob_diff: float  # the converter's max |p - SavedModel p| on the test split
    signature_key: str = SIGNATURE  # the flatbuffer's signature (token_ids for a text model)
    tokenizer_files: tuple[Path, ...] = ()  # a text variant's vocabulary, shipped beside it


@dataclass(frozen=True)
class Published:
    """A checked, staged variant: the signature the canary calls and the answers it expects."""

    spec: SignatureSpec
    expected: CanaryExamples


def select_variant(tflite_dir: Path, variant: str) -> TFLiteVariant:
    """The variant the report lists as produced and passed, its file the one it checked."""
    report = _read_report(Path(tflite_dir))
    produced = report.get("variants") or {}
    if variant not in produced:
        raise ConfigError(
            f"tflite_variant must be one the convert step produced in {tflite_dir} "
            f"({', '.join(sorted(produced)) or 'none'}). Received: tflite_variant={variant!r}")
    entry = produced[variant]
    checks = tuple(entry.get("checks") or ())
    if not entry.get("passed"):
        failed = [f"{c['name']} = {c['value']:.6g} (must be {c['op']} {c['threshold']:g})"
                  for c in checks if not c.get("passed")]
        raise ConfigError(
            f"tflite_variant={variant!r} failed the convert step's gate ({'; '.join(failed)}; "
            f"see {Path(tflite_dir) / 'report.md'}); a failed variant is never published")
    tflite = Path(tflite_dir) / entry.get("file", f"{variant}.tflite")
    metadata = Path(tflite_dir) / entry.get("metadata", f"{variant}.json")
    described = _check_same_file(tflite, metadata)
    tokenizer = described.get("tokenizer") or {}
    files = tuple(Path(tflite_dir) / tokenizer[key]
                  for key in ("vocabulary_file", "settings_file") if tokenizer.get(key))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ConfigError(f"tflite_variant={variant!r} takes token ids made with the vocabulary "
                          f"the convert step ships beside it; missing: {', '.join(missing)}")
    return TFLiteVariant(variant, tflite, metadata, checks,
                         float(entry.get("max_abs_prob_diff") or 0.0),
                         described.get("signature_key") or SIGNATURE, files)


def _read_report(tflite_dir: Path) -> dict[str, Any]:
    path = tflite_dir / REPORT_JSON
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"tflite_dir must be the convert step's output dir, holding "
                          f"{REPORT_JSON}. Received: tflite_dir={str(tflite_dir)!r}, which has "
                          "none") from e
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read as the convert report: {e}") from e
    if not isinstance(report, dict):
        raise ConfigError(f"{path} must hold the convert report (a JSON object). Received: "
                          f"{type(report).__name__}")
    return report


def _check_same_file(tflite: Path, metadata: Path) -> dict[str, Any]:
    """The variant's JSON, once the .tflite is proven the bytes the converter checked."""
    try:
        described = json.loads(metadata.read_text())
        recorded = described.get("sha256")
        digest = hashlib.sha256(tflite.read_bytes()).hexdigest()
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"the convert step's {tflite.name} and {metadata.name} must be "
                          f"readable: {e}") from e
    if recorded != digest:
        raise ConfigError(
            f"{tflite} is not the file the convert step checked (sha256 {digest[:12]}…, "
            f"{metadata.name} records {str(recorded)[:12]}…): damaged or replaced since; "
            "convert again")
    return described


@contextlib.contextmanager
def staged_version(variant: TFLiteVariant) -> Iterator[Path]:
    """A temp dir laid out as the served version: `<variant>.tflite` and `<variant>.json`.

    A text variant's vocabulary files go beside them, as the convert step ships them.
    """
    with tempfile.TemporaryDirectory(prefix="ampflow-tflite-") as tmp:
        staged = Path(tmp) / "version"
        staged.mkdir()
        for path in (variant.tflite, variant.metadata, *variant.tokenizer_files):
            shutil.copyfile(path, staged / path.name)
        yield staged


def expected_answers(staged: Path, variant: TFLiteVariant,
                     recorded: CanaryExamples) -> Published:
    """The variant's own answers to the recorded examples, checked against its gate (doc, 1-2)."""
    from ampflow.serving.models.tflite import TFLiteServable

    try:
        servable = TFLiteServable(variant.name, 1, staged)
    except ModelLoadError as e:
        raise ConfigError(f"tflite_variant={variant.name!r}: {variant.tflite} does not load, "
                          f"so no server could serve it: {e}") from e
    key = variant.signature_key
    if not servable.can_run(key):
        raise ConfigError(f"{variant.tflite} must carry the {key!r} signature its JSON names "
                          "and the canary calls. Received: " + ", ".join(servable.signature_defs))
    spec = SignatureSpec.of(key, servable.signature_defs[key])
    requests = variant_requests(variant, spec, recorded)
    try:
        outputs = servable.run(key, {requests.input_key: requests.images})
    except (ValueError, RuntimeError, KeyError) as e:
        raise ConfigError(f"{variant.tflite} cannot answer the recorded examples "
                          f"({requests.images.dtype} {list(requests.images.shape)} on "
                          f"{requests.input_key!r}): {e}") from e
    expected = dataclasses.replace(
        requests, probabilities=np.asarray(outputs[PROBABILITIES_OUTPUT], dtype=np.float32),
        class_ids=np.asarray(outputs[CLASS_IDS_OUTPUT], dtype=np.int64))
    check_against_saved_model(expected, recorded, variant)
    return Published(spec, expected)


def variant_requests(variant: TFLiteVariant, spec: SignatureSpec,
                     recorded: CanaryExamples) -> CanaryExamples:
    """The recorded examples as the variant takes them (answers still the SavedModel's).

    The variant's signature has one input. Without shipped vocabulary files it takes what the
    SavedModel took (the recorded images); with them, the recorded sentences tokenized with
    that vocabulary by the convert step's own rule (text_inputs.token_ids).
    """
    if len(spec.inputs) != 1:
        raise ConfigError(f"{variant.tflite}'s {spec.name!r} signature must take one input. "
                          f"Received: {sorted(spec.inputs)}")
    (input_key,) = spec.inputs
    values = recorded.images
    if variant.tokenizer_files:
        from ampflow.modeling.tokenizer import load_tokenizer, token_ids

        tokenizer = load_tokenizer(variant.tokenizer_files[0].parent)
        values = token_ids(tokenizer, list(recorded.images))
    return dataclasses.replace(recorded, images=values, input_key=input_key)


def check_against_saved_model(answers: CanaryExamples, recorded: CanaryExamples,
                              variant: TFLiteVariant) -> None:
    """ConfigError unless `answers` pass the variant's own gate against the recorded answers."""
    if answers.probabilities.shape != recorded.probabilities.shape:
        raise ConfigError(
            f"tflite_variant={variant.name!r} answers probabilities of shape "
            f"{list(answers.probabilities.shape)} to the recorded examples; the SavedModel "
            f"answered {list(recorded.probabilities.shape)}: another model?")
    thresholds = {c.get("name"): c.get("threshold") for c in variant.checks}
    tolerance = thresholds.get("max_abs_prob_diff", variant.measured_max_prob_diff)
    top2 = np.sort(recorded.probabilities, axis=1)[:, -2:]
    decidable = (top2[:, 1] - top2[:, 0]) > 2 * tolerance
    same = answers.class_ids == recorded.class_ids
    observed = {
        "agreement": float(np.mean(same[decidable])) if decidable.any() else 1.0,
        "max_abs_prob_diff": float(np.max(np.abs(
            answers.probabilities.astype(np.float64) - recorded.probabilities))),
    }
    failed = []
    for check in variant.checks:
        name = check.get("name")
        if name not in _SAVED_MODEL_CHECKS:
            continue
        value, op, threshold = observed[name], check["op"], check["threshold"]
        if not (value >= threshold if op == ">=" else value <= threshold):
            failed.append(f"{name} = {value:.6g} (the gate's bound: {op} {threshold:g})")
    if failed:
        raise ConfigError(
            f"tflite_variant={variant.name!r} does not answer the SavedModel's "
            f"{len(recorded.images)} recorded examples within its own convert gate "
            f"(agreement on the {int(decidable.sum())} whose top two probabilities are more "
            f"than 2 x {tolerance:.3g} apart): {'; '.join(failed)}; was it converted from this "
            "SavedModel version?")
