"""Length buckets: batches cut to the bucket of their longest text, never cutting a token.

The functions run in core TensorFlow (tf.data, a signature); the models' side (outputs equal
to cap padding) is in tests/components/train/test_text_buckets.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from ampflow.errors import ConfigError
from ampflow.modeling.length_buckets import (
    bucket_lengths,
    group_by_length,
    token_counts,
    trim_to_bucket,
)

CAP = 128
BUCKETS = bucket_lengths(CAP)


def _ids(lengths, cap=CAP, seed=0):
    """One row per length: token ids 2.. at the front, 0-padded to `cap`."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), cap), np.int32)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(2, 50, size=length)
    return ids


@pytest.mark.parametrize(("cap", "expected"), [
    (128, (16, 32, 64, 128)), (100, (16, 32, 64, 100)), (16, (16,)), (8, (8,)),
    (17, (16, 17)), (4096, (16, 32, 64, 128, 256, 512, 1024, 2048, 4096))])
def test_the_buckets_are_powers_of_two_below_the_cap_then_the_cap(cap, expected):
    assert bucket_lengths(cap) == expected


@pytest.mark.parametrize("cap", [0, -3, 2.5, True, "128"])
def test_a_bad_cap_is_one_line(cap):
    with pytest.raises(ConfigError, match=r"cap must be an integer >= 1\. Received: cap="):
        bucket_lengths(cap)


def test_token_counts_are_up_to_the_last_token_even_past_a_zero_inside():
    ids = _ids([5, 0, 128, 20])
    ids[3, 7] = 0  # a client's 0 between tokens: the row still ends at 20
    np.testing.assert_array_equal(token_counts(ids).numpy(), [5, 0, 128, 20])


@pytest.mark.parametrize(("lengths", "width"), [
    ([3, 20, 9], 32), ([16, 1], 16), ([17], 32), ([33, 2], 64), ([65], 128), ([128, 1], 128),
    ([0, 0], 16)])
def test_a_batch_is_cut_to_the_smallest_bucket_holding_its_longest_text(lengths, width):
    ids = _ids(lengths)
    trimmed = trim_to_bucket(ids, BUCKETS).numpy()
    assert trimmed.shape == (len(lengths), width)
    np.testing.assert_array_equal(trimmed, ids[:, :width])
    assert not ids[:, width:].any()  # only padding was cut


def test_an_empty_batch_gets_the_smallest_bucket():
    assert trim_to_bucket(np.zeros((0, CAP), np.int32), BUCKETS).shape == (0, 16)


def test_trimming_runs_in_a_traced_function_of_any_batch():
    traced = tf.function(lambda ids: trim_to_bucket(ids, BUCKETS),
                         input_signature=[tf.TensorSpec([None, CAP], tf.int32)])
    assert traced(_ids([40, 3])).shape == (2, 64)
    assert traced(_ids([3])).shape == (1, 16)


def _grouped(lengths, batch_size, drop_remainder):
    ids = _ids(lengths)
    labels = np.arange(len(lengths), dtype=np.int64)  # the example's number
    ds = tf.data.Dataset.from_tensor_slices((ids, labels))
    return ids, list(group_by_length(ds, batch_size, BUCKETS,
                                     drop_remainder=drop_remainder).as_numpy_iterator())


def test_grouped_batches_are_one_bucket_each_and_keep_every_example():
    lengths = np.random.default_rng(1).integers(0, CAP + 1, size=301)
    ids, batches = _grouped(lengths, 8, drop_remainder=False)
    seen = np.concatenate([labels for _, labels in batches])
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for batch_ids, labels in batches:
        width = batch_ids.shape[1]
        assert width in BUCKETS
        counts = token_counts(ids[labels]).numpy()
        assert (counts <= width).all()  # no token cut
        smaller = max([b for b in BUCKETS if b < width], default=0)
        assert (counts > smaller).all() or width == BUCKETS[0]  # all of this bucket
        np.testing.assert_array_equal(batch_ids, ids[labels][:, :width])
    assert {b.shape[1] for b, _ in batches} == set(BUCKETS)


def test_training_groups_drop_the_partial_batches_so_every_batch_is_full():
    lengths = np.random.default_rng(2).integers(0, CAP + 1, size=101)
    _, batches = _grouped(lengths, 8, drop_remainder=True)
    assert batches and all(len(labels) == 8 for _, labels in batches)


def test_a_bad_batch_size_is_one_line():
    ds = tf.data.Dataset.from_tensor_slices((_ids([3]), np.zeros(1, np.int64)))
    with pytest.raises(ConfigError, match=r"batch_size must be > 0\. Received: batch_size=0"):
        group_by_length(ds, 0, BUCKETS, drop_remainder=True)
