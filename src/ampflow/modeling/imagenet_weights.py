"""Keras applications' ImageNet weights files, put into a model's backbone tensor for tensor.

The files `keras.applications.ResNet50(weights="imagenet")` downloads (e.g.
`resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5`) are Keras 2's HDF5 weights layout:
the root's `layer_names` attribute lists the layers in order, each layer a group whose
`weight_names` attribute lists its weights (`conv1_conv/kernel:0`, BatchNormalization's
gamma, beta, moving_mean, moving_variance), each a dataset at that name. Read with h5py; each
weight goes to the variable of the same layer and name in the model's backbone (the nested
functional model ampflow's built-in resnet50/mobilenet_v2 wrap, or the model itself), after
checking that the file holds exactly the backbone's layers and shapes. A file of another
architecture, of another width, with the classifier (not `_notop`) or in the channels-first
layout is one `ModelConfigError` line naming the file and which file to download (exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ampflow.errors import ModelConfigError

WEIGHTS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/"
# ampflow's built-in name → Keras applications' file (the ImageNet notop weights) and the
# first layer with weights, by which a file's architecture is recognized
FILES = {
    "resnet50": ("resnet/resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5", "conv1_conv"),
    "mobilenet_v2": ("mobilenet_v2/mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224"
                     "_no_top.h5", "Conv1"),
}
TOP_LAYERS = ("predictions", "fc1000", "probs")  # a classifier's: the file is not `_notop`
WEIGHTS_MODELS = tuple(FILES)  # the built-ins `train --weights` takes


def check_weights_file(path: str | os.PathLike, name: str) -> None:
    """Refuse, without TensorFlow, a file that is not `name`'s weights (its first layer).

    The cheap half of `load_applications_weights`'s check, run before anything is written:
    a file of another architecture, with the classifier or not HDF5 at all is one line here;
    the layer-by-layer shapes are checked when the weights are loaded into the built model.
    """
    path = Path(path)
    names = list(read_applications_weights(path))
    first = FILES[name][1]
    if not names or names[0] != first or any(n in TOP_LAYERS for n in names):
        raise ModelConfigError(f"{path}: expected the weights of {name} (first {first}, "
                               f"without the classifier). Received: {_describe(names)}; "
                               f"download the ImageNet notop file for {name}: {_url(name)}")


def read_applications_weights(path: str | os.PathLike) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Layer name → its weights `[(name, array)]` in the file's order (layers with weights)."""
    import h5py

    path = Path(path)
    if path.is_dir():
        raise ModelConfigError(f"{path}: expected a Keras applications weights file (.h5). "
                               f"Received: {_directory_kind(path)}")
    if not path.is_file():
        raise ModelConfigError(f"{path}: expected a Keras applications weights file (.h5). "
                               f"Received: no such file; download it, e.g. {_url('resnet50')}")
    try:
        file = h5py.File(path, "r")
    except OSError as e:
        raise ModelConfigError(f"{path}: expected a Keras applications weights file (HDF5). "
                               f"Received: a file HDF5 cannot open ({e}); download it again") from e
    with file:
        if _attribute(file, "layer_names") is None:
            raise ModelConfigError(
                f"{path}: expected Keras applications' HDF5 weights layout (a layer_names "
                f"attribute). Received: an HDF5 file without it (a Keras 3 .weights.h5 or "
                f"another program's file); download the file `weights=` takes, e.g. "
                f"{_url('resnet50')}")
        layers = {}
        for layer in (_text(n) for n in _attribute(file, "layer_names")):
            group = file[layer]
            names = [_text(n) for n in _attribute(group, "weight_names", [])]
            if names:
                layers[layer] = [(name, np.asarray(group[name])) for name in names]
    return layers


def load_applications_weights(model, path: str | os.PathLike) -> int:
    """Assign the file's weights to `model`'s backbone; the number of tensors assigned."""
    path = Path(path)
    layers = read_applications_weights(path)
    backbone = backbone_of(model)
    targets = [layer for layer in backbone.layers if layer.weights]
    expected = [layer.name for layer in targets]
    if list(layers) != expected:
        raise ModelConfigError(f"{path}: expected the weights of {_describe(expected)}. "
                               f"Received: {_describe(list(layers))}; {_advice(backbone)}")
    pairs = []
    for layer in targets:
        variables = {v.name: v for v in layer.weights}
        for name, value in layers[layer.name]:
            leaf = name.rsplit("/", 1)[-1].split(":")[0]
            variable = variables.get(leaf)
            if variable is None or tuple(variable.shape) != value.shape:
                want = list(variable.shape) if variable is not None else "no such weight"
                raise ModelConfigError(
                    f"{path}: expected {layer.name}/{leaf} of shape {want} (channels-last). "
                    f"Received: {name} {list(value.shape)}{_layout(variable, value)}; "
                    f"{_advice(backbone)}")
            pairs.append((variable, value))
    if len(pairs) != sum(len(layer.weights) for layer in targets):
        raise ModelConfigError(f"{path}: expected all {sum(len(t.weights) for t in targets)} "
                               f"weights of the backbone. Received: {len(pairs)}; "
                               f"{_advice(backbone)}")
    for variable, value in pairs:
        variable.assign(value.astype(variable.dtype))
    return len(pairs)


