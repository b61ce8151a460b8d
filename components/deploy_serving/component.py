"""KFP component: deploy. A thin wrapper over `run_deploy` (local dir or Kubernetes)."""

from kfp.dsl import Artifact, Input, Model, Output


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
):
    """Push the exported version to the serving model store; on Kubernetes, roll out + canary.

    `target`: local, kubernetes (TF Serving Deployments) or kserve (an InferenceService on
    the `ampflow` ServingRuntime; its endpoint is the InferenceService's URL, and its new
    revision gets `canary_traffic_percent` of the traffic; `model_store_claim` is the PVC
    mounted at `model_store`, which the InferenceService reads).
    `serving_format="tflite"` (local and kserve targets) publishes the `tflite_variant` of the
    convert step's `tflite` output instead of the SavedModel: only a variant that passed its
    gate, checked with its own answers (deploy_serving/tflite_variant.py).
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
    from ampflow.components.deploy_serving.model_store import (
        claim_version,
        is_uri,
        refuse_unsupported_uri,
        release_claim,
    )
    from ampflow.components.deploy_serving.step import DeployConfig, run_deploy
    from ampflow.components.export_savedmodel.versions import find_exported_version

    version_dir = find_exported_version(saved_model.path)
    version = int(version_dir.name)
    refuse_unsupported_uri(model_store)  # s3:// is no local path to claim a number in
    model_base = None
    if not is_uri(model_store):
        # Every run of the pipeline exports version 1 into its own artifact dir; in a store that
        # is a path (local, or the PVC mounted for kubernetes/kserve) the run becomes the next
        # version, which a running server hot-loads (claimed under a lock: two runs deploying
        # at once get two numbers). A gs:// store keeps the exported number.
        model_base = Path(model_store) / version_dir.parent.name
        version = claim_version(model_base, at_least=version)
    try:
        result = run_deploy(
            DeployConfig(
                saved_model_dir=version_dir,
                target=target,
                model_store=model_store,
                version=version,
                server_address=server_address or None,
                namespace=namespace or own_namespace("ampflow"),
                overlay=overlay,
                canary_traffic_percent=canary_traffic_percent,
                model_store_claim=model_store_claim,
                serving_format=serving_format,
                tflite_dir=Path(tflite.path) if tflite is not None else None,
                tflite_variant=tflite_variant,
            )
        )
    except BaseException:  # failed before push_local (which frees it itself): free the number
        if model_base is not None:
            release_claim(model_base, version)
        raise
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
    Path(endpoint.path).write_text(json.dumps(payload, indent=2))
    endpoint.metadata.update(payload)
