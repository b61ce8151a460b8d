"""Keras applications' ImageNet weights files, written by the tests with h5py from a Keras model.

The layout of `resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5` and its kind (Keras 2's
`save_weights` to HDF5): the root's `layer_names` attribute names every layer in order, with
`backend` and `keras_version`; a group per layer whose `weight_names` attribute lists
`<layer>/<weight>:0` in the layer's order (trainable first: BatchNormalization's gamma, beta,
then moving_mean, moving_variance), each a dataset at that name (so under a subgroup). The
tests also read these files with Keras's own loader, the one `weights=` uses.
"""

from __future__ import annotations

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
