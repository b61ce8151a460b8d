"""How each task of the pipeline runs on a cluster: resources, GPUs, retries, mounts, labels.

The pipeline (pipeline.py) wires the tasks; these set what a `PipelineOptions` decides about
one task once it is wired. kfp is imported inside each function, so that importing the
pipeline package (`ampflow --help`) does not load it.
"""

from ampflow.pipeline.options import PipelineOptions, Resources


def setters_without_a_stack_walk() -> None:
    """Make kfp's task setters (set_cpu_request, set_env_variable, ...) cheap: same check.

    Each calls `PipelineTask._ensure_container_spec_exists`, which runs `inspect.stack()` only to
    name the setter in its error. `inspect.stack()` looks up the module of every frame on the
    stack, scanning all of `sys.modules` for each frame that has none (`<string>`, `<frozen
    runpy>`); with TensorFlow imported (5,000 modules) under a deep caller, such as pytest-xdist,
    the ~35 setter calls of one build took seconds, nearly all of a compile. The replacement
    makes the same check and raises the same error, naming the setter from its frame alone.
    """
    import sys

    from kfp.dsl import pipeline_task

    def ensure_container_spec_exists(task) -> None:
        if task.container_spec is None:
            setter = sys._getframe(1).f_code.co_name
            raise ValueError(
                f"{setter} can only be used on single-step components, not pipelines used as "
                "components, or special components like importers.")

    pipeline_task.PipelineTask._ensure_container_spec_exists = ensure_container_spec_exists


def configure_train_task(task, options: PipelineOptions) -> None:
    """GPU request, node placement and retries for a training task."""
    set_resources(task, options.train_resources)
    task.set_retry(num_retries=options.train_retries, backoff_duration="30s",
                   backoff_factor=2.0)
    from kfp import kubernetes

    from ampflow.pipeline.distributed_task import keep_from_autoscaler

    keep_from_autoscaler(task)
    if not options.gpu:
        return

    task.set_accelerator_type(options.accelerator_type)
    task.set_accelerator_limit(options.accelerator_count)
    if options.node_selector:
        kubernetes.add_node_selector(task, *options.node_selector)
    if options.toleration:
        kubernetes.add_toleration(task, **options.toleration)


def mount_model_store(task, options: PipelineOptions) -> None:
    """Mount the model-store claim (if any) where `serving_model_store` points by default."""
    if options.model_store_pvc:
        from kfp import kubernetes

        kubernetes.mount_pvc(task, pvc_name=options.model_store_pvc,
                             mount_path=options.model_store_mount)


def label_serving_client(task) -> None:
    """Label the deploy pod so k8s/'s NetworkPolicy lets its canary requests reach TF Serving."""
    from kfp import kubernetes

    kubernetes.add_pod_label(task, "ampflow.dev/serving-client", "true")


def set_resources(task, resources: Resources) -> None:
    """CPU and memory requests and limits of `task`."""
    task.set_cpu_request(resources.cpu_request).set_cpu_limit(resources.cpu_limit)
    task.set_memory_request(resources.memory_request).set_memory_limit(resources.memory_limit)
