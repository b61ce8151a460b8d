"""export's side of the modality seam: the export (signatures, warm-up, parity) per modality.

`export_of` is what step.py asks, once; each entry takes `(trained, info, labels, count,
config)` and returns an object with `write_and_check`, `input_metadata` and `labels`
(image_export.py, text_export.py). A new modality adds its entry here and its module.
"""

from __future__ import annotations

from typing import Any

from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT


def _image(trained, info, labels, count, config):
    from ampflow.components.export_savedmodel.image_export import image_export_of

    return image_export_of(trained, info, labels, count, config)


def _text(trained, info, labels, count, config):
    from ampflow.components.export_savedmodel.text_export import text_export_of

    return text_export_of(trained.tokenizer, config.data_dir, trained.metadata, info, labels,
                          count)


EXPORTS = {MODALITY_IMAGE: _image, MODALITY_TEXT: _text}


def export_of(trained, info: dict[str, Any], labels: list[str], count: int, config):
    """The export of `trained` (a model_dir.TrainedModel) for its modality."""
    return EXPORTS[trained.modality](trained, info, labels, count, config)
