"""Keras applications' ImageNet weights files, written by the tests with h5py from a Keras model.

The layout of `resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5` and its kind (Keras 2's
`save_weights` to HDF5): the root's `layer_names` attribute names every layer in order, with
`backend` and `keras_version`; a group per layer whose `weight_names` attribute lists
`<layer>/<weight>:0` in the layer's order (trainable first: BatchNormalization's gamma, beta,
then moving_mean, moving_variance), each a dataset at that name (so under a subgroup). The
tests also read these files with Keras's own loader, the one `weights=` uses.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import h5py
import numpy as np


def randomize(model, seed: int = 0) -> None:
    """Every variable random (positive variances), so a weight put in the wrong place shows."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        value = rng.standard_normal(tuple(variable.shape)).astype(np.float32)
        variable.assign(np.abs(value) + 0.5 if "variance" in variable.name else value)


def write_applications_weights(path: Path, model, *, channels_first: bool = False) -> Path:
    """Write `model`'s weights in the applications' layout (kernels transposed if asked)."""
    with h5py.File(path, "w") as file:
        file.attrs["layer_names"] = [layer.name.encode() for layer in model.layers]
        file.attrs["backend"] = b"tensorflow"
        file.attrs["keras_version"] = b"2.2.4"
        for layer in model.layers:
            group = file.create_group(layer.name)
            names = [f"{layer.name}/{v.name}:0" for v in layer.weights]
            group.attrs["weight_names"] = [name.encode() for name in names]
            for name, variable in zip(names, layer.weights, strict=True):
                value = np.asarray(variable.numpy())
                if channels_first and value.ndim == 4:
                    value = value.transpose(3, 2, 0, 1)  # Theano's [out, in, rows, cols]
                group.create_dataset(name, data=value)
    return path


def pretrained_like(model, seed: int) -> None:
    """Values a trained net could hold, none equal to a fresh build's.

    Kernels ~ 1/sqrt(fan in), BatchNormalization's scale and statistics near 1 and 0: the
    forward pass of a deep net stays finite (under float16 too), and a tensor loaded into the
    wrong variable shows. `randomize`'s unit-variance kernels overflow a ResNet-50.
    """
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


def notop_file_name(name: str) -> str:
    """The file name Keras applications download `name`'s ImageNet notop weights under."""
    from ampflow.modeling.imagenet_weights import FILES

    return FILES[name][0].rsplit("/", 1)[-1]


def write_notop_file(directory: Path, name: str, seed: int = 7) -> Path:
    """The ImageNet notop file of ampflow's built-in `name` (resnet50, mobilenet_v2), under the
    name Keras applications download it, from the same architecture at 32 px."""
    import keras

    constructor = {"resnet50": "ResNet50", "mobilenet_v2": "MobileNetV2"}[name]
    backbone = getattr(keras.applications, constructor)(
        include_top=False, weights=None, input_shape=(32, 32, 3), pooling="avg")
    pretrained_like(backbone, seed)
    return write_applications_weights(directory / notop_file_name(name), backbone)


def file_tensors(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Layer → weight name (`kernel`, `gamma`, ...) → the file's tensor."""
    from ampflow.modeling.imagenet_weights import read_applications_weights

    return {layer: {name.rsplit("/", 1)[-1].split(":")[0]: value for name, value in weights}
            for layer, weights in read_applications_weights(path).items()}


def backbone_tensors(model) -> dict[str, dict[str, np.ndarray]]:
    """The same mapping for the backbone a built-in image model wraps."""
    from ampflow.modeling.imagenet_weights import backbone_of

    return {layer.name: {v.name: np.asarray(v.numpy()) for v in layer.weights}
            for layer in backbone_of(model).layers if layer.weights}


@contextlib.contextmanager
def observed_phases():
    """A list that gets, as each phase's training loop ends (phases.py), the backbone's tensors,
    the number of trainable variables and the eval step with its trace count. Observes the real
    loop; changes nothing."""
    from ampflow.components.train.run import phases

    taken: list[dict] = []
    real = phases.TrainLoop

    class Observed(real):
        def fit(self, *args, **kwargs):
            result = super().fit(*args, **kwargs)
            taken.append({"backbone": backbone_tensors(self.model),
                          "trainable": len(self.model.trainable_variables),
                          "eval_step": self._eval_step,
                          "eval_traces": self._eval_step.experimental_get_tracing_count()})
            return result

    phases.TrainLoop = Observed
    try:
        yield taken
    finally:
        phases.TrainLoop = real


def check_phases(taken: list[dict], path: Path) -> None:
    """Phase 1 (head, backbone frozen) ended on the file's tensors bit for bit, its
    BatchNormalization statistics included; phase 2 (every layer) moved every one of them."""
    expected = file_tensors(path)
    head, fine = taken
    assert head["trainable"] < fine["trainable"]  # phase 1: the head's variables only
    # phase 2 evaluated with phase 1's eval step, traced once (loop.py's evaluate_with)
    assert fine["eval_step"] is head["eval_step"] and fine["eval_traces"] == head[
        "eval_traces"] >= 1
    assert set(head["backbone"]) == set(expected)
    for layer, weights in expected.items():
        assert set(head["backbone"][layer]) == set(weights), layer
        for name, value in weights.items():
            np.testing.assert_array_equal(head["backbone"][layer][name], value,
                                          err_msg=f"{layer}/{name}")
    still = [f"{layer}/{name}" for layer, weights in expected.items()
             for name, value in weights.items()
             if np.array_equal(fine["backbone"][layer][name], value)]
    assert not still, f"phase 2 left {len(still)} tensor(s) unmoved: {still[:5]}"
