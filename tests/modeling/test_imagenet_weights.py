"""Keras applications' ImageNet weights files into ampflow's image backbones, tensor for tensor.

Fast: a tiny backbone of the same kinds of layers (Conv2D with bias, DepthwiseConv2D,
BatchNormalization), wrapped as ampflow wraps its built-in backbones; the file written by the
tests (applications_files.py) also read by Keras's own loader, so the layout is the one Keras
reads. Slow: the built-in resnet50 and mobilenet_v2 from files written from
`keras.applications.ResNet50`/`MobileNetV2(weights=None, include_top=False)`. A file of
another architecture or input layout is one line naming it.
"""

from __future__ import annotations

import h5py
import keras
import numpy as np
import pytest
from applications_files import randomize, write_applications_weights

from ampflow.errors import ModelConfigError
from ampflow.modeling.imagenet_weights import (
    backbone_of,
    load_applications_weights,
    save_applications_weights,
)


def tiny_backbone(top: bool = False, first: str = "conv1_conv"):
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", name=first)(inputs)
    x = keras.layers.BatchNormalization(name="conv1_bn")(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="block_dw")(x)
    x = keras.layers.BatchNormalization(name="block_dw_bn")(x)
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    if top:
        x = keras.layers.Dense(10, name="predictions")(x)
    return keras.Model(inputs, x, name="tiny")


def wrapped(backbone, classes: int = 3):
    """As models.py wraps a backbone: preprocessing, the nested backbone, a float32 head."""
    inputs = keras.Input((8, 8, 3), name="images")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = backbone(x)
    return keras.Model(inputs, keras.layers.Dense(classes, dtype="float32", name="logits")(x))


@pytest.fixture
def source_file(tmp_path):
    source = tiny_backbone()
    randomize(source)
    return source, write_applications_weights(tmp_path / "tiny_notop.h5", source)


@pytest.mark.parametrize("policy", ("float32", "mixed_bfloat16", "mixed_float16"))
def test_every_backbone_tensor_is_the_files_and_the_head_is_untouched(source_file, policy):
    source, path = source_file
    keras.mixed_precision.set_global_policy(policy)
    model = wrapped(tiny_backbone())
    head = model.get_layer("logits").kernel.numpy().copy()
    assert load_applications_weights(model, path) == 2 + 4 + 1 + 4
    mine = {v.path: v for v in backbone_of(model).weights}
    for want in source.weights:
        got = mine.pop(want.path)
        assert got.dtype == "float32"
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=want.path)
    assert mine == {}
    np.testing.assert_array_equal(model.get_layer("logits").kernel.numpy(), head)


def test_keras_own_loader_reads_the_test_written_file_the_same(source_file):
    """The writer follows the layout `weights=` reads: Keras's legacy HDF5 loader agrees."""
    source, path = source_file
    theirs = tiny_backbone()
    theirs.load_weights(path)
    for want, got in zip(source.weights, theirs.weights, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=want.path)


def _spoil_keras3(tmp_path, _source):
    path = tmp_path / "tiny.weights.h5"
    tiny_backbone().save_weights(path)
    return path


def _spoil_text(tmp_path, _source):
    path = tmp_path / "tiny_notop.h5"
    path.write_text("<html>Access denied</html>")
    return path


def _keras_hub_preset(tmp_path, _source):
    """What `ResNetBackbone.save_to_preset` writes first (keras-hub 0.32's config.json)."""
    import json

    preset = tmp_path / "resnet_50_imagenet"
    preset.mkdir()
    (preset / "config.json").write_text(json.dumps({
        "module": "keras_hub.src.models.resnet.resnet_backbone", "class_name": "ResNetBackbone",
        "config": {"block_type": "bottleneck_block"},
        "registered_name": "keras_hub>ResNetBackbone"}))
    (preset / "model.weights.h5").write_bytes(b"")
    return preset


def _plain_directory(tmp_path, _source):
    return tmp_path


