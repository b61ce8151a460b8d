"""train's metadata.json names the architecture `architecture` (what `--model` was); everywhere
else `model_name` is the served model name. Models published before the rename hold it as
`model_name`, and every reader (load_trained_model, so evaluate and export) still takes them."""

from __future__ import annotations

import json
import shutil

import pytest


@pytest.mark.slow
def test_a_trained_model_names_its_architecture_and_old_models_still_load(trained_model,
                                                                           tmp_path):
    from ampflow.artifacts.model_dir import load_trained_model

    published = trained_model("float32", epochs=1)
    meta = json.loads((published / "metadata.json").read_text())
    assert meta["architecture"] == "small_cnn" and "model_name" not in meta

    old = tmp_path / "old"
    shutil.copytree(published, old)
    meta["model_name"] = meta.pop("architecture")  # as a model written before the rename
    (old / "metadata.json").write_text(json.dumps(meta))
    _model, loaded = load_trained_model(old)
    assert loaded["architecture"] == "small_cnn"

    from ampflow.components.evaluate_parity.training import comparability_notes

    _model, new = load_trained_model(published)
    notes = comparability_notes(new, loaded)  # an old AMP model against a new baseline
    assert not [n for n in notes if n.startswith(("architecture", "model_name"))], notes
