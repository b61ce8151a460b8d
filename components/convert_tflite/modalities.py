"""convert's side of the modality seam: a SavedModel's modality and its conversion inputs.

`savedmodel_modality` reads what export wrote; `inputs_of` gives the inputs step.py converts
and checks with (image_inputs.py, text_inputs.py): the reference, the test split, the
representative data of full_int8, what is shipped beside the .tflite files. A new modality
adds its entry to INPUTS and, where its SavedModel can lack ampflow_export.json, to SIGNATURES.
"""

from __future__ import annotations

import json
from pathlib import Path

from ampflow.artifacts.signature_names import TOKEN_IDS_SIGNATURE
from ampflow.data.modalities import IMAGE, TEXT, Modality, modality_named
from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT
from ampflow.errors import ModelLoadError

# The signature only one modality's SavedModel has: how one copied without its
# ampflow_export.json is still known (image: none, the default).
SIGNATURES = {TOKEN_IDS_SIGNATURE: TEXT}


def savedmodel_modality(saved_model_dir: Path) -> Modality:
    """What the SavedModel reads, from its ampflow_export.json's `modality`.

    Without one (a SavedModel copied without it): the modality of a signature only it has.
    """
    from ampflow.serving.model_format import serving_signature_defs

    path = Path(saved_model_dir) / "ampflow_export.json"
    try:
        return modality_named(json.loads(path.read_text()).get("modality"))
    except (OSError, ValueError):
        try:
            keys = serving_signature_defs(saved_model_dir)
        except ModelLoadError:
            return IMAGE  # unreadable: the reference's load says why
        return next((SIGNATURES[k] for k in keys if k in SIGNATURES), IMAGE)


def _image(saved_model_dir, info, config):
    from ampflow.components.convert_tflite.image_inputs import ImageInputs

    return ImageInputs.of(saved_model_dir, info, config)


def _text(saved_model_dir, info, config):
    from ampflow.components.convert_tflite.text_inputs import TextInputs

    return TextInputs.of(saved_model_dir, config)


INPUTS = {MODALITY_IMAGE: _image, MODALITY_TEXT: _text}


def inputs_of(modality: Modality, saved_model_dir: Path, info: dict, config):
    """The conversion inputs of a SavedModel of `modality` (config: a step.ConvertConfig)."""
    return INPUTS[modality.name](saved_model_dir, info, config)