BAD_FILES = {
    "a keras-hub preset": (
        _keras_hub_preset,
        "Received: a keras-hub preset (keras_hub>ResNetBackbone), whose network is not the "
        "built-ins' (keras-hub's ResNets are timm's v1.5, its MobileNets V3): train it as your "
        "own model"),
    "a directory": (_plain_directory, "Received: a directory; pass the .h5 file itself"),
    "another architecture": (
        lambda t, s: write_applications_weights(t / "other.h5", tiny_backbone(first="Conv1")),
        "expected the weights of resnet50 (first conv1_conv, 4 layers with weights). Received: "
        "mobilenet_v2 (first Conv1, 4 layers with weights); download the ImageNet notop file "
        "for resnet50: https://storage.googleapis.com/tensorflow/keras-applications/resnet/"
        "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"),
    "with the classifier": (
        lambda t, s: write_applications_weights(t / "top.h5", tiny_backbone(top=True)),
        "5 layers with weights, with the classifier layer predictions)"),
    "channels first": (
        lambda t, s: write_applications_weights(t / "th.h5", s, channels_first=True),
        "expected conv1_conv/kernel of shape [3, 3, 3, 8] (channels-last). Received: "
        "conv1_conv/kernel:0 [8, 3, 3, 3], a channels-first kernel (th_dim_ordering)"),
    "a Keras 3 weights file": (_spoil_keras3, "an HDF5 file without it (a Keras 3 .weights.h5"),
    "not HDF5": (_spoil_text, "a file HDF5 cannot open"),
    "no file": (lambda t, s: t / "absent.h5", "Received: no such file; download it, e.g. "
                                               "https://storage.googleapis.com/"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_file_of_another_architecture_or_layout_is_one_line_naming_it(tmp_path, case):
    make, expected = BAD_FILES[case]
    source = tiny_backbone()
    path = make(tmp_path, source)
    model = wrapped(tiny_backbone())
    before = [v.numpy().copy() for v in model.weights]
    with pytest.raises(ModelConfigError) as caught:
        load_applications_weights(model, path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    assert expected in message, message
    assert caught.value.exit_code == 2
    for variable, was in zip(model.weights, before, strict=True):  # nothing half-assigned
        np.testing.assert_array_equal(variable.numpy(), was)


def test_split_layer_names_attributes_are_read(source_file, tmp_path):
    """Keras splits an attribute past HDF5's header limit into layer_names0, layer_names1, ..."""
    source, path = source_file
    with h5py.File(path, "r+") as file:
        names = list(file.attrs["layer_names"])
        del file.attrs["layer_names"]
        file.attrs["layer_names0"], file.attrs["layer_names1"] = names[:3], names[3:]
    model = wrapped(tiny_backbone())
    assert load_applications_weights(model, path) == 11


def test_a_saved_backbone_is_the_file_keras_and_ampflow_read_tensor_for_tensor(tmp_path):
    """save_applications_weights hands a backbone trained here on as a downloaded file: Keras's
    own loader (the `weights=` path) and load_applications_weights both get every tensor."""
    keras.mixed_precision.set_global_policy("float32")
    trained = wrapped(tiny_backbone())
    randomize(trained, seed=3)
    path = save_applications_weights(trained, tmp_path / "tiny_notop.h5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_notop.h5"]  # no partial left
    want = {v.path: v.numpy() for v in backbone_of(trained).weights}
    theirs = tiny_backbone()
    theirs.load_weights(path)
    mine = wrapped(tiny_backbone())
    assert load_applications_weights(mine, path) == len(want) == 11
    for model in (theirs, backbone_of(mine)):
        assert {v.path for v in model.weights} == set(want)
        for variable in model.weights:
            np.testing.assert_array_equal(variable.numpy(), want[variable.path],
                                          err_msg=variable.path)


# ---- the built-in backbones (slow: ResNet-50 and MobileNetV2 are built) --------------------

APPLICATIONS = {"resnet50": "ResNet50", "mobilenet_v2": "MobileNetV2"}


@pytest.fixture(scope="module")
def application_files(tmp_path_factory):
    """Each architecture's notop file, from `keras.applications` with random weights."""
    keras.mixed_precision.set_global_policy("float32")
    files = {}
    for name, constructor in APPLICATIONS.items():
        source = getattr(keras.applications, constructor)(
            weights=None, include_top=False, input_shape=(32, 32, 3))
        randomize(source, seed=len(files))
        path = tmp_path_factory.mktemp(name) / f"{name}_notop.h5"
        files[name] = (write_applications_weights(path, source),
                       {v.path: v.numpy() for v in source.weights})
    return files


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(APPLICATIONS))
@pytest.mark.parametrize("policy", ("float32", "mixed_bfloat16"))
def test_the_builtin_backbone_takes_every_tensor_of_its_applications_file(
        application_files, name, policy):
    from ampflow.modeling.models import build_model

    path, written = application_files[name]
    model = build_model(name, (32, 32, 3), 3, policy=policy)
    backbone = backbone_of(model)
    assert backbone is not model and load_applications_weights(model, path) == len(written)
    assert {v.path for v in backbone.weights} == set(written)
    for variable in backbone.weights:
        assert variable.dtype == "float32"
        np.testing.assert_array_equal(variable.numpy(), written[variable.path],
                                      err_msg=variable.path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(APPLICATIONS))
def test_keras_own_loader_reads_the_builtin_files_every_tensor(application_files, name):
    """Keras's own `weights=` path reads each file the test writes into the same tensors. Once
    per architecture: the policy above is ampflow's build, not Keras's float32 reference."""
    path, written = application_files[name]
    theirs = getattr(keras.applications, APPLICATIONS[name])(
        weights=str(path), include_top=False, input_shape=(32, 32, 3))
    assert {v.path for v in theirs.weights} == set(written)
    for variable in theirs.weights:
        np.testing.assert_array_equal(variable.numpy(), written[variable.path])


@pytest.mark.slow
def test_a_resnet50_file_given_to_mobilenet_v2_is_one_line_naming_both(application_files):
    from ampflow.modeling.models import build_model

    path, _ = application_files["resnet50"]
    model = build_model("mobilenet_v2", (32, 32, 3), 3, policy="float32")
    with pytest.raises(ModelConfigError) as caught:
        load_applications_weights(model, path)
    message = str(caught.value)
    assert message.startswith(f"{path}: expected the weights of mobilenet_v2 (first Conv1, ")
    assert "Received: resnet50 (first conv1_conv, " in message and "\n" not in message
    assert message.endswith("mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224_no_top.h5")
