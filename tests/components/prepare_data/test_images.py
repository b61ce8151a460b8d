"""images.py: one rule for channels and size, whether the channel count is known or not."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from ampflow.data.images import (
    decode_to_model_input,
    model_channels,
    to_model_input,
)


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array.squeeze(-1) if array.shape[-1] == 1 else array).save(out, "PNG")
    return out.getvalue()


RNG = np.random.default_rng(0)
IMAGES = {c: RNG.integers(0, 256, (5, 6, c), dtype=np.uint8) for c in (1, 2, 3, 4)}


@pytest.mark.parametrize("have", [1, 2, 3, 4])
@pytest.mark.parametrize("want", [1, 3])
def test_to_model_input_static_channels_equal_the_decoded_file_rule(have, want):
    """A TFDS feature (channels known) and an encoded file (unknown) become the same pixels."""
    image = IMAGES[have]
    static = to_model_input(tf.constant(image), (5, 6, want)).numpy()
    decoded = decode_to_model_input(tf.constant(_png(image)), (5, 6, want)).numpy()
    np.testing.assert_array_equal(static, decoded)
    assert static.shape == (5, 6, want) and static.dtype == np.float32


@pytest.mark.parametrize("want", [1, 3])
def test_to_model_input_in_a_dataset_map_builds_for_one_channel_images(want):
    """Graph mode with a known 1-channel shape (ampflow_digits): no RGB branch is built."""
    ds = tf.data.Dataset.from_tensor_slices(np.stack([IMAGES[1]] * 2)).map(
        lambda x: to_model_input(x, (4, 4, want)))
    assert ds.element_spec.shape == (4, 4, want)
    images = np.stack(list(ds.as_numpy_iterator()))
    np.testing.assert_array_equal(images[..., 0], images[..., -1])  # gray kept or repeated


def test_to_model_input_same_size_is_the_plain_cast():
    np.testing.assert_array_equal(to_model_input(IMAGES[3], (5, 6, 3)).numpy(),
                                  IMAGES[3].astype(np.float32))


@pytest.mark.parametrize(("source", "expected"), [(1, 1), (2, 1), (3, 3), (4, 3), (None, 3)])
def test_model_channels_rgba_and_unknown_train_as_rgb(source, expected):
    assert model_channels(source) == expected


@pytest.mark.parametrize("crop_size", [(180, 200), (224, 190), (200, 224), (224, 224), (9, 7)])
def test_augmentation_enlarges_its_crop_with_the_pixels_of_the_antialiased_rule(crop_size):
    """resize_crop_back skips antialiasing (enlarging: it changes nothing but the cost)."""
    from ampflow.data.input_pipeline import resize_crop_back

    crop = np.random.default_rng(0).uniform(0, 255, (*crop_size, 3)).astype(np.float32)
    rule = to_model_input(crop, (224, 224, 3)).numpy()
    fast = resize_crop_back(crop, (224, 224, 3)).numpy()
    assert fast.shape == rule.shape == (224, 224, 3)
    np.testing.assert_allclose(fast, rule, atol=0.005)
