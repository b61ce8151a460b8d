"""The tf.data input pipeline shared by training, evaluation, export warm-up and TFLite checks.

Every image leaves `load_split` as model input: float32 at exactly the dataset's `image_shape`
(channels matched and resized by `images.to_model_input`, the rule the exported image_bytes
signature applies too), with values still RAW 0..255: rescaling lives inside the model, so the
served model takes exactly what a client sends and training cannot drift from serving. For a
dataset stored at its `image_shape` (ampflow_digits, mnist, cifar10 without --image-size) this
is a plain cast: bit-identical to the uint8 pixels.

Augmentation (`make_input_pipeline(..., augment=True)`) runs after the cache, so every epoch
sees new crops, and is seeded per example (stateless ops), so a run is reproducible:
- a random crop of 80-100 % of each side (each side drawn on its own), resized back to
  `image_shape` with the images.py rule (bilinear, antialiased);
- a random horizontal flip (probability 1/2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from ampflow.components.prepare_data import (  # noqa: F401  (register the builders)
    offline_digits,
    offline_mnist,
)
from ampflow.components.prepare_data.holdout import holdout_mask
from ampflow.components.prepare_data.images import to_model_input
from ampflow.components.prepare_data.step import load_dataset_info
from ampflow.errors import ConfigError, DatasetError

CROP_MIN_FRACTION = 0.8  # the smallest random crop, per side, of augmentation


def load_split(prepared_dir: str | os.PathLike, split: str) -> tf.data.Dataset:
    """Return `(image float32 image_shape, label int64)` examples of `split` ("train"/"test")."""
    info = load_dataset_info(prepared_dir)
    ds = _read(info, _split_spec(info, split))
    image_key, label_key = info["image_key"], info["label_key"]
    if info.get("holdout"):
        ds = _apply_holdout(ds, info["holdout"], keep_test=(split == "test"))
    image_shape = tuple(int(d) for d in info["image_shape"])
    return ds.map(
        lambda ex: (to_model_input(ex[image_key], image_shape),
                    tf.cast(ex[label_key], tf.int64)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def load_arrays(
    prepared_dir: str | os.PathLike, split: str, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return a split as numpy arrays: images [N, *image_shape], labels int64 [N].

    The images are `load_split`'s (the pixels training sees). They come back as uint8 when no
    image is resized (source and model size agree: every value is an integer 0..255, so uint8
    holds them exactly, as before), else as float32 (a resized pixel is not an integer, and
    rounding it would evaluate the model on other pixels than it was trained on).
    """
    info = load_dataset_info(prepared_dir)
    ds = load_split(prepared_dir, split)
    if limit is not None:
        ds = ds.take(limit)
    images, labels = [], []
    for image_batch, label_batch in ds.batch(1024).as_numpy_iterator():
        images.append(image_batch)
        labels.append(label_batch)
    if not images:
        raise DatasetError(f"split {split!r} of {prepared_dir} is empty")
    images = np.concatenate(images)
    return (images if is_resized(info) else images.astype(np.uint8)), np.concatenate(labels)


def is_resized(info: dict[str, Any]) -> bool:
    """Whether any image of the dataset may be resized on its way to the model."""
    source = info.get("source_image_shape") or info["image_shape"]
    return list(source[:2]) != list(info["image_shape"][:2])


def make_input_pipeline(
    ds: tf.data.Dataset,
    *,
    batch_size: int,
    training: bool,
    seed: int = 0,
    cache: bool = True,
    shuffle_buffer: int = 10_000,
    augment: bool = False,
) -> tf.data.Dataset:
    """Parallel map → cache → seeded shuffle → [augment] → batch → prefetch (AUTOTUNE).

    Training batches drop the remainder so that every step has the same shape (one XLA
    compilation, not two); evaluation keeps every example. `augment` (training only: a
    random crop + flip, see the module docstring) is seeded by `seed`, new every epoch.
    """
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0. Received: batch_size={batch_size}")
    if augment and not training:
        raise ConfigError("augment must be False for evaluation (training=False). "
                          "Received: augment=True")
    ds = ds.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if augment:
        ds = _augmented(ds, seed)
    ds = ds.batch(batch_size, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def _to_float(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Cast raw pixels to float32 (values stay 0..255: the model rescales)."""
    return tf.cast(image, tf.float32), label


def _augmented(ds: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    """Random crop + flip, each example seeded by a stream that is new every epoch.

    The per-example seeds come from `Dataset.random(seed, rerandomize_each_iteration=True)`
    zipped alongside, and the ops are stateless: the result does not depend on how tf.data
    schedules the parallel map, only on `seed` and the epoch.
    """
    image_spec = ds.element_spec[0]
    if not image_spec.shape.is_fully_defined():
        raise ConfigError("augment needs images of one known shape (load_split's). Received: "
                          f"images of shape {image_spec.shape}")
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(4)
    return tf.data.Dataset.zip((ds, seeds)).map(
        lambda example, s: (_crop_and_flip(example[0], tf.reshape(s, (2, 2))), example[1]),
        num_parallel_calls=tf.data.AUTOTUNE)


def _crop_and_flip(image: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
    """One image: a random box of 80-100 % of each side, resized back, randomly flipped."""
    shape = tuple(int(d) for d in image.shape)  # static: load_split gives image_shape exactly
    fractions = tf.random.stateless_uniform((2,), seed=seeds[0], minval=CROP_MIN_FRACTION,
                                            maxval=1.0)
    sides = tf.cast(tf.round(fractions * tf.constant(shape[:2], tf.float32)), tf.int32)
    sides = tf.maximum(sides, 1)
    crop = tf.image.stateless_random_crop(
        image, tf.concat([sides, [shape[2]]], axis=0), seed=seeds[1])
    image = to_model_input(crop, shape)
    return tf.image.stateless_random_flip_left_right(image, seed=seeds[1][::-1])


def _read(info: dict[str, Any], spec: str) -> tf.data.Dataset:
    """The examples of `spec`, in TFDS's deterministic read order, from the prepared data."""
    import tensorflow_datasets as tfds

    builder_dir = Path(info["tfds_data_dir"]) / info["full_name"]
    try:
        builder = tfds.builder_from_directory(os.fspath(builder_dir))
        return builder.as_dataset(split=spec, shuffle_files=False)
    except Exception as e:
        raise DatasetError(
            f"Could not read split {spec!r} of {info['full_name']} from "
            f"{info['tfds_data_dir']}: {e}"
        ) from e


def _apply_holdout(ds: tf.data.Dataset, holdout: dict[str, Any], *, keep_test: bool):
    """Keep the held-out examples (test) or all the others (train), by read-order number."""
    mask = tf.constant(holdout_mask(holdout["num_examples"], holdout["test_indices"]))
    return ds.enumerate().filter(
        lambda i, ex: tf.equal(tf.gather(mask, i), keep_test)
    ).map(lambda i, ex: ex)


def _split_spec(info: dict[str, Any], split: str) -> str:
    specs = info.get("split_specs", {})
    if split in specs:
        return specs[split]
    raise ConfigError(f"split must be one of {sorted(specs)}. Received: split={split!r}")