def save_applications_weights(model, path: str | os.PathLike) -> Path:
    """Write `model`'s backbone in Keras applications' notop layout; the path written.

    The file `keras.applications.<Name>(weights=path, include_top=False)` and
    `load_applications_weights` read: a backbone trained here handed on as a downloaded one
    would be (benchmarks/image_transfer.py). Every layer is listed in `layer_names` (Keras's
    loader skips those without weights), each weight as `<layer>/<weight>:0` in the layer's
    order, float32. Written to a temporary name, then renamed: never a half-written file.
    """
    import h5py

    path, backbone = Path(path), backbone_of(model)
    partial = path.with_name(path.name + ".partial")
    with h5py.File(partial, "w") as file:
        file.attrs["layer_names"] = [layer.name.encode() for layer in backbone.layers]
        file.attrs["backend"] = b"tensorflow"
        file.attrs["keras_version"] = b"2.2.4"  # the applications' files' (Keras 2's layout)
        for layer in backbone.layers:
            group = file.create_group(layer.name)
            names = [f"{layer.name}/{v.name}:0" for v in layer.weights]
            group.attrs["weight_names"] = [name.encode() for name in names]
            for name, variable in zip(names, layer.weights, strict=True):
                group.create_dataset(name, data=np.asarray(variable.numpy(), np.float32))
    partial.replace(path)
    return path


def _directory_kind(path: Path) -> str:
    """What a directory given as a weights file is, and what to do instead.

    keras-hub's image presets are other networks than the built-ins: its ResNets are timm's
    (the stride in the 3x3 convolution, convolutions without biases, its own input
    normalization), its MobileNets are V3; their tensors do not fit Keras applications'
    ResNet50 or MobileNetV2, so they are refused rather than loaded into the wrong function.
    """
    import json

    try:
        registered = json.loads((path / "config.json").read_text()).get("registered_name", "")
    except (OSError, ValueError, AttributeError):
        registered = ""
    if str(registered).startswith("keras_hub>"):
        return (f"a keras-hub preset ({registered}), whose network is not the built-ins' "
                f"(keras-hub's ResNets are timm's v1.5, its MobileNets V3): train it as your "
                f"own model, a builder returning keras_hub.models.ImageClassifier.from_preset"
                f"(DIR, num_classes=N) (docs/how-to/own-model.md), or download the Keras "
                f"applications notop file, e.g. {_url('resnet50')}")
    return f"a directory; pass the .h5 file itself, e.g. {_url('resnet50')}"


def backbone_of(model):
    """The nested functional model a built-in image model wraps (or `model`, if none)."""
    import keras

    nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    return nested[0] if len(nested) == 1 else model


def _describe(names: list[str]) -> str:
    known = {first: name for name, (_, first) in FILES.items()}
    kind = known.get(names[0], "an architecture") if names else "no layers"
    top = [n for n in names if n in TOP_LAYERS]
    with_top = f", with the classifier layer {top[0]}" if top else ""
    first = f" (first {names[0]}" if names else " ("
    return f"{kind}{first}, {len(names)} layers with weights{with_top})"


def _layout(variable, value: np.ndarray) -> str:
    """Why a kernel's shape differs, when it is the channels-first (Theano) transpose."""
    if variable is not None and value.ndim == 4 and value.shape == tuple(
            variable.shape[i] for i in (3, 2, 0, 1)):
        return ", a channels-first kernel (th_dim_ordering)"
    return ""


def _advice(backbone) -> str:
    for name, (_, first) in FILES.items():
        if any(layer.name == first for layer in backbone.layers):
            return f"download the ImageNet notop file for {name}: {_url(name)}"
    return "give the weights file of the same architecture, channels-last, without the top"


def _url(name: str) -> str:
    return WEIGHTS_URL + FILES[name][0]


def _attribute(group, name: str, default=None):
    """An attribute Keras may have split into `name0`, `name1`, ... (HDF5's header limit)."""
    if name in group.attrs:
        return list(group.attrs[name])
    if f"{name}0" not in group.attrs:
        return default
    values, chunk = [], 0
    while f"{name}{chunk}" in group.attrs:
        values.extend(group.attrs[f"{name}{chunk}"])
        chunk += 1
    return values


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
