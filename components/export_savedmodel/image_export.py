"""The image model's export: what happens inside the staging dir for a model that reads pixels.

The sibling of text_export.py, chosen by modalities.py from the trained model's modality. The
SavedModel with the image signatures (signatures.py), checked against the contract, its graph
scanned for half precision, warm-up records of real test images written and replayed, the
parity check (parity.py), and the canary answers recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.canary_examples import write_canary_examples
from ampflow.components.export_savedmodel.parity import check_export_parity
from ampflow.components.export_savedmodel.signatures import (
    LABELS_FILE,
    check_signatures,
    half_precision_nodes,
    save_servable,
)
from ampflow.components.export_savedmodel.warmup import replay_warmup_records
from ampflow.errors import ConfigError, ExportError
from ampflow.serving.model_format import (
    ENCODED_IMAGE_MAGIC,
    IMAGE_BYTES_INPUT,
    IMAGE_BYTES_SIGNATURE,
    MAX_IMAGE_PIXELS,
    write_warmup_records,
)

# `config` below is a step.ExportConfig (not imported: step.py imports this module's caller).


def image_export_of(trained, info: dict, labels: list[str], count: int, config) -> ImageExport:
    """The image export's inputs: the model's input shape, real test images."""
    return ImageExport.of(trained.metadata, info, labels, count, config)


@dataclass(frozen=True)
class ImageExport:
    """An image model's export: its input shape and real test images (as float32 pixels)."""

    input_shape: tuple[int, ...]
    images: np.ndarray
    labels: list[str]

    @classmethod
    def of(cls, meta, info, labels, count: int, config) -> ImageExport:
        from ampflow.data import load_arrays

        input_shape = tuple(meta["input_shape"])
        if tuple(info["image_shape"]) != input_shape:
            raise ConfigError(
                f"data_dir must hold images of the model's input shape {list(input_shape)}. "
                f"Received: image_shape={info['image_shape']} in {config.data_dir}")
        images, _ = load_arrays(config.data_dir, "test", limit=count)
        return cls(input_shape, images.astype(np.float32), labels)

    def write_and_check(self, twin, trained, staging: Path, model_name: str,
                        config):
        """Everything that happens inside the staging dir; any failure leaves no version."""
        import tensorflow as tf

        images, labels = self.images, self.labels
        save_servable(twin, self.input_shape, labels, staging)
        signatures = check_signatures(staging, self.input_shape, len(labels))
        half = half_precision_nodes(staging)
        if half:
            raise ExportError(f"the exported graph must hold no float16/bfloat16 tensors. "
                              f"Received: {len(half)} nodes, e.g. {half[:3]}")
        warmup_count = write_warmup_records(staging, model_name, images,
                                            config.num_warmup_records,
                                            encoded_image=_png(images[0]))
        try:
            loaded = tf.saved_model.load(str(staging))
        except Exception as e:
            raise ExportError(f"the written SavedModel does not load back: {e}") from e
        replay_warmup_records(staging, loaded)
        parity = check_export_parity(loaded, twin, trained, images[:config.num_parity_images],
                                     labels, atol=config.parity_atol, rtol=config.parity_rtol)
        write_canary_examples(staging, loaded, images[:config.num_canary_examples])
        return signatures, parity, warmup_count

    def input_metadata(self) -> dict[str, Any]:
        """ampflow_export.json's input blocks for an image model."""
        return {
            "modality": "image",
            "input": {"name": "images", "shape": [-1, *self.input_shape], "dtype": "float32",
                      "range": [0, 255], "note": "raw pixels; rescaling is inside the model"},
            "encoded_input": {"signature": IMAGE_BYTES_SIGNATURE, "name": IMAGE_BYTES_INPUT,
                              "shape": [-1], "dtype": "string",
                              "formats": sorted(ENCODED_IMAGE_MAGIC),
                              "max_pixels": MAX_IMAGE_PIXELS,
                              "note": "one encoded file per element, decoded and resized in "
                                      "the graph as in training (prepare_data.images)"},
            "labels_file": f"assets/{LABELS_FILE}",
        }


def _png(image: np.ndarray) -> bytes:
    """One real test image as a PNG file: what an image_bytes client sends."""
    import tensorflow as tf

    return tf.io.encode_png(image.astype(np.uint8)).numpy()
