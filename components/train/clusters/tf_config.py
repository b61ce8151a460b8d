"""Which tf.distribute strategy a run uses, and the `TF_CONFIG` contract of a multi-worker run.

A worker learns its cluster from `TF_CONFIG`, the JSON that Kubeflow's TFJob sets in every pod
(and that `ampflow train --workers N` sets for local processes, and that a Trainer v2 entrypoint
builds): `{"cluster": {"chief": [...], "worker": ["host:port", ...]}, "task": {"type": "worker",
"index": 0}}`. It is validated here, before TensorFlow reads it, because TF's own errors for a
malformed TF_CONFIG or a port that is taken are a hang or a page of gRPC log.

`auto` follows tf.distribute's own guidance: MultiWorkerMirroredStrategy when TF_CONFIG names
more than one task, MirroredStrategy when one process sees more than one GPU, else the default
(no-op) strategy. Every strategy runs the same training loop (components/train/run/loop.py).

Whether a cluster volume is writable by this pod's user is `ampflow.files.check_volume_writable`.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from ampflow.errors import ConfigError

log = logging.getLogger(__name__)

STRATEGIES = ("auto", "default", "mirrored", "multi_worker")
# The exit code of a worker whose peer died or became unreachable (PeerLostError): TFJob's
# ExitCode restart policy retries codes >= 128 (training-operator pkg/util/train.
# IsRetryableExitCode); 1-127 (a bad flag, a diverged run) fail the job.
PEER_LOST_EXIT_CODE = 138
TF_CONFIG = "TF_CONFIG"
TF_CONFIG_FROM = "AMPFLOW_TF_CONFIG_FROM"
# Task types a MultiWorkerMirroredStrategy cluster may hold (TFJob: Chief and Worker replicas).
_WORKER_TYPES = ("chief", "worker")


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster of a multi-worker run and this process's place in it, from TF_CONFIG."""

    chief: tuple[str, ...]
    workers: tuple[str, ...]
    task_type: str
    task_index: int

    @property
    def num_workers(self) -> int:
        """Processes taking part in training (chief included)."""
        return len(self.chief) + len(self.workers)

    @property
    def worker_id(self) -> int:
        """0..num_workers-1; the chief (or worker 0 without a chief) is 0."""
        return self.task_index if self.task_type == "chief" else len(self.chief) + self.task_index

    @property
    def is_chief(self) -> bool:
        """The one task that publishes the model and writes logs (TF's own rule)."""
        return self.worker_id == 0

    @property
    def address(self) -> str:
        """host:port this task serves collectives on."""
        return (self.chief if self.task_type == "chief" else self.workers)[self.task_index]

    def describe(self) -> str:
        """One line for logs: `worker 1 of 2 (localhost:2223)`."""
        return f"{self.task_type} {self.task_index} of {self.num_workers} ({self.address})"


def read_tf_config(environ: dict[str, str] | None = None) -> ClusterSpec | None:
    """Parse and check `TF_CONFIG`; None when it is unset or empty (a single-process run).

    Without TF_CONFIG, `AMPFLOW_TF_CONFIG_FROM=trainer-v2` (set by k8s/training/trainer-v2's
    runtime) builds it from what a Kubeflow Trainer v2 pod gets, and exports it for TF.
    """
    env = os.environ if environ is None else environ
    raw = env.get(TF_CONFIG, "").strip()
    if not raw and env.get(TF_CONFIG_FROM, "").strip():
        source = env[TF_CONFIG_FROM].strip()
        if source != "trainer-v2":
            raise ConfigError(f"{TF_CONFIG_FROM} must be 'trainer-v2'. Received: {source!r}")
        config = trainer_v2_tf_config(env)
        raw = env[TF_CONFIG] = json.dumps(config)
        log.info("TF_CONFIG built from the Trainer v2 pod: %s", raw)
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"TF_CONFIG must be JSON. Received: {raw[:120]!r} ({e.msg})") from e
    return parse_tf_config(config)


def parse_tf_config(config: Any) -> ClusterSpec:
    """Check the TF_CONFIG dict's structure; every failure names the field and the value."""
    expected = ('{"cluster": {"worker": ["host:port", ...]}, '
                '"task": {"type": "worker", "index": N}}')
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ConfigError(f"TF_CONFIG must be {expected}. Received: {json.dumps(config)[:200]}")
    cluster = config["cluster"]
    unsupported = sorted(set(cluster) - set(_WORKER_TYPES))
    if unsupported:
        raise ConfigError(
            "TF_CONFIG cluster may only hold 'chief' and 'worker' tasks "
            f"(MultiWorkerMirroredStrategy). Received: {unsupported}")
    jobs = {}
    for job in _WORKER_TYPES:
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list) or not all(_is_address(a) for a in addresses):
            raise ConfigError(f"TF_CONFIG cluster.{job} must be a list of 'host:port' strings. "
                              f"Received: {addresses!r}")
        jobs[job] = tuple(addresses)
    if len(jobs["chief"]) > 1:
        raise ConfigError(f"TF_CONFIG cluster.chief must hold at most one task. "
                          f"Received: {list(jobs['chief'])}")
    task = config.get("task")
    if not isinstance(task, dict):
        raise ConfigError(f"TF_CONFIG must name this process's task, as {expected}. "
                          f"Received: task={task!r}")
    task_type, index = task.get("type"), task.get("index")
    if task_type not in _WORKER_TYPES or not jobs[task_type]:
        raise ConfigError(f"TF_CONFIG task.type must be one of the cluster's jobs "
                          f"{[j for j in _WORKER_TYPES if jobs[j]]}. Received: {task_type!r}")
    if not isinstance(index, int) or isinstance(index, bool) or not (
            0 <= index < len(jobs[task_type])):
        raise ConfigError(f"TF_CONFIG task.index must be in [0, {len(jobs[task_type])}) for "
                          f"the {len(jobs[task_type])} {task_type} task(s). Received: {index!r}")
    everyone = jobs["chief"] + jobs["worker"]
    duplicates = sorted({a for a in everyone if everyone.count(a) > 1})
    if duplicates:
        raise ConfigError(f"TF_CONFIG tasks must have distinct addresses. Received: duplicates "
                          f"{duplicates}")
    return ClusterSpec(jobs["chief"], jobs["worker"], task_type, index)


