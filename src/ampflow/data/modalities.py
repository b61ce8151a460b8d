"""The modality seam: what differs between image and text data, owned in one place.

A step asks once, `modality_of(info)` (a prepared dir's dataset_info.json) or `modality_named(
name)` (a model's metadata.json or ampflow_export.json), and then calls the `Modality` it got
instead of branching on image or text. What is a step's own (export's signatures, convert's
representative data, train's input pipeline) is that step's `modalities.py`, keyed by `name`.
A third modality is one class here, one entry in each step's `modalities.py`, and their tests
(docs/development.md, "Adding a modality"). Free of TensorFlow at import, like modality.py.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT
from ampflow.errors import ConfigError, ModelLoadError


class Modality(ABC):
    """What the data side owns of one modality: its split reader and its model's input."""

    name: ClassVar[str]  # dataset_info.json's and metadata.json's `modality`

    @abstractmethod
    def load_split(self, prepared_dir: str | os.PathLike, split: str):
        """`(example, label int64)` of a prepared split, unbatched (a tf.data.Dataset)."""

    @abstractmethod
    def model_input_shape(self, info: dict[str, Any], metadata: dict[str, Any]) -> list | None:
        """The input shape (no batch) the data requires of a model trained on it."""

    @abstractmethod
    def load_preprocessor(self, model_dir: str | os.PathLike):
        """The preprocessor a published model dir holds beside its model (a tokenizer), or None.

        It turns what a client sends into the model's input; None where examples are the input.
        """

    @abstractmethod
    def model_inputs(self, batch, preprocessor):
        """The model's input for `batch` as a client sends it (`preprocessor` as loaded)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ImageModality(Modality):
    """Images: float32 pixels in, rescaled inside the model; nothing beside the model."""

    name = MODALITY_IMAGE

    def load_split(self, prepared_dir, split):
        from ampflow.data.input_pipeline import load_split

        return load_split(prepared_dir, split)

    def model_input_shape(self, info, metadata):
        return list(info["image_shape"])

    def load_preprocessor(self, model_dir):
        return None

    def model_inputs(self, batch, preprocessor):
        return batch


class TextModality(Modality):
    """Texts: raw UTF-8 strings in, token ids by the tokenizer the model was trained with."""

    name = MODALITY_TEXT

    def load_split(self, prepared_dir, split):
        from ampflow.data.text_input import load_text_split

        return load_text_split(prepared_dir, split)

    def model_input_shape(self, info, metadata):
        return metadata.get("input_shape")  # any sequence length: its own tokenizer's

    def load_preprocessor(self, model_dir):
        from ampflow.modeling.tokenizer import load_tokenizer

        try:
            return load_tokenizer(model_dir)
        except ConfigError as e:
            raise ModelLoadError(f"{model_dir} holds a text model without its tokenizer: "
                                 f"{e}") from e

    def model_inputs(self, batch, preprocessor):
        return preprocessor.tokenize(batch)


IMAGE = ImageModality()
TEXT = TextModality()
MODALITIES: dict[str, Modality] = {m.name: m for m in (IMAGE, TEXT)}


def modality_named(name: str | None) -> Modality:
    """The modality called `name`; None (artifacts written before text existed) is image."""
    try:
        return MODALITIES[name or MODALITY_IMAGE]
    except KeyError:
        raise ConfigError(f"modality must be one of {sorted(MODALITIES)}. Received: "
                          f"modality={name!r}") from None


def modality_of(info: dict[str, Any]) -> Modality:
    """The modality of a prepared dataset (its dataset_info.json) or a model (metadata.json)."""
    return modality_named(info.get("modality"))
