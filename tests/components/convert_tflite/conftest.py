"""Fixtures for the convert step: SavedModels that follow docs/ARTIFACTS.md, built once.

The input of every happy-path test is the real export step's output (`run_export`, the float32
twin of a model trained under mixed_float16). `save_contract_savedmodel` writes the same
signature by hand, which lets a test give the converter a *mixed* graph behind a valid signature.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def mixed_trained(trained_model):
    """(keras model trained under mixed_float16, its metadata)."""
    from ampflow.artifacts.model_dir import load_trained_model

    return load_trained_model(trained_model("mixed_float16"))


@pytest.fixture(scope="session")
def float32_savedmodel(tmp_path_factory, trained_model, prepared_digits):
    """`<export_base>/digits/1/`, written by the export step from the mixed_float16 model.

    `force=True`: exported without the evaluate step's verdict (the convert step does not
    depend on it; the export still runs its own SavedModel-vs-Keras parity check).
    """
    from ampflow.components.export_savedmodel import ExportConfig, run_export

    result = run_export(ExportConfig(
        model_dir=trained_model("mixed_float16"), data_dir=prepared_digits,
        export_base=tmp_path_factory.mktemp("export"), model_name="digits", force=True,
        num_parity_images=64))
    return result.version_dir


@pytest.fixture(scope="session")
def mixed_savedmodel(tmp_path_factory, mixed_trained):
    """A SavedModel exported straight from the mixed_float16 model (float16 graph ops)."""
    model, _ = mixed_trained
    path = tmp_path_factory.mktemp("mixed-export") / "1"
    model.export(str(path), verbose=False)
    return path
