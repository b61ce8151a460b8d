"""Loss-scale telemetry, and the guard that stops a run whose scale or loss went bad.

Keras 3's dynamic loss scale halves on every overflow with no lower bound, and a skipped step
(non-finite gradients) never shows up as a NaN loss: a run can quietly stop learning. The
callback reads the loss, the scale and the skipped-step count on the steps it records and hands
them to `LossScaleGuard` (guard.py: the rule, and why it decides on evidence rather than on a
rate over a few steps), which raises a `TrainingDivergedError` naming the likely causes.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import keras

from ampflow.components.train.run.guard import GuardLimits, LossScaleGuard
from ampflow.components.train.run.loop import TELEMETRY_KEY, unpack_step_telemetry


class LossScaleTelemetry(keras.callbacks.Callback):
    """Record the loss scale and skipped steps every `every_n` steps; enforce `GuardLimits`.

    The guard looks on the recorded steps and at each epoch's end. Under a distribution
    strategy the scale, the optimizer's iterations and the step loss are the same on every
    worker (components/train/run/loop.py makes the replicas agree), so every worker's guard stops
    at the same step; only the chief is given a `tensorboard_dir`.
    """

    reads_step_telemetry = True  # the custom loop hands it the packed step values per step

    def __init__(self, limits: GuardLimits, every_n: int = 1, tensorboard_dir: Path | None = None):
        super().__init__()
        self.limits = limits
        self.every_n = max(1, every_n)
        self.history: list[dict[str, Any]] = []
        self._epoch = 0
        self._writer = None
        self._tensorboard_dir = tensorboard_dir
        self.guard = LossScaleGuard(limits)
        # The packed values of the latest recorded step, named, with its epoch and step: the
        # progress display shows them (components/train/run/loop.py), so it reads nothing itself.
        self.last_read: dict[str, float] | None = None
        # The applied steps of a transfer run's earlier phases (their optimizers; loop.py sets it)
        self.iterations_offset = 0

    def on_train_begin(self, logs=None):
        import tensorflow as tf

        if self._tensorboard_dir is not None:
            self._writer = tf.summary.create_file_writer(str(self._tensorboard_dir / "loss_scale"))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        # Only the steps that record read anything: reading the loss or the scale from the
        # device forces a host sync, which would stall the step pipeline every step.
        step = self._epoch * int(self.params.get("steps") or 0) + batch + 1
        if step % self.every_n:
            return
        logs = logs or {}
        packed = logs.get(TELEMETRY_KEY)  # the custom loop: one transfer for all three values
        if packed is None:  # Keras fit's logs: read the optimizer
            return self._observe(step, logs.get("loss"), record=True)
        read = unpack_step_telemetry(keras.ops.convert_to_numpy(packed).tolist())
        self.last_read = {**read, "epoch": self._epoch, "step": step}
        if "loss_scale" in read:
            return self._judge(step, read["loss"], read["loss_scale"],
                               step - int(read["iterations"]), record=True)
        return self._judge(step, read["loss"], None, None, record=True)

    def on_epoch_end(self, epoch, logs=None):
        # Once per epoch the guard looks whatever every_n is, so a large N delays it at most
        # one epoch; the epoch's mean loss is non-finite if any step's was.
        step = (epoch + 1) * int(self.params.get("steps") or 0)
        if step and step % self.every_n:
            self._observe(step, (logs or {}).get("loss"), record=False)

    def _observe(self, step: int, loss, record: bool) -> None:
        """Read the scale and iterations from the optimizer (one host sync each), then judge."""
        loss = None if loss is None else float(loss)
        optimizer = self.model.optimizer
        if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return self._judge(step, loss, None, None, record)
        scale = float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
        skipped = step - int(keras.ops.convert_to_numpy(optimizer.iterations)) - \
            self.iterations_offset
        self._judge(step, loss, scale, skipped, record)

    def _judge(self, step: int, loss: float | None, scale: float | None, skipped: int | None,
               record: bool) -> None:
        # Record before judging: a run the guard stops keeps its last step in the history.
        finite = loss is None or math.isfinite(loss)  # the history stays strict JSON
        if scale is not None and finite and (record or scale < self.limits.floor):
            self._record(step, scale, skipped, loss)
        self.guard.observe(step, loss, scale, skipped)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()

    def summary(self) -> dict[str, Any]:
        """The loss-scale block of the model metadata."""
        if not self.history:
            return {"enabled": False}
        scales = [h["loss_scale"] for h in self.history]
        last = self.history[-1]
        return {
            "enabled": True,
            "initial": scales[0],
            "final": scales[-1],
            "min": min(scales),
            "max": max(scales),
            "steps": last["step"],
            "skipped_steps": last["skipped_steps"],
            "skipped_fraction": last["skipped_steps"] / max(1, last["step"]),
            "longest_skipped_run": self.guard.longest_run,
            "guard": self.limits.to_json(),
        }

    def save(self, path: Path) -> None:
        """Write the history as JSON (also after a guarded failure, for the post-mortem)."""
        path.write_text(json.dumps(self.history, indent=1))

    def _record(self, step: int, scale: float, skipped: int, loss) -> None:
        entry = {"step": step, "loss_scale": scale, "skipped_steps": skipped,
                 "loss": None if loss is None else float(loss), "time": time.time()}
        self.history.append(entry)
        if self._writer is not None:
            import tensorflow as tf

            with self._writer.as_default(step=step):
                tf.summary.scalar("loss_scale", scale)
                tf.summary.scalar("skipped_steps", skipped)


class EpochLog(keras.callbacks.Callback):
    """Per-epoch metrics and throughput, in a JSON-lines file that survives a kill.

    The file may live on durable storage (gs://..., via tf.io.gfile), where appending is not
    supported, so the whole (small) file is rewritten after each epoch. Throughput counts the
    training steps only (epoch start to the last batch end): `fit` calls `on_epoch_end` after
    validation, so timing to it would charge evaluation to training. `seconds` stays the whole
    epoch, validation included.
    """

    def __init__(self, path: str | Path, batch_size: int, fresh: bool = True):
        super().__init__()
        self.path = str(path)
        self.batch_size = batch_size
        self._entries = [] if fresh else read_epoch_log(self.path)
        self._start = 0.0
        self._last_batch_end: float | None = None
        self._batches = 0
        self.first_epoch: int | None = None  # > 0 when BackupAndRestore resumed the run
        if fresh:
            write_json_lines(self.path, [])  # a fresh run starts a fresh log

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch
        self._start = time.perf_counter()
        self._last_batch_end = None
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._last_batch_end = time.perf_counter()
        self._batches += 1

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        seconds = end - self._start
        train_seconds = (self._last_batch_end or end) - self._start
        steps = self._batches  # a resumed epoch runs fewer than params["steps"]
        entry = {"epoch": epoch + 1, "seconds": seconds, "train_seconds": train_seconds,
                 "steps": steps,
                 "examples_per_sec": (steps * self.batch_size / train_seconds
                                      if train_seconds > 0 else None)}
        entry.update({k: float(v) for k, v in (logs or {}).items()})
        self._entries.append(entry)
        write_json_lines(self.path, self._entries)


def write_json_lines(path: str | Path, entries: list[dict[str, Any]]) -> None:
    """Write `entries` as JSON lines through a temp file and a rename (tf.io.gfile paths too)."""
    import tensorflow as tf

    path = str(path)
    tmp = path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in entries))
    tf.io.gfile.rename(tmp, path, overwrite=True)


def read_epoch_log(path: str | Path) -> list[dict[str, Any]]:
    """Read the epoch log, keeping the last entry per epoch (a resumed run may repeat one)."""
    import tensorflow as tf

    path = str(path)
    if not tf.io.gfile.exists(path):
        return []
    by_epoch: dict[int, dict[str, Any]] = {}
    with tf.io.gfile.GFile(path) as f:
        for line in f.read().splitlines():
            if line.strip():
                entry = json.loads(line)
                by_epoch[entry["epoch"]] = entry
    return [by_epoch[k] for k in sorted(by_epoch)]
