"""Gradient accumulation under AMP: K micro-batches make one applied step.

TrainLoop calls `accumulate_gradients` when `accumulation_steps` K > 1: each replica runs its
share of the effective batch as K micro-batches in a `tf.while_loop`, adds their gradients into
float32 accumulators, and the sum is all-reduced and applied once, so the loss scale, skips,
iterations, telemetry, the guard and checkpoints count applied steps. Why not Keras 3's
`gradient_accumulation_steps`: docs/explanation/design-notes.md, "accumulation.py".
"""

from __future__ import annotations

from collections.abc import Callable

from ampflow.errors import ConfigError


def check_accumulation_steps(steps: int) -> None:
    """K must be a positive number of micro-batches."""
    if steps < 1:
        raise ConfigError(f"accumulation_steps must be >= 1. Received: accumulation_steps={steps}")


def accumulate_gradients(forward_backward: Callable, variables, images, labels, steps: int):
    """(summed stats, gradients summed in float32) of `steps` micro-batches of the batch.

    `forward_backward(images, labels)` is one micro-batch's (stats, gradients of `variables`);
    a variable the loss does not reach keeps a None gradient, as without accumulation.
    """
    import tensorflow as tf

    micro_images = tf.nest.map_structure(lambda t: split_micro_batches(t, steps), images)
    micro_labels = split_micro_batches(labels, steps)
    no_gradient: set[int] = set()  # found while the loop body is traced

    def body(i, stats, accumulators):
        part = tf.nest.map_structure(lambda t: t[i], micro_images)
        part_stats, grads = forward_backward(part, micro_labels[i])
        added = []
        for index, (total, grad) in enumerate(zip(accumulators, grads, strict=True)):
            if grad is None:
                no_gradient.add(index)
                added.append(total)
            else:  # IndexedSlices (an embedding's) become dense: the accumulator is dense
                added.append(total + tf.cast(tf.convert_to_tensor(grad), tf.float32))
        return i + 1, stats + part_stats, added

    zeros = [tf.zeros(v.shape, tf.float32) for v in variables]
    _, stats, sums = tf.while_loop(
        lambda i, *_: i < steps, body, (tf.constant(0), tf.zeros(3, tf.float32), zeros),
        parallel_iterations=1)
    return stats, [None if i in no_gradient else g for i, g in enumerate(sums)]


def split_micro_batches(tensor, steps: int):
    """[K * b, ...] -> [K, b, ...]: micro-batch i is rows i*b .. (i+1)*b, in order.

    Static shapes are kept where known (XLA and Keras's layers want them). A batch that K does
    not divide is a ConfigError when its size is known here, and TF's reshape error otherwise.
    """
    import tensorflow as tf

    rows, rest = tensor.shape[0], tensor.shape[1:]
    if rows is not None and rows % steps:
        raise ConfigError(f"a batch of {rows} examples cannot be split into "
                          f"accumulation_steps={steps} equal micro-batches")
    micro = rows // steps if rows is not None else -1
    if rest.is_fully_defined():
        return tf.reshape(tensor, [steps, micro, *rest.as_list()])
    return tf.reshape(tensor, tf.concat([[steps, micro], tf.shape(tensor)[1:]], 0))
