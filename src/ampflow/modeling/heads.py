"""The classification head every built-in model ends in, image and text alike.

Its own module so that the image models (models.py) and the text models (text_models.py) share
it without importing each other, and without importing Keras until a model is built.
"""

from __future__ import annotations


def float32_head(x, num_classes: int):
    """Logits and softmax in float32, the part of the model that must not run in half precision."""
    from keras import layers

    logits = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
