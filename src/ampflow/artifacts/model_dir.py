"""The train step's artifact contract: what a published model dir holds, and how to load it.

docs/ARTIFACTS.md ("train → a model dir") is the prose of this module. A published dir holds
`model.keras`, `metadata.json` (written LAST: its presence publishes the model), `config.json`,
`loss_scale_history.json`, `amp_report.json`, `tensorboard/`; a model trained on text also holds
its tokenizer, `vocab.txt` and `tokenizer.json` (src/ampflow/modeling/tokenizer.py), because the
model takes token ids and every later step must turn text into the same ids.

Later steps load a model dir with ONE call, `load_trained(model_dir)`: the Keras model, its
metadata and, for a text model, its tokenizer. `load_trained_model` (model and metadata) is the
older two-value form, kept for the image steps that call it. Free of TensorFlow at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampflow.data.modalities import Modality, modality_of
from ampflow.errors import ConfigError, ModelLoadError
from ampflow.files import read_json
from ampflow.modeling.tokenizer import TOKENIZER_FILE, VOCAB_FILE

METADATA_FILE = "metadata.json"
CONFIG_FILE = "config.json"
MODEL_FILE = "model.keras"
HISTORY_FILE = "loss_scale_history.json"
EPOCH_LOG_FILE = "epochs.jsonl"
AMP_REPORT_FILE = "amp_report.json"  # the AMP pre-flight's findings (train/amp_report.py)
# A text model's tokenizer, beside its model.keras (tokenizer.py writes and reads them).
TOKENIZER_FILES = (VOCAB_FILE, TOKENIZER_FILE)
# What later steps read from metadata.json to rebuild, evaluate and export the model.
REQUIRED_METADATA = ("architecture", "input_shape", "num_classes", "precision")
# The key older models kept the architecture under (now the served name's, everywhere else).
_OLD_ARCHITECTURE_KEY = "model_name"


@dataclass(frozen=True)
class TrainedModel:
    """A published model: the Keras model, its metadata.json, and its tokenizer if it reads text.

    `inputs(batch)` is what the model takes from what a client sends: a text model's raw
    strings become its token ids (the tokenizer it was trained with); images pass unchanged.
    """

    model: Any
    metadata: dict[str, Any]
    tokenizer: Any = None  # tokenizer.TextTokenizer for a text model, else None

    @property
    def modality(self) -> str:
        """`"text"` or `"image"`: what the model was trained on (None before text: image)."""
        return self.kind.name

    @property
    def kind(self) -> Modality:
        """The modality seam (ampflow.data.modalities) of what the model was trained on."""
        return modality_of(self.metadata)

    def inputs(self, batch):
        """The model's input for `batch`: token ids of raw strings (text), else `batch` itself."""
        return self.kind.model_inputs(batch, self.tokenizer)


def load_trained(model_dir: str | os.PathLike) -> TrainedModel:
    """Load a published model dir: the model, its metadata and (text) its tokenizer.

    The one loader later steps (evaluate, export, convert) need: a text model's tokenizer files
    missing or damaged is a ModelLoadError, as a missing model.keras is.
    """
    model, metadata = load_trained_model(model_dir)
    tokenizer = modality_of(metadata).load_preprocessor(model_dir)
    return TrainedModel(model, metadata, tokenizer)


def load_trained_model(model_dir: str | os.PathLike):
    """Load a published model dir → `(keras.Model, metadata)`; ModelLoadError if incomplete.

    A text model also needs its tokenizer: `load_trained` loads all three.
    """
    import keras

    import ampflow.modeling.bert  # noqa: F401  (a pretrained checkpoint's encoder layers)
    import ampflow.modeling.layers  # noqa: F401  (registers FusedBatchNormalization)
    import ampflow.modeling.pretrained_text  # noqa: F401  (a checkpoint model's segment ids)
    import ampflow.modeling.text_layers  # noqa: F401  (the text models' layers)

    model_dir = Path(model_dir)
    metadata_path, model_path = model_dir / METADATA_FILE, model_dir / MODEL_FILE
    # (the user's module, named in the metadata, is imported before loading: see below)
    if not metadata_path.is_file() or not model_path.is_file():
        from ampflow.errors import ModelConfigError  # a flag naming no model: exit 2

        raise ModelConfigError(
            f"{model_dir} is not a published model: expected {MODEL_FILE} and {METADATA_FILE} "
            "(a run that failed or is still going publishes neither)."
        )
    try:
        metadata = read_json(metadata_path)
    except ValueError as e:
        raise ModelLoadError(f"{metadata_path} is corrupt: {e}") from e
    if isinstance(metadata, dict) and "architecture" not in metadata \
            and _OLD_ARCHITECTURE_KEY in metadata:  # a model published before the rename
        metadata["architecture"] = metadata[_OLD_ARCHITECTURE_KEY]
    missing = [k for k in REQUIRED_METADATA if not isinstance(metadata, dict) or k not in metadata]
    if missing:
        raise ModelLoadError(f"{metadata_path} must hold {list(REQUIRED_METADATA)}. "
                             f"Received: missing {missing}")
    _check_keras_archive(model_path)
    custom_objects = _user_custom_objects(model_path, metadata)
    try:
        model = keras.saving.load_model(model_path, compile=False, custom_objects=custom_objects)
    except Exception as e:  # the archive is intact (checked above): Keras cannot rebuild it
        from ampflow.modeling.user_model import last_line

        raise ModelLoadError(
            f"{model_path} is intact but Keras cannot rebuild the model from it (a custom layer "
            f"whose config does not rebuild it is the usual cause; `ampflow check-model` names "
            f"the layer). Received: {last_line(e)}") from e
    return model, metadata


def _user_custom_objects(model_path: Path, metadata: dict) -> dict:
    """The user's custom layers in `model.keras`, imported from the run's --model-path."""
    from ampflow.modeling.user_model import custom_objects_in

    user_path = (metadata.get("config") or {}).get("model_path")
    try:
        return custom_objects_in(model_path, user_path)
    except ConfigError as e:
        raise ModelLoadError(f"the model's own code cannot be loaded: {e}") from e


def _check_keras_archive(model_path: Path) -> None:
    """A `.keras` file is a zip; a truncated or overwritten one gets its own clear message.

    Keras reports such a file as "File not found", which sends users looking for a path
    problem.
    """
    import zipfile

    try:
        with zipfile.ZipFile(model_path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        size = model_path.stat().st_size
        raise ModelLoadError(
            f"{model_path} is not a readable .keras archive (truncated or corrupt, "
            f"{size} bytes): {e}. Re-run the step that produced it.") from e
    if damaged is not None:
        raise ModelLoadError(f"{model_path} is corrupt: archive member {damaged!r} fails its "
                             "CRC check. Re-run the step that produced it.")
