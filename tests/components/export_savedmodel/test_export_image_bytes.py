"""The exported `image_bytes` signature: files in, the training rule's pixels, bounded decoding."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares `width` x `height`, with no pixel data (a bomb's head)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0,
                                                              0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def _encoded(image: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(buffer, fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def signatures(mixed_export):
    import tensorflow as tf

    return tf.saved_model.load(str(mixed_export.version_dir)).signatures


def _both(signatures, encoded: list[bytes], pixels: np.ndarray):
    import tensorflow as tf

    got = signatures["image_bytes"](image_bytes=tf.constant(encoded, dtype=tf.string))
    want = signatures["serving_default"](images=tf.constant(pixels, dtype=tf.float32))
    return ({k: v.numpy() for k, v in got.items()}, {k: v.numpy() for k, v in want.items()})


def test_image_bytes_png_equals_serving_default_on_same_pixels(signatures, prepared_digits):
    from ampflow.data import load_arrays

    images, _ = load_arrays(prepared_digits, "test", limit=16)
    got, want = _both(signatures, [_encoded(i, "PNG") for i in images], images)
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-6, rtol=0)
    np.testing.assert_array_equal(got["class_ids"], want["class_ids"])


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "BMP", "GIF"])
def test_image_bytes_large_rgb_file_follows_training_rule(signatures, fmt):
    """A 3-channel 40x30 photo is made gray and resized in the graph exactly as in training."""
    import tensorflow as tf

    from ampflow.data.images import decode_to_model_input

    rng = np.random.default_rng(3)
    photo = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    data = _encoded(photo, fmt)
    pixels = decode_to_model_input(tf.constant(data), (8, 8, 1)).numpy()[None]
    assert pixels.shape == (1, 8, 8, 1)
    got, want = _both(signatures, [data], pixels)
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-6, rtol=0)
    np.testing.assert_array_equal(got["class_ids"], want["class_ids"])


@pytest.mark.parametrize("data, message", [
    (b"not an image", "Unknown image file format"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "PNG"),
    (b"", "Input is empty"),
])
def test_image_bytes_corrupt_file_is_invalid_argument(signatures, data, message):
    import tensorflow as tf

    good = _encoded(np.zeros((8, 8, 1), np.uint8), "PNG")
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        signatures["image_bytes"](image_bytes=tf.constant([good, data]))


def test_image_bytes_bomb_refused_before_decoding(signatures):
    import tensorflow as tf

    from ampflow.serving.model_format import MAX_IMAGE_PIXELS

    bomb = _png_header_only(50_000, 50_000)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"at most {MAX_IMAGE_PIXELS} pixels.*50000.*x.*50000"):
        signatures["image_bytes"](image_bytes=tf.constant([bomb]))
    # Control: at the bound the header passes and the decoder itself refuses the empty data.
    with pytest.raises(tf.errors.InvalidArgumentError) as excinfo:
        signatures["image_bytes"](image_bytes=tf.constant([_png_header_only(4096, 4096)]))
    assert "pixels" not in excinfo.value.message


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "BMP", "GIF"])
def test_declared_size_reads_each_format_header(fmt):
    import tensorflow as tf

    from ampflow.components.export_savedmodel.encoded_images import declared_size

    data = _encoded(np.zeros((37, 53, 3), np.uint8), fmt)
    height, width = declared_size(tf.constant(data))
    assert (int(height), int(width)) == (37, 53)
    assert [int(d) for d in declared_size(tf.constant(b"xx"))] == [0, 0]


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "GIF"])
def test_declared_size_needs_no_valid_pixel_data(fmt):
    """The header alone is read: a file cut after its header still reports its size."""
    import tensorflow as tf

    from ampflow.components.export_savedmodel.encoded_images import declared_size

    data = _encoded(np.zeros((300, 200, 3), np.uint8), fmt)[:32]
    assert [int(d) for d in declared_size(tf.constant(data))] == [300, 200]


def _gif(frames: list[np.ndarray]) -> bytes:
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, "GIF", save_all=True, append_images=images[1:], optimize=False)
    return buffer.getvalue()


def test_gif_frame_pixels_sums_every_frame():
    import tensorflow as tf

    from ampflow.components.export_savedmodel.encoded_images import gif_frame_pixels

    rng = np.random.default_rng(0)
    still = _gif([rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)])
    frames = _gif([np.full((10, 20), 40 * i, np.uint8) for i in range(5)])
    walk = tf.function(gif_frame_pixels)
    assert int(walk(tf.constant(still))) == 37 * 53
    assert int(walk(tf.constant(frames))) == 5 * 10 * 20


def test_image_bytes_gif_of_many_frames_refused_before_decoding(signatures):
    """Each frame is within the bound, all of them together are not: TensorFlow's GIF decoder
    would hold every frame (5 x 2000 x 2000 here) although only the first is kept."""
    import tensorflow as tf

    from ampflow.serving.model_format import MAX_IMAGE_PIXELS

    bomb = _gif([np.full((2000, 2000), 60 * i, np.uint8) for i in range(5)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"at most {MAX_IMAGE_PIXELS}"):
        signatures["image_bytes"](image_bytes=tf.constant([bomb]))
    few = _gif([np.full((2000, 2000), 60 * i, np.uint8) for i in range(4)])  # 16e6: fits
    assert signatures["image_bytes"](image_bytes=tf.constant([few]))["class_ids"].shape == (1,)


def _declaring(fmt: str, height: int, width: int) -> bytes:
    """A small valid file of `fmt` whose header is rewritten to declare height x width."""
    data = bytearray(_encoded(np.zeros((8, 8, 3), np.uint8), fmt))
    if fmt == "JPEG":
        at = data.index(b"\xff\xc0") + 5  # baseline frame header: height, width (big-endian)
        data[at:at + 4] = struct.pack(">HH", height, width)
    elif fmt == "BMP":
        data[18:26] = struct.pack("<ii", width, height)
    elif fmt == "GIF":
        data[6:10] = struct.pack("<HH", width, height)
    else:
        data[16:24] = struct.pack(">II", width, height)
    return bytes(data)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "BMP", "GIF"])
def test_image_bytes_oversized_header_of_each_format_refused(signatures, fmt):
    import tensorflow as tf

    from ampflow.serving.model_format import MAX_IMAGE_PIXELS

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"at most {MAX_IMAGE_PIXELS} pixels.*\[4097\] \[x\] \[4096\]"):
        signatures["image_bytes"](image_bytes=tf.constant([_declaring(fmt, 4097, 4096)]))
