"""`train --weights`: a Keras applications ImageNet notop file in the built-in ResNet-50.

The file is written by the tests (tests/modeling/applications_files.py) from
`keras.applications.ResNet50(weights=None, include_top=False)` with values of its own, so a
tensor in the wrong place shows. A run loads it tensor for tensor, trains the new head on the
frozen backbone (phase 1: no backbone tensor moves, BatchNormalization's statistics included),
then every layer (phase 2: they move), exports and answers a Predict. A file of another
architecture is one line naming it, exit 2, nothing written. Tiny: 32 px, one step a phase.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "modeling"))
from applications_files import write_applications_weights  # noqa: E402

NOTOP = "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"


def _pretrained_like(model, seed: int) -> None:
    """Values a trained net could hold, none equal to a fresh build's (kernels ~ 1/sqrt(fan in),
    BatchNormalization's scale and statistics near 1 and 0), so that the forward pass stays
    finite under float16 and a tensor loaded into the wrong variable shows."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape, leaf = tuple(variable.shape), variable.name
        if leaf in ("gamma", "moving_variance"):
            value = rng.uniform(0.8, 1.2, shape)
        elif leaf in ("kernel", "depthwise_kernel"):
            value = rng.normal(0.0, 1.0 / np.sqrt(np.prod(shape[:-1])), shape)
        else:  # bias, beta, moving_mean
            value = rng.normal(0.0, 0.05, shape)
        variable.assign(value.astype(np.float32))


@pytest.fixture(scope="module")
def resnet50_file(tmp_path_factory) -> Path:
    """A ResNet-50 notop file as Keras applications download it (~4 s to build and write)."""
    import keras

    backbone = keras.applications.ResNet50(include_top=False, weights=None,
                                           input_shape=(32, 32, 3), pooling="avg")
    _pretrained_like(backbone, seed=7)
    return write_applications_weights(tmp_path_factory.mktemp("weights") / NOTOP, backbone)


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


def _file_tensors(path: Path) -> dict[str, dict[str, np.ndarray]]:
    from ampflow.modeling.imagenet_weights import read_applications_weights

    return {layer: {name.rsplit("/", 1)[-1].split(":")[0]: value for name, value in weights}
            for layer, weights in read_applications_weights(path).items()}


def _backbone_tensors(model) -> dict[str, dict[str, np.ndarray]]:
    from ampflow.modeling.imagenet_weights import backbone_of

    return {layer.name: {v.name: np.asarray(v.numpy()) for v in layer.weights}
            for layer in backbone_of(model).layers if layer.weights}


def _head_tensors(model) -> list[np.ndarray]:
    from ampflow.modeling.imagenet_weights import backbone_of

    backbone = backbone_of(model)
    return [np.asarray(v.numpy()) for layer in model.layers if layer is not backbone
            for v in layer.weights]


@pytest.fixture
def phase_snapshots(monkeypatch):
    """The model's backbone and head tensors as each phase's loop ends (phases.py's loops)."""
    from ampflow.components.train.run import phases

    taken: list[dict] = []

    class Observed(phases.TrainLoop):
        def fit(self, *args, **kwargs):
            result = super().fit(*args, **kwargs)
            taken.append({"backbone": _backbone_tensors(self.model),
                          "head": _head_tensors(self.model),
                          "trainable": len(self.model.trainable_variables)})
            return result

    monkeypatch.setattr(phases, "TrainLoop", Observed)
    return taken


