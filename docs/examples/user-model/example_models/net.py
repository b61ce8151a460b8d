"""A builder as ampflow calls it: `build(input_shape, num_classes)` → an uncompiled Keras model.

The contract (docs/how-to/own-model.md, "The builder's contract"):
- the input is `(None, H, W, C)` float32 raw pixels 0..255, H, W, C being the prepared
  dataset's `image_shape` (`prepare-data --image-size` sets it): the model rescales inside;
- the output is `(None, num_classes)`, logits or softmax probabilities; ampflow recomputes a
  softmax in float32 and adds its float32 `logits`/`probabilities` head;
- custom layers implement `get_config` (and take `**kwargs`), so the model saves as `.keras`
  and ampflow can rebuild it under another dtype policy; registering them is not required.
"""

import keras
from keras import layers, ops


class ChannelScale(layers.Layer):
    """A learned per-channel scale: a custom layer that holds its own weights.

    Its math follows the layer's compute dtype (`ops.cast(self.gamma, x.dtype)`), so it stays
    in the mixed-precision chain instead of forcing float32 casts around itself.
    """

    def build(self, input_shape):
        self.gamma = self.add_weight(shape=(input_shape[-1],), initializer="ones",
                                     name="gamma")

    def call(self, x):
        return x * ops.cast(self.gamma, x.dtype)


def build(input_shape, num_classes):
    """A small conv net with a custom layer, LayerNormalization and Dropout."""
    inputs = keras.Input(shape=input_shape)
    x = layers.Rescaling(1 / 255.0)(inputs)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = ChannelScale()(x)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.LayerNormalization()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(num_classes, activation="softmax")(x))
