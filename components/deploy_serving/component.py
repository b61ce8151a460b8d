"""KFP component: deploy. A thin wrapper over `run_deploy` (local dir or Kubernetes)."""

from kfp.dsl import Artifact, Dataset, Input, Model, Output

from ampflow.components.deploy_serving.config import DeployConfig
from ampflow.kfp_args import document_args


def deploy_serving(
    saved_model: Input[Model],
    endpoint: Output[Artifact],
    target: str = "local",
    model_store: str = "/models",  # config.MODEL_STORE_MOUNT (the source runs alone in the pod)
    server_address: str = "",
    namespace: str = "",
    overlay: str = "cpu",
    canary_traffic_percent: int = 10,
    model_store_claim: str = "tf-serving-models",
    tflite: Input[Model] = None,
    serving_format: str = "saved_model",
    tflite_variant: str = "full_int8",
    compute_precision: str = "float32",
    data: Input[Dataset] = None,
):
    """Push the exported version to the serving model store; on Kubernetes, roll out + canary.

    `endpoint` records what was deployed (target, version, address; kserve: the
    InferenceService's URL; with compute_precision=bfloat16, its parity gate's evidence). The
    Args KFP shows are DeployConfig's fields' help.
    """
    import json
    from pathlib import Path

    if target == "none":
        Path(endpoint.path).write_text(json.dumps({"target": "none"}))
        return
    from ampflow.artifacts.versions import find_exported_version
    from ampflow.components.deploy_serving.kubernetes_cluster import own_namespace
    from ampflow.components.deploy_serving.step import DeployConfig, run_deploy

    # Every run of the pipeline exports version 1 into its own artifact dir; the step claims the
    # next free number in a store that is a path (two runs deploying at once get two numbers),
    # as `ampflow deploy` does; a gs:// store keeps the exported number.
    result = run_deploy(
        DeployConfig(
            saved_model_dir=find_exported_version(saved_model.path),
            target=target,
            model_store=model_store,
            server_address=server_address or None,
            namespace=namespace or own_namespace("ampflow"),
            overlay=overlay,
            canary_traffic_percent=canary_traffic_percent,
            model_store_claim=model_store_claim,
            serving_format=serving_format,
            tflite_dir=Path(tflite.path) if tflite is not None else None,
            tflite_variant=tflite_variant,
            compute_precision=compute_precision,
            data_dir=Path(data.path) if data is not None else None,
        )
    )
    payload = {
        "target": result.target,
        "model_name": result.model_name,
        "version": result.version,
        "model_path": result.model_path,
        "endpoint": result.endpoint,
        "served_version": result.served_version,
        "serving_format": serving_format,
    }
    if serving_format == "tflite":
        payload["tflite_variant"] = tflite_variant
    if result.bf16_parity is not None:
        payload["compute_precision"] = compute_precision
        payload["bf16_parity"] = result.bf16_parity
    Path(endpoint.path).write_text(json.dumps(payload, indent=2))
    endpoint.metadata.update(payload)


document_args(deploy_serving, DeployConfig, notes={
    "target": 'none: skip deploying (the task records nothing to serve)',
    "server_address": "Empty: unset",
    "namespace": 'Empty: the namespace this pod runs in (the KFP run\'s), where the '
                 'model-store PVC it mounts lives; outside a pod, "ampflow"',
}, own={
    "saved_model": "export-savedmodel's output: the version to publish.",
    "tflite": "convert-tflite's output: where serving_format=tflite takes tflite_variant "
              "from (only a variant that passed its gate, checked with its own answers).",
    "data": "The prepared dataset (prepare-data's output): compute_precision=bfloat16's parity "
            "gate against float32 runs on its test split, on a CPU with bf16.",
})
