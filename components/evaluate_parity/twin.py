"""The float32 twin of a mixed-precision model, and the logits view of any model.

The twin is the same architecture rebuilt under the `float32` policy with the trained weights
copied in. Variables are float32 under every Keras mixed policy, so the copy is exact: any
difference between the two models comes from the half-precision compute alone. That makes the
twin both the reference of the parity gate and what export/TFLite convert (a graph with float16
Conv2D/MatMul does not convert to TFLite builtins: docs/DESIGN.md, "Export, TFLite,
serving").
"""

from __future__ import annotations

from typing import Any

from ampflow.errors import ModelLoadError

LOGITS_LAYER = "logits"
_REQUIRED_METADATA = ("model_name", "input_shape", "num_classes")


def build_float32_twin(model, metadata: dict[str, Any]):
    """Rebuild `model`'s architecture under the float32 policy and copy its trained weights.

    `metadata` is the train step's `metadata.json` (model_name, input_shape, num_classes,
    image_size). Raises ModelLoadError when the metadata cannot rebuild the architecture or the
    weights do not fit it (a model that was not built by `train.models.build_model`).
    """
    from ampflow.components.train.models import build_model

    missing = [key for key in _REQUIRED_METADATA if key not in metadata]
    if missing:
        raise ModelLoadError(
            f"metadata must hold {list(_REQUIRED_METADATA)} to rebuild the float32 twin. "
            f"Received: metadata without {missing}"
        )
    twin = build_model(
        metadata["model_name"],
        tuple(metadata["input_shape"]),
        int(metadata["num_classes"]),
        image_size=metadata.get("image_size"),
        policy="float32",
    )
    try:
        twin.set_weights(model.get_weights())
    except ValueError as e:
        raise ModelLoadError(
            f"the weights of model {model.name!r} do not fit the {metadata['model_name']!r} "
            f"architecture rebuilt from its metadata: {e}"
        ) from e
    return twin


def logits_model(model):
    """A view of `model` that returns the pre-softmax `logits` layer output (float32).

    Parity is measured on logits, not probabilities: softmax saturates, so two models whose
    probabilities agree to 1e-7 can still have logits far apart.
    """
    import keras

    try:
        layer = model.get_layer(LOGITS_LAYER)
    except ValueError as e:
        raise ModelLoadError(
            f"the model must have a layer named {LOGITS_LAYER!r} (the float32 Dense head that "
            f"train.models.float32_head builds). Received: a model {model.name!r} with layers "
            f"{[layer.name for layer in model.layers][-4:]} at the end"
        ) from e
    return keras.Model(model.inputs, layer.output, name=f"{model.name}_logits")


def compute_policy(model) -> str:
    """The dtype policy of the model's compute layers (the policy it was trained under).

    The head is pinned to float32, so look at the first layer with weights that is not the head.
    """
    for layer in model.layers:
        if layer.weights and layer.name != LOGITS_LAYER:
            return layer.dtype_policy.name
    return model.dtype_policy.name