def trainer_v2_tf_config(environ: dict[str, str]) -> dict:
    """TF_CONFIG for a pod of a Kubeflow Trainer v2 TrainJob on k8s/training/trainer-v2's runtime.

    From kubeflow/trainer v2.3.0's source: the JobSet is named after the TrainJob and its
    replicated job `node` (constants.Node) holds the trainer pods, an Indexed Job, so worker i's
    host name is `<trainjob>-node-0-<i>` in the subdomain `<trainjob>` (the JAX plugin's
    coordinator address `<trainjob>-node-0-0.<trainjob>:<port>` has this form). The runtime maps
    the completion index (constants.JobCompletionIndexFieldPath) to AMPFLOW_WORKER_INDEX; the
    PlainML plugin injects no process count, so the TrainJob passes AMPFLOW_NUM_WORKERS.
    """
    def integer(name: str, default: str | None = None) -> int:
        value = environ.get(name, default)
        if value is None or not str(value).strip().isdigit():
            raise ConfigError(f"{name} must be a non-negative integer (set by the Trainer v2 "
                              f"runtime/TrainJob). Received: {name}={value!r}")
        return int(value)

    index, count = integer("AMPFLOW_WORKER_INDEX"), integer("AMPFLOW_NUM_WORKERS")
    port = integer("AMPFLOW_WORKER_PORT", "2222")
    if not 0 <= index < count:
        raise ConfigError(
            f"AMPFLOW_WORKER_INDEX must be < AMPFLOW_NUM_WORKERS: set the TrainJob's "
            f"AMPFLOW_NUM_WORKERS to its numNodes. Received: index {index}, workers {count}")
    hostname = environ.get("HOSTNAME", "")
    suffix = f"-node-0-{index}"
    if not hostname.endswith(suffix) or len(hostname) == len(suffix):
        raise ConfigError(f"HOSTNAME must be '<trainjob>{suffix}' (a Trainer v2 trainer pod). "
                          f"Received: HOSTNAME={hostname!r}")
    trainjob = hostname[:-len(suffix)]
    workers = [f"{trainjob}-node-0-{i}.{trainjob}:{port}" for i in range(count)]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def check_own_port_free(cluster: ClusterSpec) -> None:
    """Fail with one clear line if this task's port is taken (TF would hang or log gRPC noise).

    Only the local side can be checked: the port is bound and released at once, so this is a
    check, not a reservation (another process could still take it in between).
    """
    host, port = cluster.address.rsplit(":", 1)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", int(port)))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} of this task ({cluster.describe()}, from TF_CONFIG) is already in "
                "use: stop what holds it or give this task another port") from e
        raise ConfigError(f"cannot bind port {port} of this task ({cluster.describe()}): "
                          f"{e.strerror}") from e


def choose_strategy(requested: str, cluster: ClusterSpec | None,
                    local_gpus: int) -> tuple[str, str]:
    """Return `(strategy, reason)` for `requested` given TF_CONFIG and the local GPU count."""
    if requested not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}. Received: strategy={requested!r}")
    multi = cluster is not None and cluster.num_workers > 1
    if requested == "multi_worker" and cluster is None:
        raise ConfigError("strategy=multi_worker needs TF_CONFIG (set by a TFJob, a Trainer v2 "
                          "entrypoint or `ampflow train --workers N`). Received: no TF_CONFIG")
    if requested in ("default", "mirrored") and multi:
        raise ConfigError(f"strategy={requested} runs one process, but TF_CONFIG names "
                          f"{cluster.num_workers} tasks: use strategy=multi_worker or auto")
    if requested != "auto":
        return requested, "requested explicitly"
    if multi:
        return "multi_worker", f"TF_CONFIG names {cluster.num_workers} tasks"
    if local_gpus > 1:
        return "mirrored", f"{local_gpus} local GPUs"
    return "default", "one process, at most one GPU"


def make_strategy(name: str, cluster: ClusterSpec | None):
    """Create the tf.distribute strategy `name` (TF reads TF_CONFIG itself for multi_worker)."""
    import tensorflow as tf

    if name == "multi_worker":
        check_own_port_free(cluster)
        log.info("multi-worker: this process is %s", cluster.describe())
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.AUTO)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def _is_address(value: Any) -> bool:
    if not isinstance(value, str) or ":" not in value:
        return False
    host, port = value.rsplit(":", 1)
    return bool(host) and port.isdigit() and 0 < int(port) < 65536
