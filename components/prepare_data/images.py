"""How an image becomes model input: one home for channels, resizing and decoding.

Training (the tf.data input pipeline), evaluation, the TFLite checks and the exported
encoded-image serving signature all call these functions, so a served JPEG is turned into
exactly the pixels the model was trained on.

The rule (stated in the README and docs/ARTIFACTS.md):
- **Channels** are made to match the dataset's `image_shape[-1]`: grayscale → RGB repeats the
  one channel, RGBA → RGB drops alpha, RGB → grayscale uses `tf.image.rgb_to_grayscale`
  (ITU-R 601 luma).
- **Size**: an image whose height/width differ from `image_shape[:2]` is resized with
  `tf.image.resize(method="bilinear", antialias=True)` to exactly that size; the aspect ratio
  is **not** kept (the image is stretched), as `keras.utils.image_dataset_from_directory` does
  by default. Antialiasing keeps a large photo's downscale free of aliasing.
- **Values** stay in 0..255 (float32): rescaling is the model's first layer, so a client sends
  raw pixels and training cannot drift from serving.
- **Decoding** (`decode_to_model_input`) takes JPEG, PNG, BMP or GIF bytes (the first frame of
  an animated GIF) with `tf.io.decode_image`, then applies the same rule.

TensorFlow is imported inside the functions so that importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

RESIZE_METHOD = "bilinear"
RESIZE_ANTIALIAS = True
KEEPS_ASPECT_RATIO = False
ENCODED_FORMATS = ("jpeg", "png", "bmp", "gif")


def to_model_input(image, image_shape: Sequence[int]):
    """`image` (uint8/float, [h, w, c] with any h, w and c in 1/3/4) → float32 `image_shape`."""
    import tensorflow as tf

    height, width, channels = (int(d) for d in image_shape)
    image = _match_channels(tf.convert_to_tensor(image), channels)
    image = tf.cast(image, tf.float32)
    size = tf.shape(image)[:2]
    needs_resize = tf.logical_or(tf.not_equal(size[0], height), tf.not_equal(size[1], width))
    image = tf.cond(
        needs_resize,
        lambda: tf.image.resize(image, (height, width), method=RESIZE_METHOD,
                                antialias=RESIZE_ANTIALIAS),
        lambda: image,
    )
    return tf.ensure_shape(image, (height, width, channels))


def decode_to_model_input(encoded, image_shape: Sequence[int]):
    """One encoded image (a scalar string tensor: JPEG/PNG/BMP/GIF bytes) → float32 input."""
    import tensorflow as tf

    image = tf.io.decode_image(encoded, channels=0, expand_animations=False)
    image.set_shape([None, None, None])
    return to_model_input(image, image_shape)


def _match_channels(image, channels: int):
    """Repeat, drop or combine channels so that the image has `channels` of them."""
    import tensorflow as tf

    if channels not in (1, 3):
        raise ValueError(f"image_shape must end in 1 or 3 channels. Received: {channels}")
    have = tf.shape(image)[-1]
    if channels == 3:
        return tf.case([
            (tf.equal(have, 1), lambda: tf.tile(image[..., :1], [1, 1, 3])),
            (tf.greater_equal(have, 3), lambda: image[..., :3]),
        ], default=lambda: tf.tile(image[..., :1], [1, 1, 3]))  # 2 = gray+alpha: the gray
    return tf.cond(
        tf.greater_equal(have, 3),
        lambda: tf.cast(tf.round(tf.image.rgb_to_grayscale(
            tf.cast(image[..., :3], tf.float32))), image.dtype),
        lambda: image[..., :1],
    )
