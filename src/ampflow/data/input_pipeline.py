"""The tf.data input pipeline shared by training, evaluation, export warm-up and TFLite checks.

Every image leaves `load_split` as model input: float32 at the dataset's `image_shape`, values
still raw 0..255 (rescaling lives inside the model, so training cannot drift from serving).
Augmentation (a seeded random crop resized back, a flip) runs after the cache; the cache holds
the decoded images only when they fit in memory. The measurements behind it:
docs/explanation/design-notes.md, "input_pipeline.py".
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from ampflow.data import (  # noqa: F401  (register the builders)
    offline_digits,
    offline_mnist,
)
from ampflow.data.dataset_info import load_dataset_info
from ampflow.data.holdout import holdout_mask
from ampflow.data.images import RESIZE_METHOD, to_model_input
from ampflow.errors import ConfigError, DatasetError

log = logging.getLogger(__name__)

CROP_MIN_FRACTION = 0.8  # the smallest random crop, per side, of augmentation
# The most of the available memory a split's cached images may take (the rest: the model, the
# optimizer, the other split's cache, tf.data's buffers).
CACHE_MEMORY_FRACTION = 0.5


def load_split(prepared_dir: str | os.PathLike, split: str) -> tf.data.Dataset:
    """Return `(image float32 image_shape, label int64)` examples of `split` ("train"/"test")."""
    info = load_dataset_info(prepared_dir)
    if info.get("modality", "image") != "image":
        raise DatasetError(
            f"{prepared_dir} holds {info['modality']} data, not images: read it with "
            "ampflow.data.load_text_split (text_input.py)")
    ds = read_examples(info, split)
    image_key, label_key = info["image_key"], info["label_key"]
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
    cache: bool | None = None,
    shuffle_buffer: int = 10_000,
    augment: bool = False,
) -> tf.data.Dataset:
    """Parallel map → cache → seeded shuffle → [augment] → batch → prefetch (AUTOTUNE).

    Training batches drop the remainder so that every step has the same shape (one XLA
    compilation, not two); evaluation keeps every example. `augment` (training only: a
    random crop + flip, see the module docstring) is seeded by `seed`, new every epoch.
    `cache` None: cache when the images fit in memory (`cache_fits`); True/False force it.
    """
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0. Received: batch_size={batch_size}")
    if augment and not training:
        raise ConfigError("augment must be False for evaluation (training=False). "
                          "Received: augment=True")
    ds = ds.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE)
    if cache is None:
        cache = cache_fits(ds)
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if augment:
        ds = _augmented(ds, seed)
    ds = ds.batch(batch_size, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def cache_fits(ds: tf.data.Dataset) -> bool:
    """Whether caching `ds` in memory is safe: its estimated size within the memory budget.

    The size is the element count × the bytes of one element, both known for `load_split`'s
    datasets. A dataset of unknown size or element shape is cached, as before this rule (it
    cannot be estimated without reading it all); an infinite one never is.
    """
    count = int(ds.cardinality())
    if count == tf.data.INFINITE_CARDINALITY:
        return False
    element_bytes = _element_bytes(ds.element_spec)
    if count < 0 or element_bytes is None:
        return True
    needed, available = count * element_bytes, available_memory_bytes()
    if available is None or needed <= CACHE_MEMORY_FRACTION * available:
        log.info("caching %d decoded examples in memory (%.0f MiB)", count, needed / 2**20)
        return True
    log.warning("not caching the %d decoded examples (%.0f MiB) in memory: more than %.0f%% of "
                "the %.0f MiB available; every epoch decodes and resizes them again (a smaller "
                "--image-size makes them fit)", count, needed / 2**20,
                100 * CACHE_MEMORY_FRACTION, available / 2**20)
    return False


def available_memory_bytes() -> int | None:
    """Memory this process may still use: MemAvailable, capped by its cgroup's limit (a pod's)."""
    candidates = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit != "max":
            candidates.append(max(int(limit) - int(used), 0))
    except (OSError, ValueError):
        pass
    return min(candidates) if candidates else None


def _element_bytes(spec) -> int | None:
    total = 0
    for component in tf.nest.flatten(spec):
        if not component.shape.is_fully_defined():
            return None
        total += component.shape.num_elements() * component.dtype.size
    return total


def _to_float(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Cast raw pixels to float32 (values stay 0..255: the model rescales)."""
    return tf.cast(image, tf.float32), label


def _augmented(ds: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    """Random crop + flip, each example seeded by a stream that is new every epoch.

    The per-example seeds come from `Dataset.random(seed, rerandomize_each_iteration=True)`
    zipped alongside, and the ops are stateless: the result does not depend on how tf.data
    schedules the parallel map, only on `seed`, the epoch and TensorFlow's global seed
    (`Dataset.random` pairs its seed with it; training sets it from its own seed first).
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
    image = resize_crop_back(crop, shape)
    return tf.image.stateless_random_flip_left_right(image, seed=seeds[1][::-1])


def resize_crop_back(crop: tf.Tensor, shape: tuple[int, int, int]) -> tf.Tensor:
    """A crop (no side larger than `shape`'s) enlarged back to `shape`: bilinear, no antialias.

    Antialiasing only matters when an image shrinks; enlarging, images.py's antialiased resize
    gives the same pixels (within 0.005 of 0..255, float rounding: tested) at several times
    the cost, and this resize ran once per image per epoch: augmentation's largest cost
    (benchmarks/input_pipeline.py).
    """
    resized = tf.image.resize(tf.cast(crop, tf.float32), shape[:2], method=RESIZE_METHOD,
                              antialias=False)
    return tf.ensure_shape(resized, shape)


def read_examples(info: dict[str, Any], split: str) -> tf.data.Dataset:
    """The stored example dicts of `split` ("train"/"test"), images or text.

    Its TFDS spec read in TFDS's deterministic order, the held-out split applied, the count
    asserted.
    """
    ds = _read(info, _split_spec(info, split))
    if info.get("holdout"):
        ds = _apply_holdout(ds, info["holdout"], keep_test=(split == "test"))
    count = info.get("splits", {}).get(split)
    if count:  # known after the holdout filter too: lets the cache rule size the split
        ds = ds.apply(tf.data.experimental.assert_cardinality(int(count)))
    return ds


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
