"""Reading a prepared text dataset: the `(text, label)` examples later steps train and test on.

What a prepared text dataset holds is text.py's contract (and docs/ARTIFACTS.md's); this module
is how to read it, as input_pipeline.py is for images.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from ampflow.data.dataset_info import load_dataset_info
from ampflow.data.input_pipeline import read_examples
from ampflow.data.modality import MODALITY_IMAGE, is_text
from ampflow.errors import ConfigError, DatasetError
from ampflow.modeling.length_buckets import group_by_length


def load_text_split(prepared_dir: str | os.PathLike, split: str):
    """`(text tf.string [], label int64 [])` examples of `split` ("train"/"test"), TFDS order.

    The held-out split of a dataset without a test split is applied (by read-order number, as
    for images). No shuffling, batching or caching: `make_text_pipeline` does that.
    """
    info = load_dataset_info(prepared_dir)
    if not is_text(info):
        raise DatasetError(
            f"{prepared_dir} holds {info.get('modality', MODALITY_IMAGE)} data, not text: read "
            "it with load_split (prepare text with --text-folder, --text-file or a text "
            "dataset)")
    ds = read_examples(info, split)
    text_key, label_key = info["text_key"], info["label_key"]
    return ds.map(lambda ex: (ex[text_key], tf.cast(ex[label_key], tf.int64)),
                  num_parallel_calls=tf.data.AUTOTUNE)


def load_texts(prepared_dir: str | os.PathLike, split: str,
               limit: int | None = None) -> tuple[list[str], Any]:
    """A split as Python: `([text str, ...], labels int64 numpy [N])`.

    E.g. to fit a tokenizer on the training split, or to pick real sentences for warm-up and
    TFLite calibration.
    """
    ds = load_text_split(prepared_dir, split)
    if limit is not None:
        ds = ds.take(limit)
    texts: list[str] = []
    labels = []
    for text_batch, label_batch in ds.batch(4096).as_numpy_iterator():
        texts += [t.decode("utf-8") for t in text_batch]
        labels.append(label_batch)
    return texts, (np.concatenate(labels) if labels else np.zeros(0, np.int64))


def make_text_pipeline(ds, *, batch_size: int, training: bool, seed: int = 0,
                       shuffle_buffer: int = 10_000):
    """Cache → seeded shuffle (training) → batch → prefetch, for `load_text_split`'s examples.

    Training batches drop the remainder (one shape per step, one XLA compilation); evaluation
    keeps every example. Texts are small, so the split is always cached.
    """
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0. Received: batch_size={batch_size}")
    ds = ds.cache()
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)


def make_bucketed_text_pipeline(ds, *, tokenize, batch_size: int, buckets: tuple[int, ...],
                                training: bool, seed: int = 0, shuffle_buffer: int = 10_000):
    """Tokenize → cache → seeded shuffle, repeated (training) → batches of one length bucket.

    `tokenize` maps a batch of strings to ids `[batch, cap]` (0-padded at the end); each batch
    leaves cut to its bucket (ampflow.modeling.length_buckets), so it costs its texts' length.
    Training repeats before grouping, so no epoch drops a partial batch per bucket and every
    step is the global batch; evaluation keeps every example (the buckets' partial batches
    last). The ids are cached, not the strings: tokenized once, not once per epoch.
    """
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0. Received: batch_size={batch_size}")
    ds = ds.batch(1024).map(lambda text, label: (tokenize(text), label),
                            num_parallel_calls=tf.data.AUTOTUNE).unbatch().cache()
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    return group_by_length(ds, batch_size, buckets, drop_remainder=training).prefetch(
        tf.data.AUTOTUNE)
