"""The modality seam: one Modality per name, asked once, and every step's table covers each."""

from __future__ import annotations

import pytest

from ampflow.data.modalities import IMAGE, MODALITIES, TEXT, modality_named, modality_of
from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT
from ampflow.errors import ConfigError


def test_modality_of_a_dataset_or_a_model_is_its_named_modality():
    assert modality_of({"modality": MODALITY_TEXT}) is TEXT
    assert modality_of({"modality": MODALITY_IMAGE}) is IMAGE
    assert modality_named(MODALITY_TEXT).name == MODALITY_TEXT


def test_an_artifact_from_before_text_is_image():
    assert modality_of({}) is IMAGE and modality_of({"modality": None}) is IMAGE


def test_an_unknown_modality_is_one_line_not_read_as_images():
    with pytest.raises(ConfigError, match=r"modality must be one of \['image', 'text'\]\. "
                                          r"Received: modality='audio'"):
        modality_of({"modality": "audio"})


def test_the_image_input_is_what_a_client_sends_and_text_goes_through_its_tokenizer():
    class Doubling:
        def tokenize(self, batch):
            return [2 * x for x in batch]

    assert IMAGE.model_inputs([1, 2], None) == [1, 2]
    assert TEXT.model_inputs([1, 2], Doubling()) == [2, 4]
    assert IMAGE.load_preprocessor("/nonexistent") is None


def test_the_input_shape_a_dataset_requires_of_its_model():
    info = {"image_shape": [8, 8, 1]}
    assert IMAGE.model_input_shape(info, {"input_shape": [4, 4, 1]}) == [8, 8, 1]
    assert TEXT.model_input_shape(info, {"input_shape": [16]}) == [16]  # its own length


def _tables() -> dict[str, set[str]]:
    """Each table keyed by modality name in the library and the steps' seams."""
    from ampflow.artifacts.throughput import UNITS
    from ampflow.components.convert_tflite.modalities import INPUTS
    from ampflow.components.export_savedmodel.modalities import EXPORTS
    from ampflow.components.prepare_data.modalities import PREPARING
    from ampflow.components.train.modalities import TRAINING
    from ampflow.components.train.precision.policy import CPU_JIT_NOTES
    from ampflow.components.train.run import build
    from ampflow.data.split_request import LOADERS

    tables = {"throughput.UNITS": UNITS, "split_request.LOADERS": LOADERS,
              "prepare_data.PREPARING": PREPARING, "train.TRAINING": TRAINING,
              "train.build.PREPROCESSORS": build.PREPROCESSORS,
              "train.build.INPUTS": build.INPUTS, "train.build.MODELS": build.MODELS,
              "train.policy.CPU_JIT_NOTES": CPU_JIT_NOTES,
              "export.EXPORTS": EXPORTS, "convert.INPUTS": INPUTS}
    return {where: set(table) for where, table in tables.items()}


def test_every_step_covers_every_modality():
    assert {where: keys for where, keys in _tables().items() if keys != set(MODALITIES)} == {}


def test_a_modality_a_step_lacks_is_named(monkeypatch):
    from ampflow.components.export_savedmodel import modalities

    monkeypatch.setitem(MODALITIES, "audio", IMAGE)
    missing = {where for where, keys in _tables().items() if keys != set(MODALITIES)}
    assert "export.EXPORTS" in missing and len(missing) == len(_tables())
    monkeypatch.setitem(modalities.EXPORTS, "audio", None)
    assert "export.EXPORTS" not in {where for where, keys in _tables().items()
                                    if keys != set(MODALITIES)}
