"""The one training loop, for every tf.distribute strategy (default, mirrored, multi-worker).

Keras `fit` fails under MultiWorkerMirroredStrategy for every policy and under
MirroredStrategy for mixed_float16 + XLA; a custom step works under all of them, so it is the
only loop (a single process is the default strategy). Callbacks still run through
`keras.callbacks.CallbackList`. Per step nothing is read back to the host; the all-reduce is
allreduce.py's, gradient accumulation accumulation.py's. The distribution details, each
measured: docs/explanation/design-notes.md, "loop.py".
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ampflow.components.train.run import checkpoints
from ampflow.components.train.run.accumulation import (  # noqa: F401 (split: tests import it here)
    accumulate_gradients,
    check_accumulation_steps,
    split_micro_batches,
)
from ampflow.components.train.run.allreduce import (
    agree_on_finite,
    all_reduce_packed,
    calls_per_step,
    count_allreduce,
    describe_allreduce,
    gradients_already_reduced,
    wire_dtype,
)

# input_wait.py's helpers, runtime.py's Runtime and distribute_datasets: re-exported here, where
# tests import them.
from ampflow.components.train.run.input_wait import (  # noqa: F401
    INPUT_BOUND_ADVICE,
    INPUT_BOUND_FRACTION,
    input_wait_fraction,
    is_input_bound,
    log_input_wait,
)
from ampflow.components.train.run.strategy import Runtime, distribute_datasets  # noqa: F401
from ampflow.errors import ConfigError
from ampflow.progress import Progress

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "ckpt"
# The batch-end log entry holding the packed step values (telemetry.py reads it):
# [loss, (loss scale, optimizer iterations: under loss scaling), (the epoch's running sums so
# far: loss, correct, examples, steps)]. `unpack_step_telemetry` names them.
TELEMETRY_KEY = "loss_scale_telemetry"
_SCALE = ("loss_scale", "iterations")
_EPOCH_SUMS = ("epoch_loss_sum", "epoch_correct", "epoch_examples", "epoch_steps")
_LAYOUTS = {1: ("loss",), 3: ("loss", *_SCALE), 5: ("loss", *_EPOCH_SUMS),
            7: ("loss", *_SCALE, *_EPOCH_SUMS)}


def unpack_step_telemetry(values: list[float]) -> dict[str, float]:
    """Name the values of one packed step tensor (the loop's layouts, and the older 1/3)."""
    layout = _LAYOUTS.get(len(values))
    if layout is None:
        raise ValueError(f"a packed step holds 1, 3, 5 or 7 values. Received: {len(values)}")
    return dict(zip(layout, values, strict=True))


@dataclass(frozen=True)
class LoopConfig:
    """What the loop needs beyond the model: sizes, XLA, loss scaling, checkpointing."""

    epochs: int
    steps_per_epoch: int
    global_batch_size: int
    jit_compile: bool
    loss_scaling: bool
    state_dir: str  # durable: holds backup/ (the checkpoints)
    checkpoint_every_n_steps: int | None = None  # None: at the end of each epoch
    max_checkpoints: int = 2
    label_smoothing: float = 0.0  # of the training loss only; evaluation reports the plain one
    progress: bool = True  # the per-step display on the chief (ampflow.progress's settings)
    item: str = "img"  # one example in the display's rate: throughput.py's ("texts" for text)
    # With more than one replica (the module docstring says why and what was measured):
    packed_allreduce: bool = True  # gradients + step stats in one all-reduce per step
    allreduce_bytes_per_pack: int = 0  # CommunicationOptions.bytes_per_pack; 0: one pack
    allreduce_dtype: str = "float32"  # or "compute": the policy's compute dtype on the wire
    # Micro-batches per applied step (the module docstring); global_batch_size is then the
    # effective batch: micro-batch x accumulation_steps x replicas, the loss's denominator.
    accumulation_steps: int = 1
    # A phase of a transfer run (phases.py): the epochs [first_epoch, last_epoch) of `epochs`,
    # and the applied steps of the earlier phases' optimizers (kept in the checkpoint), which
    # the telemetry adds to this optimizer's iterations so that skipped steps count on.
    first_epoch: int = 0
    last_epoch: int | None = None  # None: epochs
    iterations_offset: int | None = None  # None: a run of one phase


@dataclass
class LoopResult:
    """What `TrainLoop.fit` reports."""

    epochs: list[dict[str, Any]] = field(default_factory=list)
    resumed_at_step: int | None = None
    train_seconds: float = 0.0


class TrainLoop:
    """Build the step functions for `model` under `runtime`; `fit` runs epochs with callbacks."""

    def __init__(self, runtime: Runtime, model, config: LoopConfig):
        import tensorflow as tf

        self.runtime = runtime
        self.strategy = runtime.strategy
        self.model = model
        self.optimizer = model.optimizer
        self.config = config
        with self.strategy.scope():
            self.optimizer.build(model.trainable_variables)
            self._step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self._iterations_offset = tf.Variable(config.iterations_offset or 0, dtype=tf.int64,
                                                  trainable=False, name="iterations_offset")
        # Per-epoch sums of (global loss per step, correct, examples, steps), on the device.
        self._sums = tf.Variable(tf.zeros(4, tf.float64), trainable=False, name="epoch_sums")
        # Seconds the steps waited for their batch (summed on the device, read per epoch).
        self._input_wait = tf.Variable(tf.zeros([], tf.float64), trainable=False,
                                       name="input_wait_seconds")
        # Gradient all-reduces run (each replica counts its own; read once, for the metadata):
        # with accumulation, one per applied step, never one per micro-batch.
        self._allreduce_calls = tf.Variable(tf.zeros([], tf.int64), trainable=False,
                                            name="gradient_allreduce_calls")
        check_accumulation_steps(config.accumulation_steps)
        self.steps_run = 0  # train steps (applied steps) this process ran
        self._synced_state = [v for v in model.non_trainable_variables
                              if v.dtype in ("float32", "float16", "bfloat16", "float64")]
        self.jit_scope = self._jit_scope()
        self.packed = bool(config.packed_allreduce and runtime.num_replicas > 1)
        self.allreduce_wire_dtype = wire_dtype(config.allreduce_dtype)
        if runtime.num_replicas > 1 and runtime.is_chief:
            log.info("gradient all-reduce: %s", self.describe_allreduce())
        self._train_step = tf.function(self._distributed_train_step)
        # batches of several shapes (text length buckets, a last partial batch): after the
        # second shape one trace for all, not one per shape
        self._eval_step = tf.function(self._distributed_eval_step, reduce_retracing=True)
        self._sync_step = tf.function(self._distributed_sync)

    # ---- the step -------------------------------------------------------------------------

    def _jit_scope(self) -> str | None:
        if not self.config.jit_compile:
            return None
        return "step" if self.runtime.num_replicas == 1 else "forward_backward"

    def describe_jit_scope(self) -> str | None:
        """Where XLA applies, for the metadata."""
        return {
            None: None,
            "step": "the whole train step (forward, backward and optimizer update)",
            "forward_backward": (
                "forward and backward pass per replica; the all-reduce and the optimizer update "
                "run outside XLA (collectives cannot be XLA-compiled: UnimplementedError "
                "under MultiWorkerMirroredStrategy, measured)"),
        }[self.jit_scope]

    def _forward_backward(self, images, labels):
        """Loss, stats and (scaled) gradients of one replica's share of the global batch."""
        import tensorflow as tf

        model, optimizer = self.model, self.optimizer
        with tf.GradientTape() as tape:
            probabilities = model(images, training=True)
            per_example = _train_loss(labels, probabilities, self.config.label_smoothing)
            loss = tf.nn.compute_average_loss(
                per_example, global_batch_size=self.config.global_batch_size)
            if model.losses:  # once per applied step: a K-th of it per micro-batch
                loss += tf.nn.scale_regularization_loss(
                    tf.add_n(model.losses)) / self.config.accumulation_steps
            scaled = optimizer.scale_loss(loss) if self.config.loss_scaling else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        return _stats(loss, probabilities, labels), grads

    def _gradients(self, images, labels):
        """(stats, gradients) of the applied step: one batch, or K accumulated micro-batches."""
        if self.config.accumulation_steps == 1:
            return self._forward_backward(images, labels)
        return accumulate_gradients(self._forward_backward, self.model.trainable_variables,
                                    images, labels, self.config.accumulation_steps)

    def _count_allreduce(self, reduced):
        count_allreduce(self._allreduce_calls, reduced)

    def _apply(self, grads) -> None:
        if self.config.loss_scaling and self.runtime.num_replicas > 1:
            grads = agree_on_finite(self.optimizer, grads)
        if self.runtime.num_replicas > 1:  # Keras's apply() all-reduces them once
            self._count_allreduce(grads)
        self.optimizer.apply(grads, self.model.trainable_variables)

    def _replica_step(self, images, labels):
        stats, grads = self._gradients(images, labels)
        self._apply(grads)
        return stats


    def _build_replica_fn(self) -> Callable:
        import tensorflow as tf

        if self.jit_scope == "step":
            return tf.function(self._replica_step, jit_compile=True)
        forward_backward = self._gradients
        if self.jit_scope == "forward_backward":
            forward_backward = tf.function(self._gradients, jit_compile=True)
        if not self.packed and forward_backward == self._gradients:
            return self._replica_step

        def replica(images, labels):
            stats, grads = forward_backward(images, labels)
            if not self.packed:
                self._apply(grads)
                return stats
            grads, stats = all_reduce_packed(grads, stats, self.allreduce_wire_dtype,
                                             self.config.allreduce_bytes_per_pack)
            self._count_allreduce(grads)
            self.optimizer.apply(grads, self.model.trainable_variables)
            return stats

        return replica

    def allreduce_calls_per_step(self) -> float | None:
        """Gradient all-reduces per train step this process ran (allreduce.calls_per_step)."""
        return calls_per_step(int(self._allreduce_calls.numpy()), self.steps_run,
                              self.runtime.num_replicas, self.runtime.num_workers)

    def describe_allreduce(self) -> dict[str, Any] | None:
        """How gradients are all-reduced, for the metadata (None with one replica)."""
        if self.runtime.num_replicas == 1:
            return None
        return describe_allreduce(self.packed, self.config.loss_scaling,
                                  self.allreduce_wire_dtype, self.config.allreduce_bytes_per_pack)


    def _distributed_train_step(self, iterator):
        import tensorflow as tf

        if not hasattr(self, "_replica_fn"):
            self._replica_fn = self._build_replica_fn()
        images, labels = self._timed_next(iterator)
        if self.packed:
            with gradients_already_reduced(self.optimizer):  # while tracing: see the top
                per_replica = self.strategy.run(self._replica_fn, args=(images, labels))
            # Every replica holds the same all-reduced sums: this worker's first copy.
            stats = self.strategy.experimental_local_results(per_replica)[0]
        else:
            per_replica = self.strategy.run(self._replica_fn, args=(images, labels))
            stats = self.strategy.reduce("SUM", per_replica, axis=None)
        sums = self._sums.assign_add(tf.concat([tf.cast(stats, tf.float64), [1.0]], 0))
        # [loss, loss scale, optimizer iterations, the epoch's sums] in one tensor: telemetry
        # reads it (one host transfer) only on the steps it records, and the progress display
        # shows what telemetry read; nothing here waits for the device.
        if not self.config.loss_scaling:
            return tf.concat([tf.cast(stats[:1], tf.float64), sums], 0)
        iterations = self.optimizer.iterations + self._iterations_offset
        return tf.concat([tf.stack([tf.cast(stats[0], tf.float64),
                                    tf.cast(self.optimizer.dynamic_scale, tf.float64),
                                    tf.cast(iterations, tf.float64)]), sums], 0)

    def _timed_next(self, iterator):
        """`next(iterator)` in the graph, its wait added to the input-wait counter."""
        import tensorflow as tf

        began = tf.timestamp()
        with tf.control_dependencies([began]):
            batch = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
            self._input_wait.assign_add(tf.timestamp() - began)
        return batch

    @property
    def input_wait_seconds(self) -> float:
        """Seconds the train steps waited for batches so far (one host read)."""
        return float(self._input_wait.numpy())

    def _distributed_eval_step(self, batch):
        images, labels = batch

        def replica(images, labels):
            import keras
            import tensorflow as tf

            probabilities = self.model(images, training=False)
            loss_sum = tf.reduce_sum(
                keras.losses.sparse_categorical_crossentropy(labels, probabilities))
            return _stats(loss_sum, probabilities, labels)

        per_replica = self.strategy.run(replica, args=(images, labels))
        return self.strategy.reduce("SUM", per_replica, axis=None)

    def _distributed_sync(self):
        import tensorflow as tf

        def replica():
            context = tf.distribute.get_replica_context()
            # tf.identity: a plain read has no device under MultiWorkerMirroredStrategy and its
            # all-reduce fails ("destinations can not be empty", measured); a copy has one.
            return context.all_reduce(
                "MEAN", [tf.identity(_tf_variable(v)) for v in self._synced_state])

        means = self.strategy.run(replica)
        for variable, mean in zip(self._synced_state, means, strict=True):
            self.strategy.extended.update(
                _tf_variable(variable), lambda v, m: v.assign(m), args=(mean,), group=False)

    def sync_replica_state(self) -> None:
        """Average BatchNormalization's moving statistics (and any float state) over replicas."""
        if self.runtime.num_replicas > 1 and self._synced_state:
            self._sync_step()

    def run_steps(self, iterator, count: int) -> None:
        """Run `count` train steps and wait for them (autotune's timing unit)."""
        for _ in range(count):
            self._train_step(iterator)
            self.steps_run += 1
        self._sums.numpy()

    # ---- evaluation -----------------------------------------------------------------------

    def evaluate_with(self, earlier: TrainLoop) -> None:
        """Evaluate with an earlier phase's eval step (phases.py), traced already.

        Inference mode reads neither `trainable` nor the optimizer: one trace less a --weights run.
        """
        self._eval_step = earlier._eval_step

    def evaluate(self, dataset, desc: str = "evaluate") -> dict[str, float]:
        """Global loss and accuracy over a (distributed) dataset."""
        import numpy as np

        totals = np.zeros(3)
        with Progress(None, desc, unit="batch", transient=True,
                      enabled=self.runtime.is_chief and self.config.progress) as progress:
            for batch in dataset:
                totals += self._eval_step(batch).numpy()
                progress.update()
        loss_sum, correct, count = totals
        return {"loss": loss_sum / max(count, 1), "accuracy": correct / max(count, 1),
                "examples": count}

    # ---- checkpoints ----------------------------------------------------------------------

    def _checkpointing(self):
        import tensorflow as tf

        offset = ({} if self.config.iterations_offset is None
                  else {"iterations_offset": self._iterations_offset})
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                         step=self._step_var, **offset)
        backup = backup_dir(self.config.state_dir)
        if self.runtime.is_chief:
            write_dir, self._private_dir = backup, None
        else:  # TF's rule: every worker saves, only the chief's copy is kept
            self._private_dir = tempfile.mkdtemp(prefix=f"ampflow-worker{self.runtime.worker_id}-")
            write_dir = self._private_dir
        manager = tf.train.CheckpointManager(checkpoint, write_dir,
                                             max_to_keep=self.config.max_checkpoints,
                                             checkpoint_name=CHECKPOINT_PREFIX)
        return checkpoint, manager, backup

    def _restore(self, checkpoint, backup: str) -> int:
        """Restore the chief's latest checkpoint on every worker; the agreed step to resume at."""
        latest = checkpoints.restore(checkpoint, backup)  # past unreadable ones, saying so
        if latest:
            log.info("restored %s (step %d)", latest, int(self._step_var.numpy()))
        step = int(self._step_var.numpy())
        total = self.runtime.agree(step) * self.runtime.num_workers
        squares = self.runtime.agree(step * step) * self.runtime.num_workers
        if not math.isclose(self.runtime.num_workers * squares, total * total):
            raise ConfigError(
                f"the workers restored different steps (this one: {step}, from "
                f"{latest or 'no checkpoint'} in {backup}): the checkpoint dir must be storage "
                "that every worker reads (a ReadWriteMany PVC, gs://, s3://)")
        return step

    # ---- the loop -------------------------------------------------------------------------

    def fit(self, train_dataset, eval_dataset, callbacks: list, feed=None, begin: bool = True,
            end: bool = True) -> LoopResult:
        """Train `epochs` × `steps_per_epoch` steps from the last checkpoint; evaluate per epoch.

        A phase (phases.py) trains its epochs only, reading on from the earlier phase's `feed`
        (checkpoints.BatchFeed); `begin`/`end`: whether the callbacks' run begins/ends here.
        """
        import keras

        cfg = self.config
        checkpoint, manager, backup = self._checkpointing()
        start = self._restore(checkpoint, backup)
        result = LoopResult(resumed_at_step=start or None)
        start = max(start, cfg.first_epoch * cfg.steps_per_epoch)
        last_epoch = cfg.epochs if cfg.last_epoch is None else cfg.last_epoch
        total_steps = last_epoch * cfg.steps_per_epoch
        callback_list = keras.callbacks.CallbackList(
            callbacks, model=self.model, epochs=cfg.epochs, steps=cfg.steps_per_epoch, verbose=0)
        for callback in callbacks:  # skipped steps count on from the earlier phases
            if getattr(callback, "reads_step_telemetry", False):
                callback.iterations_offset = int(self._iterations_offset.numpy())
        self.feed = feed or checkpoints.BatchFeed(iter(train_dataset))
        self.feed.skip_to(start)  # exact resume
        iterator, step = self.feed.iterator, start
        began = time.perf_counter()
        if begin:  # each callback's own: a phase's list may end a run another list began
            for callback in callback_list.callbacks:
                callback.on_train_begin()
        try:
            for epoch in range(start // cfg.steps_per_epoch, last_epoch):
                step = self._run_epoch(epoch, step, iterator, eval_dataset, callback_list, manager,
                                       start_epoch=start // cfg.steps_per_epoch)
                self.feed.position = step
                result.epochs.append(epoch)
            if end:
                for callback in callback_list.callbacks:
                    callback.on_train_end()
        except BaseException:
            self._cleanup_private_dir()
            raise
        result.train_seconds = time.perf_counter() - began
        if step != total_steps:  # a programming error, not a user one
            raise RuntimeError(f"trained {step} steps, planned {total_steps}")
        self._cleanup_private_dir()
        return result

    def _run_epoch(self, epoch, step, iterator, eval_dataset, callback_list, manager,
                   start_epoch: int = 0) -> int:
        import tensorflow as tf

        cfg = self.config
        self._sums.assign(tf.zeros(4, tf.float64))
        waited_before = self.input_wait_seconds
        callback_list.on_epoch_begin(epoch)
        began = time.perf_counter()
        first = step - epoch * cfg.steps_per_epoch
        sums = None
        # Batch hooks are called directly, not through CallbackList, which converts every
        # batch log to a Python float (keras/src/callbacks/callback_list.py, pythonify_logs):
        # a host sync per step. The packed telemetry goes only to who reads it, when it does.
        callbacks = callback_list.callbacks
        progress, shown = self._progress(epoch, first, callbacks)
        for batch in range(first, cfg.steps_per_epoch):
            for callback in callbacks:
                callback.on_train_batch_begin(batch)
            packed = self._train_step(iterator)
            step += 1
            self.steps_run += 1
            if batch == first and epoch == start_epoch:  # the run's first step: see the top
                waited_before, began = self.input_wait_seconds, time.perf_counter()
            if batch + 1 == cfg.steps_per_epoch:
                sums = self._sums.numpy()  # the epoch's one host sync, before its clock stops
                train_seconds = time.perf_counter() - began
            for callback in callbacks:
                callback.on_train_batch_end(batch, {TELEMETRY_KEY: packed} if getattr(
                    callback, "reads_step_telemetry", False) else None)
            progress.update(values=shown)  # a host counter; values only when a display is due
            every = cfg.checkpoint_every_n_steps
            if every and step % every == 0 and batch + 1 < cfg.steps_per_epoch:
                self._save(manager, step)
        if sums is None:
            sums, train_seconds = self._sums.numpy(), time.perf_counter() - began
        loss_total, correct, count, steps = sums
        logs = {"loss": loss_total / max(steps, 1), "accuracy": correct / max(count, 1),
                "input_wait_fraction": input_wait_fraction(
                    self.input_wait_seconds - waited_before, train_seconds)}
        progress.close(values={**shown(), **logs})
        self.sync_replica_state()
        if eval_dataset is not None:
            logs.update({f"val_{k}": v for k, v in self.evaluate(
                eval_dataset, f"epoch {epoch + 1}/{cfg.epochs} validation").items()})
        # The epoch's callbacks before its checkpoint: the guard judges the epoch first (a
        # non-finite epoch raises and is never saved to resume from), and the epoch log holds
        # the epoch before a kill could land after the save (a rerun epoch replaces its entry).
        callback_list.on_epoch_end(epoch, logs)
        self._save(manager, step)
        if self.runtime.is_chief:
            log.info("epoch %d/%d: %s", epoch + 1, cfg.epochs,
                     " ".join(f"{k} {v:.4f}" for k, v in logs.items()))
            log_input_wait(epoch, cfg.epochs, logs["input_wait_fraction"], train_seconds)
        return step

    def _progress(self, epoch: int, first: int, callbacks: list) -> tuple[Progress, Callable]:
        """The epoch's display, and what it shows: what the telemetry callback last read.

        No value is read from the device for the display: the telemetry callback reads the
        packed step tensor on the steps it records (every step by default, every N with
        --telemetry-every-n-steps), and the display shows the latest of those reads.
        """
        cfg = self.config
        progress = Progress(
            cfg.steps_per_epoch, f"epoch {epoch + 1}/{cfg.epochs}", unit="step",
            items_per_unit=cfg.global_batch_size, item=cfg.item, initial=first,
            remaining_after=(cfg.epochs - epoch - 1) * cfg.steps_per_epoch,
            enabled=self.runtime.is_chief and cfg.progress)
        reader = next((c for c in callbacks if getattr(c, "reads_step_telemetry", False)), None)

        def shown() -> dict[str, float]:
            read = getattr(reader, "last_read", None)
            if not read or read.get("epoch") != epoch:
                return {}
            return progress_values(read)

        return progress, shown

    def applied_steps(self) -> int:
        """The optimizer steps applied in this run so far, the earlier phases' included."""
        return int(self.optimizer.iterations.numpy()) + int(self._iterations_offset.numpy())

    def weights_fingerprint(self) -> tuple[str, bool]:
        """(sha256 of every model weight, whether every worker holds the same weights).

        Every worker computes it after training; a mismatch would mean the replicas drifted
        apart (the bug class this loop guards against), so it is checked, not assumed.
        """
        import hashlib

        digest = hashlib.sha256()
        for weight in self.model.get_weights():
            digest.update(weight.tobytes())
        hexdigest = digest.hexdigest()
        own = float(int(hexdigest[:12], 16))  # 48 bits: exact in float64
        identical = self.runtime.agree(own) == own
        if not identical:
            log.error("worker %d ended with weights %s, unlike the others", self.runtime.worker_id,
                      hexdigest[:16])
        log.info("final weights sha256 %s (worker %d; same on every worker: %s)", hexdigest,
                 self.runtime.worker_id, identical)
        return hexdigest, identical

    def _save(self, manager, step: int) -> None:
        self.sync_replica_state()
        self._step_var.assign(step)
        checkpoints.save(manager, step)  # a full disk: one clear line, the last one kept

    def _cleanup_private_dir(self) -> None:
        if getattr(self, "_private_dir", None):
            shutil.rmtree(self._private_dir, ignore_errors=True)


def backup_dir(state_dir: str) -> str:
    """Where the resumable checkpoints live under the durable state dir."""
    return state_dir.rstrip("/") + "/backup"


def progress_values(read: dict[str, float]) -> dict[str, float]:
    """The display's values from one telemetry read.

    The epoch's running loss and accuracy (the step's loss where a read has no sums), and the
    loss scale under loss scaling.
    """
    values: dict[str, float] = {}
    if read.get("epoch_steps"):
        values["loss"] = read["epoch_loss_sum"] / read["epoch_steps"]
        values["accuracy"] = read["epoch_correct"] / max(read["epoch_examples"], 1)
    elif "loss" in read:
        values["loss"] = read["loss"]
    if "loss_scale" in read:
        values["scale"] = read["loss_scale"]
    return values


def _stats(loss_sum, probabilities, labels):
    """[loss, correct, count] of one replica's batch, summed later across replicas."""
    import tensorflow as tf

    labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
    predicted = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
    correct = tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.float32))
    count = tf.cast(tf.size(labels), tf.float32)
    return tf.stack([tf.cast(loss_sum, tf.float32), correct, count])


def _train_loss(labels, probabilities, label_smoothing: float):
    """Per-example cross-entropy; with label smoothing, against smoothed one-hot targets."""
    import keras
    import tensorflow as tf

    if not label_smoothing:
        return keras.losses.sparse_categorical_crossentropy(labels, probabilities)
    one_hot = tf.one_hot(labels, tf.shape(probabilities)[-1], dtype=probabilities.dtype)
    return keras.losses.categorical_crossentropy(one_hot, probabilities,
                                                 label_smoothing=label_smoothing)


def _tf_variable(variable):
    """The tf.Variable behind a Keras variable (distributed or not)."""
    return getattr(variable, "value", variable)
