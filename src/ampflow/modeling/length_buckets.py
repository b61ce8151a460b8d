"""Length buckets: a batch of token ids costs its texts' own length, not the cap (issue 50).

Texts are tokenized to the cap (`max_sequence_length`, 128 by default) with padding (id 0) at
the end, but review snippets hold ~20 words: most of an encoder's work, and more of attention's
(quadratic in the length), went on padding the mask then threw away. Here a batch is cut to the
smallest *bucket* length that holds its longest text. The buckets are a short fixed list (16,
32, 64, … below the cap, then the cap: `bucket_lengths`), so graph tracing and XLA see a bounded
number of shapes. Only trailing padding is cut, which the text models' attention mask and
masked pooling ignore: the outputs equal the cap-padded ones within float rounding.

Training and evaluation group texts of one bucket into a batch (`group_by_length`, after a
seeded shuffle); a served request is cut to its longest text's bucket (`trim_to_bucket`).
Core TensorFlow ops only, in `tf.data` and in a SavedModel signature alike.
"""

from __future__ import annotations

import tensorflow as tf

from ampflow.errors import ConfigError

SMALLEST_BUCKET = 16  # below this the per-step overhead, not the length, sets the cost
PADDING_ID = 0  # the tokenizers' padding id (src/ampflow/modeling/tokenizer.py's PADDING_ID)


def bucket_lengths(cap: int, smallest: int = SMALLEST_BUCKET) -> tuple[int, ...]:
    """The lengths a batch is padded to: powers of two from `smallest` below `cap`, and `cap`.

    E.g. cap 128 → (16, 32, 64, 128): 4 shapes; cap 100 → (16, 32, 64, 100); cap 8 → (8,).
    """
    for name, value in (("cap", cap), ("smallest", smallest)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1. Received: {name}={value!r}")
    lengths, length = [], smallest
    while length < cap:
        lengths.append(length)
        length *= 2
    return (*lengths, cap)


def token_counts(token_ids):
    """int32 `[batch]`: each row's length up to its last token (0 for a row of padding only).

    The last token's position + 1, not a count of tokens: cutting there never drops a token,
    even if a client's ids held a 0 between tokens.
    """
    token_ids = tf.convert_to_tensor(token_ids)
    positions = tf.range(1, tf.shape(token_ids)[-1] + 1, dtype=tf.int32)
    held = tf.cast(tf.not_equal(token_ids, PADDING_ID), tf.int32)
    return tf.reduce_max(held * positions, axis=-1)


def bucket_index(length, buckets: tuple[int, ...]):
    """The index of the smallest bucket >= `length` (the last bucket for anything longer)."""
    edges = tf.constant(buckets, tf.int32)
    found = tf.searchsorted(edges, tf.reshape(tf.cast(length, tf.int32), [1]), side="left")[0]
    return tf.minimum(tf.cast(found, tf.int32), len(buckets) - 1)


def trim_to_bucket(token_ids, buckets: tuple[int, ...]):
    """`token_ids` `[batch, cap]` cut to the bucket of its longest row: `[batch, bucket]`.

    A batch of no rows, or of empty texts only, gets the smallest bucket.
    """
    token_ids = tf.convert_to_tensor(token_ids)
    longest = tf.reduce_max(tf.concat([token_counts(token_ids), [0]], 0))
    width = tf.gather(tf.constant(buckets, tf.int32), bucket_index(longest, buckets))
    return token_ids[:, :width]


def group_by_length(dataset, batch_size: int, buckets: tuple[int, ...], *,
                    drop_remainder: bool):
    """`(ids [cap], label)` examples → batches of one bucket each: `([batch, bucket], label)`.

    Examples keep their order within a bucket (shuffle before); a batch leaves as soon as its
    bucket holds `batch_size` examples, so the buckets interleave as the shuffled texts come.
    At the end of a finite input each bucket's partial batch follows, unless `drop_remainder`
    (training: every step the global batch).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0. Received: batch_size={batch_size!r}")
    edges = tf.constant(buckets, tf.int32)

    def key(ids, _label):
        return tf.cast(bucket_index(token_counts(ids[tf.newaxis])[0], buckets), tf.int64)

    def batched(bucket, window):
        width = tf.gather(edges, bucket)
        return window.batch(batch_size, drop_remainder=drop_remainder).map(
            lambda ids, label: (ids[:, :width], label))

    return dataset.group_by_window(key, batched, window_size=batch_size)
