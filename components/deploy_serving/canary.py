"""Prove a server serves a version: GetModelStatus says AVAILABLE, then a Predict answers.

Speaks TF Serving's own gRPC API (tensorflow-serving-api), so it checks `tensorflow_model_server`
in a cluster and `ampflow serve` on a laptop alike. The request is built from the SavedModel's
`serving_default` signature (names, dtypes, shapes), never from hard-coded tensor names.
"""

from __future__ import annotations

import logging
import time

import grpc
import numpy as np

from ampflow.components.deploy_serving.model_store import SIGNATURE, SignatureSpec
from ampflow.errors import DeployError

log = logging.getLogger(__name__)

# Codes a server gives while it starts or loads the version: worth another try.
TRANSIENT = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.FAILED_PRECONDITION,
)
_POLL_S = 0.5
_CALL_DEADLINE_S = 10.0
_PREDICT_ATTEMPTS = 3

# DataType enum (tensorflow/core/framework/types.proto) -> numpy, for the canary's inputs.
_NUMPY = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 9: np.int64, 19: np.float16}


def check_version_served(
    address: str, model_name: str, version: int, spec: SignatureSpec, *, timeout_s: float
) -> int:
    """Wait for `version` of `model_name` to be AVAILABLE at `address`, then canary it.

    Returns the version the Predict response names; raises `DeployError` naming the address,
    the state or code last seen, and the time waited.
    """
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        _wait_available(models, address, model_name, version, timeout_s)
        predictions = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return _canary_predict(predictions, address, model_name, version, spec)


def _wait_available(stub, address: str, model_name: str, version: int, timeout_s: float) -> None:
    """Poll GetModelStatus for the version until AVAILABLE or the deadline passes."""
    from tensorflow_serving.apis import get_model_status_pb2

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = model_name
    request.model_spec.version.value = version
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            response = stub.GetModelStatus(request, timeout=min(_CALL_DEADLINE_S, timeout_s))
            states = {s.version: s for s in response.model_version_status}
            status = states.get(version)
            if status is not None:
                state = get_model_status_pb2.ModelVersionStatus.State.Name(status.state)
                if state == "AVAILABLE":
                    log.info("%s version %d is AVAILABLE at %s", model_name, version, address)
                    return
                last = f"state {state} {status.status.error_message}".strip()
                if state == "END":
                    break  # the server gave up on (or unloaded) the version
            else:
                last = f"versions reported: {sorted(states)}"
        except grpc.RpcError as e:
            if e.code() not in TRANSIENT:
                raise DeployError(
                    f"GetModelStatus({model_name}, version {version}) at {address} failed: "
                    f"{e.code().name}: {e.details()}"
                ) from e
            last = f"{e.code().name}: {e.details()}"
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    raise DeployError(
        f"{model_name} version {version} did not become AVAILABLE at {address} within "
        f"{timeout_s:g}s. Expected: state AVAILABLE. Received: {last}"
    )


def _canary_predict(stub, address: str, model_name: str, version: int, spec: SignatureSpec) -> int:
    """One Predict on the exact version, retried on transient codes (bounded, logged)."""
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = SIGNATURE
    request.model_spec.version.value = version
    for name, (dtype, shape) in spec.inputs.items():
        request.inputs[name].CopyFrom(_zeros_tensor(name, dtype, shape))
    for attempt in range(1, _PREDICT_ATTEMPTS + 1):
        try:
            response = stub.Predict(request, timeout=_CALL_DEADLINE_S)
            break
        except grpc.RpcError as e:
            if e.code() not in TRANSIENT or attempt == _PREDICT_ATTEMPTS:
                raise DeployError(
                    f"canary Predict on {model_name} version {version} at {address} failed: "
                    f"{e.code().name}: {e.details()}"
                ) from e
            log.warning("canary Predict attempt %d/%d: %s", attempt, _PREDICT_ATTEMPTS, e.code())
            time.sleep(_POLL_S * attempt)
    missing = sorted(set(spec.outputs) - set(response.outputs))
    served = response.model_spec.version.value if response.model_spec.HasField("version") else 0
    if missing or served not in (0, version):
        raise DeployError(
            f"canary Predict at {address}: expected outputs {list(spec.outputs)} from version "
            f"{version}. Received: outputs {sorted(response.outputs)} from version {served}"
        )
    return served or version


def _zeros_tensor(name: str, dtype: int, shape: tuple[int, ...]):
    """A batch of one all-zeros example of the signature's dtype and shape (-1 dims -> 1)."""
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2

    if dtype not in _NUMPY:
        raise DeployError(
            f"canary cannot build input {name!r}: expected a numeric dtype "
            f"{sorted(_NUMPY)}. Received: DataType enum {dtype}"
        )
    dims = tuple(1 if d < 0 else d for d in shape)
    array = np.zeros(dims, dtype=_NUMPY[dtype])
    return tensor_pb2.TensorProto(
        dtype=dtype,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims]
        ),
        tensor_content=array.tobytes(),
    )
