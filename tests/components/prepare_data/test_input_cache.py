"""The input pipeline caches decoded images only when they fit in memory (issue 22, part 4).

Before, `make_input_pipeline` cached every split in memory: a folder of photos larger than the
machine's memory filled it until the run was killed. Whether a pipeline cached is observed by
counting how often its source is read (a py_function counter), not by timing.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from ampflow.data import input_pipeline
from ampflow.data.input_pipeline import (
    cache_fits,
    load_split,
    make_input_pipeline,
)

COUNT = 12
SHAPE = (8, 8, 3)


def _counted_source(reads: list[int]) -> tf.data.Dataset:
    """COUNT images of SHAPE whose every read is counted in `reads`."""
    def count(i):
        reads.append(int(i))
        return np.full(SHAPE, int(i) % 256, np.uint8)

    def example(i):
        image = tf.ensure_shape(tf.py_function(count, [i], tf.uint8), SHAPE)
        return image, tf.cast(i % 2, tf.int64)

    return tf.data.Dataset.range(COUNT).map(example).apply(
        tf.data.experimental.assert_cardinality(COUNT))


def _two_epochs(ds: tf.data.Dataset) -> None:
    for _ in range(2):
        for _ in ds:
            pass


def test_images_that_fit_are_read_once(monkeypatch):
    monkeypatch.setattr(input_pipeline, "available_memory_bytes", lambda: 2**30)
    reads: list[int] = []
    _two_epochs(make_input_pipeline(_counted_source(reads), batch_size=4, training=False))
    assert len(reads) == COUNT


def test_images_larger_than_the_memory_budget_are_not_cached(monkeypatch, caplog):
    element = int(np.prod(SHAPE)) * 4 + 8  # float32 image + int64 label
    monkeypatch.setattr(input_pipeline, "available_memory_bytes", lambda: COUNT * element)
    reads: list[int] = []
    _two_epochs(make_input_pipeline(_counted_source(reads), batch_size=4, training=False))
    assert len(reads) == 2 * COUNT
    assert any("not caching the 12 decoded examples" in r.getMessage() for r in caplog.records)


def test_cache_true_and_false_are_obeyed(monkeypatch):
    monkeypatch.setattr(input_pipeline, "available_memory_bytes", lambda: 1)
    reads: list[int] = []
    _two_epochs(make_input_pipeline(_counted_source(reads), batch_size=4, training=False,
                                    cache=True))
    assert len(reads) == COUNT
    monkeypatch.setattr(input_pipeline, "available_memory_bytes", lambda: 2**40)
    reads.clear()
    _two_epochs(make_input_pipeline(_counted_source(reads), batch_size=4, training=False,
                                    cache=False))
    assert len(reads) == 2 * COUNT


@pytest.mark.parametrize(("ds", "expected"), [
    (tf.data.Dataset.range(3).repeat(), False),  # infinite: a cache would never end
    (tf.data.Dataset.range(3).filter(lambda x: x > 0), True),  # unknown size: as before
])
def test_datasets_of_unknown_or_infinite_size(ds, expected):
    assert cache_fits(ds) is expected


def test_load_split_knows_its_size_so_the_rule_can_apply(prepared_digits):
    import json

    info = json.loads((prepared_digits / "dataset_info.json").read_text())
    for split in ("train", "test"):
        assert int(load_split(prepared_digits, split).cardinality()) == info["splits"][split]
