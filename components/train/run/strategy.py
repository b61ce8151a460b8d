"""The tf.distribute runtime a training process runs under: the strategy, this process's place.

train's step and autotune's measuring process both make it here, so neither imports the other;
TrainLoop (loop.py) runs under it, and `distribute_datasets` shards the input for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ampflow.components.train.clusters.tf_config import ClusterSpec

if TYPE_CHECKING:
    from ampflow.components.train.config import TrainConfig

log = logging.getLogger(__name__)


def make_runtime(config: TrainConfig):
    """Pick and create the tf.distribute strategy from `config.strategy` and TF_CONFIG."""
    from ampflow.components.train.clusters.tf_config import (
        choose_strategy,
        make_strategy,
        read_tf_config,
    )

    cluster = read_tf_config()
    local_gpus = 0
    if cluster is None or cluster.num_workers == 1:
        import tensorflow as tf

        local_gpus = len(tf.config.list_physical_devices("GPU"))
    name, reason = choose_strategy(config.strategy, cluster, local_gpus)
    if name != "multi_worker":
        cluster = None
    runtime = Runtime(make_strategy(name, cluster), name, reason, cluster)
    log.info("strategy %s (%s): %d replica(s) in sync over %d worker(s)", name, reason,
             runtime.num_replicas, runtime.num_workers)
    return runtime


@dataclass
class Runtime:
    """The strategy a run uses and this process's place in it."""

    strategy: Any
    name: str
    reason: str
    cluster: ClusterSpec | None = None

    @property
    def num_replicas(self) -> int:
        """Replicas in sync across every worker (one per GPU, or one per CPU process)."""
        return int(self.strategy.num_replicas_in_sync)

    @property
    def num_workers(self) -> int:
        """Processes in the run."""
        return self.cluster.num_workers if self.cluster else 1

    @property
    def is_chief(self) -> bool:
        """Whether this process publishes the model and writes logs."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def worker_id(self) -> int:
        """0 for the chief (and for a single process)."""
        return self.cluster.worker_id if self.cluster else 0

    def agree(self, value: float) -> float:
        """The mean of `value` over the workers: the same number on every worker.

        Decisions that change what a worker runs next (stop, skip a candidate) must be taken on
        agreed numbers, or one worker waits in a collective that the others never join.
        """
        if self.num_workers == 1:
            return float(value)
        import tensorflow as tf

        per_replica = self.strategy.run(lambda: tf.constant(float(value), tf.float64))
        total = self.strategy.reduce("SUM", per_replica, axis=None)
        return float(total) / self.num_replicas

    def describe(self) -> dict[str, Any]:
        """The `distribution` block of the metadata."""
        return {
            "strategy": self.name,
            "reason": self.reason,
            "num_workers": self.num_workers,
            "num_replicas": self.num_replicas,
            "is_chief": self.is_chief,
            "task": ({"type": self.cluster.task_type, "index": self.cluster.task_index}
                     if self.cluster else None),
            "cluster": (list(self.cluster.chief + self.cluster.workers) if self.cluster
                        else None),
        }


def distribute_datasets(runtime: Runtime, train_ds, eval_ds):
    """Distribute the datasets: sharded by DATA, each global batch split into replica shares.

    DATA, not FILE: a small TFDS split may be one file. Worker i gets share i of every global
    batch, so N workers see the same global batches, in the same order, as one process with the
    whole batch.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = runtime.strategy.experimental_distribute_dataset(train_ds.with_options(options))
    evaluation = (runtime.strategy.experimental_distribute_dataset(eval_ds.with_options(options))
                  if eval_ds is not None else None)
    return train, evaluation
