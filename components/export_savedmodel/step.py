"""export: a versioned SavedModel for TF Serving, from the float32 twin of the trained model.

An image model is exported with the image signatures (image_export.py), a text model with
the text signatures, its tokenizer in the graph (text_export.py); `_export_of` asks
modalities.py for the one that fits the trained model's modality, once.

A model trained under a mixed policy keeps float16/bfloat16 ops in any graph traced from it,
which TFLite and many CPU servers reject; so the same architecture is rebuilt under `float32`
and given the trained weights (they are float32 under every policy), and that twin is exported.

Order of work (docs/ARTIFACTS.md): the gate first (no compute on a refused model), then the
SavedModel into a hidden staging dir beside the versions, its signatures checked against the
contract, its graph scanned for half-precision, warm-up records written and replayed, and the
reloaded model compared with Keras on real test images, and its answers to a few of them
recorded for deployment canaries (canary_examples.py). Only then is the staging dir renamed
to `<export_base>/<model_name>/<version>/`, so TF Serving never sees a half-made version.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampflow.artifacts.canary_examples import (
    CANARY_FILE,
    DEFAULT_EXAMPLES,
)
from ampflow.artifacts.versions import (
    next_version,
    staged_version_dir,
)
from ampflow.components.export_savedmodel.gate import GateDecision, check_gate, check_model
from ampflow.errors import ConfigError, ExportError, ModelLoadError
from ampflow.files import ensure_writable_dir, write_json_atomic
from ampflow.serving.model_format import (
    DEFAULT_MODEL_NAME,
    MAX_WARMUP_RECORDS,
    WARMUP_FILE,
    check_model_name,
)

log = logging.getLogger(__name__)

# Besides the Predict requests on real images, the warm-up file holds one image_bytes request
# and one Classify request, within TF Serving's limit of MAX_WARMUP_RECORDS.
_MAX_PREDICT_WARMUP = MAX_WARMUP_RECORDS - 2

EXPORT_METADATA_FILE = "ampflow_export.json"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class ExportConfig:
    """What to export, where, and how strictly; written next to the SavedModel (config.json)."""

    model_dir: Path = field(metadata={"help": "A trained model dir (from train)."})
    data_dir: Path = field(metadata={
        "help": "The prepared dataset dir: real test images (a text model: sentences) for "
                "warm-up and the parity check."})
    export_base: Path = field(metadata={
        "help": "TF Serving base path; the model lands in <export_base>/<model_name>/<version>/."})
    eval_dir: Path | None = field(default=None, metadata={
        "help": "The evaluate step's output dir (its verdict.json gates the export). Required "
                "unless --force."})
    model_name: str = field(default=DEFAULT_MODEL_NAME, metadata={
        "help": "Served model name (TF Serving's --model_name): the version lands in "
                "<export_base>/<model_name>/<version>/. The architecture is recorded in "
                "ampflow_export.json, not in this name."})
    version: int | None = field(default=None, metadata={
        "help": "Version number to write (default: the next free one; an existing version is "
                "never replaced)."})
    num_warmup_records: int = field(default=10, metadata={
        "help": f"Predict warm-up requests to write (one real test image or sentence each; "
                f"plus one image_bytes or token_ids request and one Classify request); 0 writes "
                f"no warm-up file; at most {_MAX_PREDICT_WARMUP}."})
    num_canary_examples: int = field(default=DEFAULT_EXAMPLES, metadata={
        "help": f"Real test images (or sentences) whose answers are recorded in {CANARY_FILE}, "
                "so that a "
                "deployment can check what a server answers against them (1 to 1000)."})
    num_parity_images: int = field(default=256, metadata={
        "help": "Real test images (or sentences) on which the SavedModel must match the Keras "
                "model."})
    # 1e-4, not 1e-5: the SavedModel's graph is optimized differently from Keras's call (e.g.
    # grappler folds inference BatchNorm into the conv before it), and float32 reassociation
    # through 50+ layers moved MobileNetV2's probabilities by 1.7e-5. A real export fault
    # (preprocessing, weights, BN in training mode) moves them by orders of magnitude more.
    parity_atol: float = field(default=1e-4, metadata={
        "help": "Export parity: absolute tolerance on probabilities (SavedModel vs Keras)."})
    parity_rtol: float = field(default=1e-5, metadata={
        "help": "Export parity: relative tolerance on probabilities (SavedModel vs Keras)."})
    force: bool = field(default=False, metadata={
        "help": "Export even if the parity verdict failed or is missing (logged loudly and "
                "recorded in ampflow_export.json). The export parity check still applies."})

    def __post_init__(self) -> None:
        if self.eval_dir is None and not self.force:
            raise ConfigError(
                "eval_dir must be given: the export is gated on the evaluate step's verdict. "
                "Received: eval_dir=None, force=False (pass --force to export ungated)")
        check_model_name(self.model_name)
        if self.version is not None and self.version <= 0:
            raise ConfigError(f"version must be > 0. Received: version={self.version}")
        if not 0 <= self.num_warmup_records <= _MAX_PREDICT_WARMUP:
            raise ConfigError(f"num_warmup_records must be in [0, {_MAX_PREDICT_WARMUP}]. "
                              f"Received: num_warmup_records={self.num_warmup_records}")
        if not 1 <= self.num_canary_examples <= 1000:
            raise ConfigError("num_canary_examples must be in [1, 1000]. "
                              f"Received: num_canary_examples={self.num_canary_examples}")
        if self.num_parity_images <= 0:
            raise ConfigError("num_parity_images must be > 0. "
                              f"Received: num_parity_images={self.num_parity_images}")
        for name in ("parity_atol", "parity_rtol"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(f"{name} must be >= 0. Received: {name}={value}")


@dataclass(frozen=True)
class ExportResult:
    """The published version dir and its metadata (the content of ampflow_export.json)."""

    version_dir: Path
    version: int
    model_name: str
    metadata: dict[str, Any]

    @property
    def model_base(self) -> Path:
        """TF Serving's `--model_base_path` for this model."""
        return self.version_dir.parent

    @property
    def forced(self) -> bool:
        """True when the export went past a failed or missing parity verdict."""
        return bool(self.metadata["gate"]["forced"])


