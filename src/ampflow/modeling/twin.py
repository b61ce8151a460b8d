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
from ampflow.modeling.user_model import LOGITS_LAYER


def build_float32_twin(model, metadata: dict[str, Any] | None = None):
    """`model`'s architecture rebuilt under the float32 policy, with its trained weights.

    Every layer is re-created from its own config with the dtype replaced
    (`user_model.rebuild_with_policy`), so this works for the built-ins, a user's builder and a
    fine-tuned `.keras` file alike, without calling the builder again. `metadata` (the
    train step's) only names the model in errors. ModelLoadError when the copy cannot be made.
    """
    from ampflow.errors import ConfigError
    from ampflow.modeling.user_model import rebuild_with_policy

    try:
        return rebuild_with_policy(model, "float32")
    except ConfigError as e:
        name = (metadata or {}).get("architecture", model.name)
        raise ModelLoadError(f"could not rebuild model {name!r} under float32: {e}") from e


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
            f"train.heads.float32_head builds). Received: a model {model.name!r} with layers "
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
