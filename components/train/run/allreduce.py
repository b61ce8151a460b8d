"""The gradients' all-reduce across replicas: one packed collective per step.

Each replica all-reduces its gradients and the step's statistics in one packed collective,
and LossScaleOptimizer takes its finite-or-skip verdict on the reduced gradients, the same on
every replica, with no extra collective. `--no-packed-allreduce` keeps the former path (the
replicas agree on the verdict first); `allreduce_dtype="compute"` sums in the compute dtype.
The measurements: docs/explanation/design-notes.md, "allreduce.py".
"""

from __future__ import annotations

import contextlib
from typing import Any

from ampflow.cliutil import invalid_choice
from ampflow.errors import ConfigError


def all_reduce_packed(grads, stats, reduce_dtype: str | None, bytes_per_pack: int):
    """(summed gradients, summed stats) of every replica: one collective per wire dtype.

    `reduce_dtype` is `wire_dtype()`'s answer (None: the gradients' own); `bytes_per_pack` is
    CommunicationOptions.bytes_per_pack (0: one pack).

    The statistics ride in the gradients' pack (float32); with `allreduce_dtype="compute"`
    the gradients travel in the compute dtype and the statistics in a second, tiny pack of
    their own (a sum of losses in bfloat16 would keep 3 significant digits).
    """
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack)
    present = [i for i, g in enumerate(grads) if g is not None]
    dense = [tf.convert_to_tensor(grads[i]) for i in present]  # IndexedSlices: dense
    wire = reduce_dtype or dense[0].dtype
    on_wire = [tf.cast(g, wire) for g in dense]
    if wire == stats.dtype:
        *summed, stats = context.all_reduce("SUM", on_wire + [stats], options=options)
    else:
        summed = context.all_reduce("SUM", on_wire, options=options)
        stats = context.all_reduce("SUM", stats, options=options)
    reduced = list(grads)
    for i, g in zip(present, summed, strict=True):
        reduced[i] = tf.cast(g, dense[present.index(i)].dtype)
    return reduced, stats


def count_allreduce(counter, reduced) -> None:
    """Add 1 to `counter` once `reduced` (an all-reduce's result) exists: counted as it ran."""
    import tensorflow as tf

    done = [t for t in tf.nest.flatten(reduced) if t is not None]
    with tf.control_dependencies(done[:1]):
        counter.assign_add(1)


def calls_per_step(count: int, steps: int, num_replicas: int, num_workers: int) -> float | None:
    """Gradient all-reduces per train step from a process's counter (None: one replica).

    The counter is the process's own, added to by each of its local replicas. Under gradient
    accumulation it reads 1: the sum of the K micro-batches is reduced once, not each one.
    """
    if num_replicas == 1 or not steps:
        return None
    return count / (steps * (num_replicas // num_workers))


def describe_allreduce(packed: bool, loss_scaling: bool, reduce_dtype: str | None,
                       bytes_per_pack: int) -> dict[str, Any]:
    """How gradients are all-reduced with several replicas, for the metadata."""
    if not packed:
        return {"packed": False, "collectives_per_step": 3 if loss_scaling else 2,
                "dtype": "float32", "how": "Keras's optimizer all-reduce, then the step's "
                "statistics (and the loss-scale verdict) in collectives of their own"}
    wire = reduce_dtype or "float32"
    how = ("gradients and the step's statistics in one packed all-reduce" if wire == "float32"
           else f"gradients in one packed all-reduce in {wire}, the step's statistics in a "
                "float32 one")
    return {"packed": True, "collectives_per_step": 1 if wire == "float32" else 2,
            "dtype": wire, "bytes_per_pack": bytes_per_pack,
            "how": how + "; the loss-scale verdict taken on the reduced gradients"}


def agree_on_finite(optimizer, grads):
    """Make LossScaleOptimizer's skip decision the same on every replica.

    Keras checks the *local* gradients for inf/NaN before its all-reduce; a non-finite gradient
    on one replica only would make that replica skip while the others wait in the all-reduce.
    One scalar all-reduce finds out whether any replica saw one; if so, every replica gets a NaN
    in its first gradient, so every replica's own check says "skip", as one process would.
    """
    import tensorflow as tf

    local_bad = 1.0 - tf.cast(optimizer.check_finite(grads), tf.float32)
    any_bad = tf.distribute.get_replica_context().all_reduce("SUM", local_bad) > 0
    first = next(i for i, g in enumerate(grads) if g is not None)
    poison = tf.where(any_bad, tf.constant(float("nan"), grads[first].dtype),
                      tf.zeros([], grads[first].dtype))
    grads = list(grads)
    grads[first] = grads[first] + poison
    return grads


ALLREDUCE_DTYPES = ("float32", "compute")


def wire_dtype(allreduce_dtype: str) -> str | None:
    """The dtype gradients are all-reduced in: None (their own, float32) or the compute dtype."""
    if allreduce_dtype not in ALLREDUCE_DTYPES:
        raise ConfigError(invalid_choice("allreduce_dtype", allreduce_dtype, ALLREDUCE_DTYPES))
    if allreduce_dtype == "float32":
        return None
    import keras

    compute = keras.mixed_precision.global_policy().compute_dtype
    return None if compute == "float32" else compute


@contextlib.contextmanager
def gradients_already_reduced(optimizer):
    """Make Keras's TF optimizer apply gradients as given, without its own all-reduce.

    keras/src/backend/tensorflow/optimizer.py sums the gradients over the replicas in
    `_backend_update_step` (`_all_reduce_sum_gradients`), with no argument to skip it. The
    packed step has summed them already, so for as long as the step is traced (it is built
    once, inside this block) that method is the identity on the instance, then removed again.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not callable(getattr(inner, "_all_reduce_sum_gradients", None)):
        raise RuntimeError(
            f"{type(inner).__name__} has no _all_reduce_sum_gradients (a Keras version other "
            "than 3.x's TF optimizer): train with --no-packed-allreduce")
    inner._all_reduce_sum_gradients = _as_given
    try:
        yield
    finally:
        del inner._all_reduce_sum_gradients


def _as_given(grads_and_vars):
    return list(grads_and_vars)
