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


def model_channels(source_channels: int | None) -> int:
    """The channel count a dataset trains and serves at, from its images' channel count.

    1 (grayscale) and 2 (grayscale + alpha) train as 1; 3 (RGB), 4 (RGBA) and unknown (a
    dataset that mixes them, or does not say) train as 3: `_match_channels` then repeats a
    grayscale image's channel or drops the alpha, image by image.
    """
    return 1 if source_channels in (1, 2) else 3


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
    """Repeat, drop or combine channels so that the image has `channels` of them.

    A channel count known when the graph is built (a TFDS feature, an array) picks its branch
    in Python: `tf.cond` would build both, and `rgb_to_grayscale` cannot even be built for a
    1-channel image. An unknown count (a decoded file) is dispatched in the graph.
    """
    import tensorflow as tf

    if channels not in (1, 3):
        raise ValueError(f"image_shape must end in 1 or 3 channels. Received: {channels}")
    static = image.shape[-1]
    if static is not None:
        return _to_gray(image) if channels == 1 and static >= 3 else (
            image[..., :1] if channels == 1 else _to_rgb(image, static))
    have = tf.shape(image)[-1]
    if channels == 3:
        return tf.case([
            (tf.equal(have, 1), lambda: tf.tile(image[..., :1], [1, 1, 3])),
            (tf.greater_equal(have, 3), lambda: image[..., :3]),
        ], default=lambda: tf.tile(image[..., :1], [1, 1, 3]))  # 2 = gray+alpha: the gray
    return tf.cond(tf.greater_equal(have, 3), lambda: _to_gray(image), lambda: image[..., :1])


def _to_rgb(image, have: int):
    """RGB(A) keeps its first 3 channels; gray (with or without alpha) repeats the gray."""
    import tensorflow as tf

    return image[..., :3] if have >= 3 else tf.tile(image[..., :1], [1, 1, 3])


def _to_gray(image):
    """ITU-R 601 luma of the first 3 channels, rounded back to the image's dtype."""
    import tensorflow as tf

    gray = tf.image.rgb_to_grayscale(tf.cast(image[..., :3], tf.float32))
    return tf.cast(tf.round(gray), image.dtype)
