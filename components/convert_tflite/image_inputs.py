"""The image model's conversion inputs: raw test pixels for the reference and the variants.

The sibling of text_inputs.py, chosen by modalities.py from the SavedModel's modality. The
representative data of full_int8 is a seeded draw of training images (variants.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ampflow.data.modality import MODALITY_IMAGE
from ampflow.errors import ConfigError

# `config` below is a step.ConvertConfig (not imported: step.py imports this module's caller).


@dataclass(frozen=True)
class ImageInputs:
    """An image model's conversion inputs: raw test pixels, for the reference and the variants."""

    reference: Any  # checks.SavedModelReference
    reference_inputs: np.ndarray  # float32 raw pixels [N, H, W, C]
    labels: np.ndarray
    signature_key: str
    modality: ClassVar[str] = MODALITY_IMAGE  # report.json's

    @property
    def model_inputs(self) -> np.ndarray:
        return self.reference_inputs  # the variants take what the SavedModel takes

    @classmethod
    def of(cls, saved_model_dir: Path, info: dict, config) -> ImageInputs:
        from ampflow.components.convert_tflite import checks

        reference = checks.SavedModelReference(saved_model_dir, config.signature_key)
        _check_input_shape(reference.input_shape, info)
        images, labels = _test_split(config)
        return cls(reference, images, labels, config.signature_key)

    def representative(self, config) -> np.ndarray:
        return _representative(config)

    def ship(self, directory: Path) -> list[str]:
        return []  # an image model needs nothing beside it

    def variant_extras(self) -> dict[str, Any]:
        return {}


def _check_input_shape(input_shape: tuple, info: dict) -> None:
    if tuple(info["image_shape"]) != tuple(input_shape):
        raise ConfigError(
            f"data_dir images must match the SavedModel input {list(input_shape)}. Received: "
            f"{info['name']} images of shape {info['image_shape']}")


def _test_split(config):
    from ampflow.data import load_arrays

    images, labels = load_arrays(config.data_dir, "test", limit=config.test_limit)
    return images.astype(np.float32), labels  # raw pixel values: cast, never rescale


def _representative(config) -> np.ndarray:
    from ampflow.components.convert_tflite.variants import draw_representative

    return draw_representative(config.data_dir, config.representative_size, config.seed)
