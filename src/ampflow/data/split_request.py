"""A prepared split as a client sends it to `serving_default`, by modality (one loader each).

Evaluate's check of the model serving now and deploy's bf16 parity send the same examples a
client would, so both read them here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT


@dataclass(frozen=True)
class SplitRequest:
    """A split as a client sends it to `serving_default`: the input's name and the examples.

    Images go as float32 pixels; texts as their raw UTF-8 bytes, never token ids, because a
    served text model tokenizes in its graph with its own vocabulary. The new model takes the
    same examples through its own tokenizer (`ampflow.artifacts.model_dir.TrainedModel.inputs`).
    """

    input_name: str  # serving_default's input: IMAGES_INPUT or TEXT_INPUT
    examples: np.ndarray  # float32 [N, H, W, C], or object [N] of UTF-8 bytes
    labels: np.ndarray  # int64 [N]

    def declared(self) -> list[tuple[str, int, list[int]]]:
        """The input as a signature would declare it: (name, DataType enum, one example's shape)."""
        import tensorflow as tf

        return [(self.input_name, tf.as_dtype(self.examples.dtype).as_datatype_enum,
                 list(self.examples.shape[1:]))]


def split_request(data_dir: str | os.PathLike, split: str,
                  limit: int | None = None) -> SplitRequest:
    """The prepared split as `serving_default` is sent it, by the data's modality."""
    from ampflow.data import load_dataset_info
    from ampflow.data.modalities import modality_of

    load = LOADERS[modality_of(load_dataset_info(data_dir)).name]
    return load(data_dir, split, limit)


def _load_images(data_dir, split: str, limit: int | None) -> SplitRequest:
    from ampflow.data import load_arrays
    from ampflow.serving.model_format import IMAGES_INPUT

    images, labels = load_arrays(data_dir, split, limit=limit)
    return SplitRequest(IMAGES_INPUT, images.astype(np.float32), labels)


def _load_texts(data_dir, split: str, limit: int | None) -> SplitRequest:
    from ampflow.artifacts.signature_names import TEXT_INPUT
    from ampflow.data import load_texts

    texts, labels = load_texts(data_dir, split, limit=limit)
    return SplitRequest(TEXT_INPUT, np.array([t.encode("utf-8") for t in texts], dtype=object),
                        labels)


LOADERS = {MODALITY_IMAGE: _load_images, MODALITY_TEXT: _load_texts}