def run_export(config: ExportConfig) -> ExportResult:
    """Gate, export the float32 twin, check it, and publish it as a new TF Serving version."""
    from ampflow.artifacts.model_dir import load_trained
    from ampflow.data import load_dataset_info

    gate = check_gate(config.eval_dir, config.force)  # a refused model costs no compute
    trained = load_trained(config.model_dir)
    meta = trained.metadata
    gate = check_model(gate, config.model_dir, config.force)
    info = load_dataset_info(config.data_dir)
    export = _export_of(trained, info, config)  # the one place that decides the modality
    model_name = config.model_name
    model_base = ensure_writable_dir(Path(config.export_base) / model_name, "export_base")
    version = config.version or next_version(model_base)

    twin = _float32_twin(trained.model, meta)
    log.info("exporting %s (trained under %s) as %s version %d", config.model_dir,
             meta["precision"]["policy"], model_name, version)
    with staged_version_dir(model_base, version) as staging:
        signatures, parity, warmup_count = export.write_and_check(
            twin, trained.model, staging, model_name, config)
        metadata = _metadata(config, meta, model_name, version, export, signatures, parity,
                             warmup_count, gate)
        for name, payload in ((CONFIG_FILE, _config_dict(config)),
                              (EXPORT_METADATA_FILE, metadata)):
            write_json_atomic(staging / name, payload).chmod(0o644)  # mkstemp made it 0600
    version_dir = model_base / str(version)
    log.info("export parity on %d examples: max |SavedModel - Keras float32| = %.3g (atol %g, "
             "rtol %g); max |SavedModel - trained %s model| = %.3g",
             parity.num_examples,
             parity.max_abs_diff, parity.atol, parity.rtol, meta["precision"]["policy"],
             parity.trained_max_abs_diff)
    if gate.forced:
        log.warning("FORCED export published at %s: %s", version_dir, gate.warning)
    return ExportResult(version_dir=version_dir, version=version, model_name=model_name,
                        metadata=metadata)


def _export_of(trained, info: dict[str, Any], config: ExportConfig):
    """The export of `trained` for its modality (modalities.py): asked for here, once.

    The model's modality (metadata.json) must be the data's (dataset_info.json): a text model
    checked on images, or the reverse, is a configuration error before any compute.
    """
    from ampflow.components.export_savedmodel.modalities import export_of
    from ampflow.data.modalities import modality_of

    data = modality_of(info)
    if trained.kind is not data:
        raise ConfigError(f"data_dir must hold the data the model was trained on "
                          f"({trained.modality}). Received: {data.name} data in "
                          f"{config.data_dir}")
    labels = _labels(trained.metadata, info, config)
    count = max(config.num_parity_images, config.num_warmup_records, config.num_canary_examples)
    return export_of(trained, info, labels, count, config)


def _float32_twin(model, meta: dict[str, Any]):
    """The same architecture under the float32 policy with the trained weights (as evaluated)."""
    from ampflow.modeling.twin import build_float32_twin

    try:
        return build_float32_twin(model, meta)
    except ModelLoadError as e:
        raise ExportError(f"could not rebuild the float32 twin: {e}") from e


def _labels(meta: dict[str, Any], info: dict[str, Any], config: ExportConfig) -> list[str]:
    """The class names in id order: the model's own, else the dataset's."""
    labels = [str(name) for name in meta.get("class_names") or info["class_names"]]
    if len(labels) != meta["num_classes"]:
        raise ExportError(f"the model has {meta['num_classes']} classes but {len(labels)} "
                          f"class names in {config.model_dir}")
    return labels


def _metadata(config: ExportConfig, meta, model_name, version, export, signatures, parity,
              warmup_count: int, gate: GateDecision) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    return {
        "model_name": model_name,
        "version": version,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
        **export.input_metadata(),
        "labels": export.labels,
        "signatures": signatures,
        "source": {"model_dir": os.fspath(Path(config.model_dir).resolve()),
                   "architecture": meta.get("architecture"),
                   "trained_policy": meta["precision"]["policy"],
                   "exported_policy": "float32"},
        "parity": parity.as_metadata(),
        "half_precision_nodes": 0,
        "warmup": {"file": str(WARMUP_FILE), "records": warmup_count},
        "canary": {"file": CANARY_FILE, "examples": config.num_canary_examples},
        "gate": gate.as_metadata(),
        "forced": gate.forced,
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
        "config": _config_dict(config),
    }


def _config_dict(config: ExportConfig) -> dict[str, Any]:
    return {k: os.fspath(v) if isinstance(v, Path) else v
            for k, v in dataclasses.asdict(config).items()}
