"""The tf.data input pipeline shared by training, evaluation, export warm-up and TFLite checks.

Images stay RAW (0..255) here: rescaling and resizing live inside the model, so the served
model takes exactly what a client sends and training cannot drift from serving.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from ampflow.components.prepare_data import (  # noqa: F401  (register the builders)
    offline_digits,
    offline_mnist,
)
from ampflow.components.prepare_data.step import load_dataset_info
from ampflow.errors import ConfigError, DatasetError


def load_split(prepared_dir: str | os.PathLike, split: str) -> tf.data.Dataset:
    """Return `(image uint8 [H,W,C], label int64)` examples of `split` ("train" or "test")."""
    import tensorflow_datasets as tfds

    info = load_dataset_info(prepared_dir)
    spec = _split_spec(info, split)
    try:
        builder = tfds.builder(f"{info['name']}:{info['version']}", data_dir=info["tfds_data_dir"])
        ds = builder.as_dataset(split=spec, shuffle_files=False)
    except Exception as e:
        raise DatasetError(
            f"Could not read split {spec!r} of {info['full_name']} from "
            f"{info['tfds_data_dir']}: {e}"
        ) from e
    image_key, label_key = info["image_key"], info["label_key"]
    return ds.map(
        lambda ex: (ex[image_key], tf.cast(ex[label_key], tf.int64)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def load_arrays(
    prepared_dir: str | os.PathLike, split: str, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return a split as numpy arrays: images uint8 [N,H,W,C], labels int64 [N]."""
    ds = load_split(prepared_dir, split)
    if limit is not None:
        ds = ds.take(limit)
    images, labels = [], []
    for image_batch, label_batch in ds.batch(1024).as_numpy_iterator():
        images.append(image_batch)
        labels.append(label_batch)
    if not images:
        raise DatasetError(f"split {split!r} of {prepared_dir} is empty")
    return np.concatenate(images), np.concatenate(labels)


def make_input_pipeline(
    ds: tf.data.Dataset,
    *,
    batch_size: int,
    training: bool,
    seed: int = 0,
    cache: bool = True,
    shuffle_buffer: int = 10_000,
) -> tf.data.Dataset:
    """Parallel map → cache → seeded shuffle → batch → prefetch (AUTOTUNE).

    Training batches drop the remainder so that every step has the same shape (one XLA
    compilation, not two); evaluation keeps every example.
    """
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0. Received: batch_size={batch_size}")
    ds = ds.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def _to_float(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Cast raw pixels to float32 (values stay 0..255: the model rescales)."""
    return tf.cast(image, tf.float32), label


def _split_spec(info: dict[str, Any], split: str) -> str:
    specs = info.get("split_specs", {})
    if split in specs:
        return specs[split]
    raise ConfigError(f"split must be one of {sorted(specs)}. Received: split={split!r}")