def _train(data_dir, output_dir, weights, policy: str, *extra):
    return _cli("train", "--data-dir", data_dir, "--output-dir", output_dir, "--model",
                "resnet50", "--weights", weights, "--precision", policy, "--epochs", 2,
                "--head-epochs", 1, "--steps-per-epoch", 1, "--batch-size", 8, "--seed", 3,
                "--learning-rate", 1e-3, *extra)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_weights_load_hold_while_frozen_then_fine_tune(
        resnet50_file, small_mnist, tmp_path, phase_snapshots, policy):
    code, out = _train(small_mnist, tmp_path / "model", resnet50_file, policy)
    assert code == 0, out
    expected = _file_tensors(resnet50_file)
    head, fine = phase_snapshots
    assert head["trainable"] < fine["trainable"]  # phase 1: the head's variables only
    assert set(head["backbone"]) == set(expected)
    for layer, weights in expected.items():  # phase 1 ended on the file's tensors, bit for bit
        assert set(head["backbone"][layer]) == set(weights), layer
        for name, value in weights.items():
            np.testing.assert_array_equal(head["backbone"][layer][name], value,
                                          err_msg=f"{layer}/{name}")
    moved = [f"{layer}/{name}" for layer, weights in expected.items()
             for name, value in weights.items()
             if not np.array_equal(fine["backbone"][layer][name], value)]
    assert len(moved) == sum(map(len, expected.values())), "phase 2 left some tensor unmoved"
    meta = json.loads((tmp_path / "model" / "metadata.json").read_text())
    assert meta["model"]["weights"] == str(resnet50_file)
    assert [(p["name"], p["epochs"], p["frozen"]) for p in meta["recipe"]["phases"]] == [
        ("head", 1, True), ("fine_tune", 1, False)]
    assert [p["learning_rate"] for p in meta["recipe"]["phases"]] == [1e-3, 1e-3]
    assert [e["epoch"] for e in meta["epochs"]] == [1, 2]
    import keras

    from ampflow.artifacts.model_dir import load_trained

    model = load_trained(tmp_path / "model").model
    assert all(v.dtype == "float32" for v in model.weights)  # every variable float32
    assert all(layer.trainable for layer in model.layers)  # published unfrozen
    assert keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.slow
def test_a_fine_tuned_resnet50_exports_and_answers_a_predict(resnet50_file, small_mnist,
                                                             tmp_path):
    from ampflow.data import load_split
    from ampflow.modeling.twin import build_float32_twin
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server

    code, out = _train(small_mnist, tmp_path / "model", resnet50_file, "mixed_bfloat16",
                       "--head-learning-rate", 1e-2)
    assert code == 0, out
    # the gate's own checks run in test_evaluate*; a two-step model is at chance, so ungated
    code, out = _cli("export", "--model-dir", tmp_path / "model", "--data-dir", small_mnist,
                     "--export-base", tmp_path / "serving", "--force",
                     "--num-parity-images", 16)
    assert code == 0, out
    images = np.stack([image for image, _ in load_split(small_mnist, "test")
                       .take(4).as_numpy_iterator()]).astype(np.float32)
    from ampflow.artifacts.model_dir import load_trained

    expected = np.asarray(build_float32_twin(load_trained(tmp_path / "model").model)(images))
    server = start_local_server(ServerConfig(
        models=(ModelConfig("ampflow", tmp_path / "serving" / "ampflow"),), host="127.0.0.1",
        port=0))
    try:
        client = PredictionClient(server.address, timeout_s=30.0)
        try:
            result = client.predict("ampflow", images)
        finally:
            client.close()
    finally:
        server.stop(0.5)
    np.testing.assert_allclose(result.outputs["probabilities"], expected, atol=1e-5)


@pytest.mark.parametrize("command", ["train", "check-model"])
def test_a_weights_file_of_another_architecture_is_one_line_and_nothing_is_written(
        other_file, small_mnist, tmp_path, capsys, command):
    code, _ = _cli(command, "--data-dir", small_mnist, "--output-dir", tmp_path / "m",
                   "--model", "resnet50", "--weights", other_file)
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(other_file) in err and "expected the weights of resnet50" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("model", ["small_cnn", "bert_tiny"])
def test_weights_on_a_model_that_cannot_take_them_is_one_line(other_file, small_mnist,
                                                               tmp_path, capsys, model):
    code, _ = _cli("train", "--data-dir", small_mnist, "--output-dir", tmp_path / "m",
                   "--model", model, "--weights", other_file)
    err = capsys.readouterr().err
    assert code == 2 and "model must be resnet50 or mobilenet_v2" in err, err
    assert f"model={model!r}" in err and "Traceback" not in err, err
    assert not (tmp_path / "m").exists()
