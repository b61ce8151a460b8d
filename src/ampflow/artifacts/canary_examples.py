"""Recorded expected answers: real test images and what the exported version answers to them.

Export writes `ampflow_canary.npz` into each version dir: a few real test images (the exact
float32 request tensors) with the `serving_default` outputs of the SavedModel as written and
reloaded. A deployment proves that a server really serves *this* version by sending those images
and comparing its answers with the recorded ones (deploy_serving/canary.py): a server that loaded
another version, another model, or a broken copy answers differently. TF Serving ignores files
in a version dir that are not part of the SavedModel.

The file is numpy's `.npz` (read with `allow_pickle=False`): binary, compact for large images,
and loadable without TensorFlow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ampflow.errors import ModelLoadError
from ampflow.serving.model_format import (
    CLASS_IDS_OUTPUT,
    DEFAULT_SIGNATURE,
    PROBABILITIES_OUTPUT,
)

CANARY_FILE = "ampflow_canary.npz"
DEFAULT_EXAMPLES = 32
INPUT_KEY = "images"
TEXT_INPUT_KEY = "text"  # a text model's serving_default input (export_savedmodel.text_signatures)


@dataclass(frozen=True)
class CanaryExamples:
    """Request images (or texts) and the outputs the exported version gave for them."""

    images: np.ndarray  # float32 [N, H, W, C], the `images` input of serving_default; for a
    # text model, UTF-8 bytes [N] (an object array), its `text` input
    probabilities: np.ndarray  # float32 [N, num_classes]
    class_ids: np.ndarray  # int64 [N]
    input_key: str = INPUT_KEY  # serving_default's input name: "images" or "text"


def write_canary_examples(version_dir: str | os.PathLike, loaded, images: np.ndarray) -> Path:
    """Record `loaded`'s serving_default answers to `images` in `<version_dir>/CANARY_FILE`."""
    import tensorflow as tf

    images = np.asarray(images, dtype=np.float32)
    outputs = loaded.signatures[DEFAULT_SIGNATURE](**{INPUT_KEY: tf.constant(images)})
    path = Path(version_dir) / CANARY_FILE
    with open(path, "wb") as f:
        np.savez(f, images=images,
                 probabilities=np.asarray(outputs[PROBABILITIES_OUTPUT], dtype=np.float32),
                 class_ids=np.asarray(outputs[CLASS_IDS_OUTPUT], dtype=np.int64))
    path.chmod(0o644)
    return path


def write_text_canary_examples(version_dir: str | os.PathLike, loaded, texts: list[str]) -> Path:
    """The text sibling of `write_canary_examples`: real test sentences and their answers.

    The texts are stored as a unicode array (`.npz` holds no object arrays without pickle).
    """
    import tensorflow as tf

    encoded = np.array([t.encode("utf-8") for t in texts], dtype=object)
    outputs = loaded.signatures[DEFAULT_SIGNATURE](**{TEXT_INPUT_KEY: tf.constant(encoded)})
    path = Path(version_dir) / CANARY_FILE
    with open(path, "wb") as f:
        np.savez(f, texts=np.array(texts, dtype=str),
                 probabilities=np.asarray(outputs[PROBABILITIES_OUTPUT], dtype=np.float32),
                 class_ids=np.asarray(outputs[CLASS_IDS_OUTPUT], dtype=np.int64))
    path.chmod(0o644)
    return path


def load_canary_examples(version_dir: str | os.PathLike) -> CanaryExamples:
    """Read the recorded answers of a version dir; ModelLoadError if absent or malformed."""
    path = Path(version_dir) / CANARY_FILE
    if not path.is_file():
        raise ModelLoadError(
            f"{version_dir} has no recorded expected answers ({CANARY_FILE}), so a canary "
            "cannot check what the server answers; export the model with `ampflow export`.")
    try:
        with np.load(path, allow_pickle=False) as data:
            if "texts" in data:
                requests = np.array([str(t).encode("utf-8") for t in data["texts"]],
                                    dtype=object)
                key = TEXT_INPUT_KEY
            else:
                requests, key = data["images"].astype(np.float32), INPUT_KEY
            examples = CanaryExamples(images=requests,
                                      probabilities=data["probabilities"].astype(np.float32),
                                      class_ids=data["class_ids"].astype(np.int64),
                                      input_key=key)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{path} is corrupt: {e}") from e
    n = len(examples.images)
    if n == 0 or len(examples.probabilities) != n or len(examples.class_ids) != n:
        raise ModelLoadError(f"{path} must hold as many images as answers (at least one). "
                             f"Received: {n} images, {len(examples.probabilities)} "
                             f"probabilities, {len(examples.class_ids)} class ids")
    return examples
