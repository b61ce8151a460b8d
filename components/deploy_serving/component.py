"""KFP component: deploy. A thin wrapper over `run_deploy` (local dir or Kubernetes)."""

from kfp.dsl import Artifact, Dataset, Input, Model, Output


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

    `target`: local, kubernetes (TF Serving Deployments) or kserve (an InferenceService on
    the `ampflow` ServingRuntime; its endpoint is the InferenceService's URL, and its new
    revision gets `canary_traffic_percent` of the traffic; `model_store_claim` is the PVC
    mounted at `model_store`, which the InferenceService reads).
    `serving_format="tflite"` (local and kserve targets) publishes the `tflite_variant` of the
    convert step's `tflite` output instead of the SavedModel: only a variant that passed its
    gate, checked with its own answers (deploy_serving/tflite_variant.py).
    `compute_precision="bfloat16"` (local and kserve targets) publishes the SavedModel only once its
    parity gate against float32 on `data`'s test split passed here, on a CPU with bf16
    (deploy_serving/bf16_parity.py); the gate's evidence goes into `endpoint`.
    `target="none"` skips deployment (the task then records nothing to serve).
    `namespace` empty: the namespace this pod runs in (the KFP run's), where the model-store
    PVC it mounts lives; outside a pod, "ampflow".
    """
    import json
    from pathlib import Path

    if target == "none":
        Path(endpoint.path).write_text(json.dumps({"target": "none"}))
        return
    from ampflow.components.deploy_serving.kubernetes_cluster import own_namespace
    from ampflow.components.deploy_serving.step import DeployConfig, run_deploy
    from ampflow.components.export_savedmodel.versions import find_exported_version

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
