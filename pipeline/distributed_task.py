"""The pipeline side of `train_workers`: the train task's arguments and settings when > 1.

pipeline/pipeline.py calls these functions, so that what a multi-worker train task needs (its
TFJob's settings, a stable job key, the training claim, no GPU on the launching pod, no
eviction) stays out of the file that only wires tasks. The claim must exist in the run's
namespace before the run starts (a pod that mounts a missing claim stays Pending): `ampflow submit`
checks it (pipeline/preflight.py).
"""

from __future__ import annotations

from typing import Any

TRAINING_CLAIM = "ampflow-training"  # k8s/training/common/pvc.yaml
TRAINING_MOUNT = "/mnt/ampflow"


def train_workers_arguments(options) -> dict[str, Any]:
    """Extra arguments of the train task for `options.train_workers` (none for 1)."""
    if options.train_workers <= 1:
        return {}
    from kfp import dsl

    from ampflow.components.train.clusters.kubeflow_job import TFJobSettings

    resources = options.train_resources
    settings = TFJobSettings(
        image=options.image, workers=options.train_workers, claim=TRAINING_CLAIM,
        mount=TRAINING_MOUNT, gpu=options.gpu, accelerator_type=options.accelerator_type,
        accelerator_count=options.accelerator_count, node_selector=options.node_selector,
        toleration=options.toleration, cpu_request=resources.cpu_request,
        memory_request=resources.memory_request, cpu_limit=resources.cpu_limit,
        memory_limit=resources.memory_limit)
    # The run id as the whole value: KFP's driver resolves `{{$.pipeline_job_uuid}}` only when
    # it is the whole constant (pipeline/backend_rules.py, resolve.go@2.17.0 L435-450); a key
    # built as "<uuid>/<task>" reached the task as that literal text, one job name for every
    # run. One run has one AMP train task, so its id alone names the job.
    return {"workers": options.train_workers, "tfjob_settings": settings.to_json(),
            "run_key": dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            "packed_allreduce": options.packed_allreduce,
            "allreduce_bytes_per_pack": options.allreduce_bytes_per_pack,
            "allreduce_dtype": options.allreduce_dtype}


def configure_train_workers_task(task, options) -> None:
    """The launching task: small, retried, with the training claim (the TFJob has the GPUs).

    On the local runner (no Kubernetes) the same task starts local worker processes instead;
    kfp.local ignores the Kubernetes settings (the claim), as it does for the other tasks.
    """
    from kfp import kubernetes


    resources = options.default_resources
    task.set_cpu_request(resources.cpu_request).set_cpu_limit(resources.cpu_limit)
    task.set_memory_request(resources.memory_request).set_memory_limit(resources.memory_limit)
    task.set_retry(num_retries=options.train_retries, backoff_duration="30s", backoff_factor=2.0)
    kubernetes.mount_pvc(task, pvc_name=TRAINING_CLAIM, mount_path=TRAINING_MOUNT)
    # a deleted launcher pod is not retried, and it deletes its TFJob on SIGTERM
    keep_from_autoscaler(task)


# The cluster autoscaler does not scale down a node under a pod with this annotation: a
# training pod is not evicted for bin-packing (a deleted pod is not retried, see above).
SAFE_TO_EVICT = ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false")
# k8s/pipeline's PodDisruptionBudget (maxUnavailable 0) selects pods with this label: a node
# drain waits for a training pod to finish instead of evicting (deleting) it.
TRAIN_POD_LABEL = ("ampflow.dev/train-pod", "true")


def keep_from_autoscaler(task) -> None:
    """Keep a long-running task's pod from voluntary eviction: autoscaler and node drains."""
    from kfp import kubernetes

    kubernetes.add_pod_annotation(task, *SAFE_TO_EVICT)
    kubernetes.add_pod_label(task, *TRAIN_POD_LABEL)
