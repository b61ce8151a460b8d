"""The graph of the `image_bytes` signature: encoded files in, model input out, bounded.

How an image becomes model input (channels, resize, values) has one home,
`ampflow.components.prepare_data.images.decode_to_model_input`; this module only adds what a
served graph needs around it:
- a **size check before decoding**: TensorFlow's decoders allocate what a header declares, up
  to 2**29..2**31 bytes (a 400 KB PNG of 20000 x 20000 zeros decoded to 400 MB, measured), so the
  height and width in the header are read first (PNG's IHDR, a GIF's canvas, BMP's info header,
  JPEG's frame header through `tf.io.extract_jpeg_shape`) and an image above
  `model_format.MAX_IMAGE_PIXELS` fails the request with INVALID_ARGUMENT before any decode;
- **one image at a time** (`tf.map_fn` with `parallel_iterations=1`): a batch of large photos
  never holds more than one decoded image at once.
Everything here runs inside the SavedModel, so TF Serving itself enforces the same bound.
"""

from __future__ import annotations

from collections.abc import Sequence

from ampflow.serving.model_format import ENCODED_IMAGE_MAGIC, MAX_IMAGE_PIXELS

_HEAD_BYTES = 32  # enough for every header field read below (BMP's height ends at byte 26)


def declared_size(encoded):
    """(height, width) as int64 scalars, read from the header of one encoded image.

    (0, 0) for bytes that are none of the four formats (the decoder refuses them). A JPEG whose
    header does not parse fails here, with the decoder's own INVALID_ARGUMENT.
    """
    import tensorflow as tf

    head = tf.strings.substr(encoded, 0, _HEAD_BYTES)
    head = tf.strings.substr(tf.strings.join([head, b"\0" * _HEAD_BYTES]), 0, _HEAD_BYTES)
    b = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)

    def big_endian(i: int, n: int):
        return sum(b[i + k] * 256 ** (n - 1 - k) for k in range(n))

    def little_endian(i: int, n: int):
        return sum(b[i + k] * 256 ** k for k in range(n))

    def jpeg():
        shape = tf.cast(tf.io.extract_jpeg_shape(encoded), tf.int64)
        return shape[0], shape[1]

    def bmp():  # a negative height means rows top-down
        height = little_endian(22, 4)
        return tf.abs(tf.where(height >= 2 ** 31, height - 2 ** 32, height)), little_endian(18, 4)

    def is_format(name: str):
        magic = ENCODED_IMAGE_MAGIC[name]
        return tf.equal(tf.strings.substr(encoded, 0, len(magic)), magic)

    zero = tf.constant(0, tf.int64)
    return tf.case([
        (is_format("png"), lambda: (big_endian(20, 4), big_endian(16, 4))),
        (is_format("gif"), lambda: (little_endian(8, 2), little_endian(6, 2))),
        (is_format("bmp"), bmp),
        (is_format("jpeg"), jpeg),
    ], default=lambda: (zero, zero), exclusive=True)


def decode_checked(encoded, image_shape: Sequence[int]):
    """One encoded image → float32 `image_shape`, refused above MAX_IMAGE_PIXELS undecoded."""
    import tensorflow as tf

    from ampflow.components.prepare_data.images import decode_to_model_input

    height, width = declared_size(encoded)
    fits = tf.logical_and(tf.less_equal(height * width, MAX_IMAGE_PIXELS),
                          tf.logical_and(height >= 0, width >= 0))
    check = tf.debugging.Assert(fits, [
        f"image_bytes: an image must have at most {MAX_IMAGE_PIXELS} pixels (height x width). "
        "Received: an image whose header declares height x width =", height, "x", width])
    with tf.control_dependencies([check]):
        return decode_to_model_input(tf.identity(encoded), image_shape)


def decode_batch(encoded, image_shape: Sequence[int]):
    """A string [-1] batch of encoded images → float32 [-1, H, W, C], one image at a time."""
    import tensorflow as tf

    shape = tuple(int(d) for d in image_shape)
    return tf.map_fn(lambda one: decode_checked(one, shape), encoded,
                     fn_output_signature=tf.TensorSpec(shape, tf.float32),
                     parallel_iterations=1)
