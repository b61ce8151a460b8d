"""The tf.distribute runtime a training process runs under.

train's step and autotune's measuring process both make it here, so neither imports the other.
"""

from __future__ import annotations

import logging

from ampflow.components.train.config import TrainConfig

log = logging.getLogger(__name__)


def make_runtime(config: TrainConfig):
    """Pick and create the tf.distribute strategy from `config.strategy` and TF_CONFIG."""
    from ampflow.components.train.cluster import choose_strategy, make_strategy, read_tf_config
    from ampflow.components.train.loop import Runtime

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
