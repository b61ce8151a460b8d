"""The graph of the `image_bytes` signature: encoded files in, model input out, bounded.

How an image becomes model input (channels, resize, values) has one home,
`ampflow.data.images.decode_to_model_input`; this module only adds what a
served graph needs around it:
- a **size check before decoding**: TensorFlow's decoders allocate what a header declares, up
  to 2**29..2**31 bytes (a 400 KB PNG of 20000 x 20000 zeros decoded to 400 MB, measured), so the
  height and width in the header are read first (PNG's IHDR, a GIF's canvas, BMP's info header,
  JPEG's frame header through `tf.io.extract_jpeg_shape`) and an image above
  `model_format.MAX_IMAGE_PIXELS` fails the request with INVALID_ARGUMENT before any decode;
  a GIF's frames are counted too, because TensorFlow's GIF decoder reads every frame into
  memory even when only the first is kept (a 470 KB GIF of 100 frames of 2000 x 2000 took
  400 MB, measured): all its frames together must fit the same bound;
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


def gif_frame_pixels(encoded):
    """The pixels of all frames of a GIF together (int64), walking its blocks, not decoding.

    Stops early once the sum passes MAX_IMAGE_PIXELS; a walk that runs off the data ends
    there (the decoder then refuses the file). One loop step per block or 255-byte sub-block:
    about 50 µs each in the graph on this project's CPU (1 s for a 5.5 MB GIF that decodes in
    0.07 s), bounded by the request's byte limit like every other per-byte cost.
    """
    import tensorflow as tf

    data = tf.cast(tf.io.decode_raw(encoded, tf.uint8), tf.int64)
    n = tf.size(data, out_type=tf.int64)

    def at(i):
        i = tf.convert_to_tensor(i, tf.int64)
        return tf.where(i < n, tf.gather(data, tf.clip_by_value(i, tf.constant(0, tf.int64),
                                                                n - 1)), tf.constant(0, tf.int64))

    def color_table(packed):  # bytes of a color table a descriptor's packed field announces
        return tf.where(packed >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64),
                                                                 packed % 8), 0)

    def step(pos, in_sub_blocks, total, done):
        b = at(pos)
        image, extension = tf.equal(b, 0x2C), tf.equal(b, 0x21)
        area = (at(pos + 5) + 256 * at(pos + 6)) * (at(pos + 7) + 256 * at(pos + 8))
        after_image = pos + 10 + color_table(at(pos + 9)) + 1  # + LZW minimum code size
        block_pos = tf.where(image, after_image, pos + 2)  # an extension: introducer, label
        return (tf.where(in_sub_blocks, pos + b + 1, block_pos),
                tf.where(in_sub_blocks, tf.not_equal(b, 0), image | extension),
                total + tf.where(~in_sub_blocks & image, area, 0),
                ~in_sub_blocks & ~image & ~extension)  # the trailer (or garbage) ends it

    def more(pos, _in_sub_blocks, total, done):
        return ~done & (pos < n) & (total <= MAX_IMAGE_PIXELS)

    start = 13 + color_table(at(10))  # header, logical screen, global color table
    _, _, total, _ = tf.while_loop(
        more, step, (start, tf.constant(False), tf.constant(0, tf.int64), tf.constant(False)),
        parallel_iterations=1)
    return total


def decode_checked(encoded, image_shape: Sequence[int]):
    """One encoded image → float32 `image_shape`, refused above MAX_IMAGE_PIXELS undecoded."""
    import tensorflow as tf

    from ampflow.data.images import decode_to_model_input

    height, width = declared_size(encoded)
    is_gif = tf.equal(tf.strings.substr(encoded, 0, len(ENCODED_IMAGE_MAGIC["gif"])),
                      ENCODED_IMAGE_MAGIC["gif"])
    frames = tf.cond(is_gif, lambda: gif_frame_pixels(encoded),
                     lambda: tf.constant(0, tf.int64))
    fits = (tf.less_equal(height * width, MAX_IMAGE_PIXELS) & (height >= 0) & (width >= 0)
            & tf.less_equal(frames, MAX_IMAGE_PIXELS))
    check = tf.debugging.Assert(fits, [
        f"image_bytes: an image must have at most {MAX_IMAGE_PIXELS} pixels (height x width; "
        "a GIF: all its frames together). Received: an image whose header declares height x "
        "width =", height, "x", width, "; GIF frames, in pixels (0: not a GIF):", frames])
    with tf.control_dependencies([check]):
        return decode_to_model_input(tf.identity(encoded), image_shape)


def decode_batch(encoded, image_shape: Sequence[int]):
    """A string [-1] batch of encoded images → float32 [-1, H, W, C], one image at a time."""
    import tensorflow as tf

    shape = tuple(int(d) for d in image_shape)
    return tf.map_fn(lambda one: decode_checked(one, shape), encoded,
                     fn_output_signature=tf.TensorSpec(shape, tf.float32),
                     parallel_iterations=1)
