"""Prove a server serves a version: GetModelStatus says AVAILABLE, then it answers correctly.

Speaks TF Serving's own gRPC API through ampflow's TensorFlow-free client's protos and tensor
conversion (`ampflow_client`, clients/python), so it checks `tensorflow_model_server` in a
cluster and `ampflow serve` on a laptop alike. The correctness check sends the real test
examples that export recorded with the version (ampflow.artifacts.canary_examples) to that
exact version and compares the answers with the recorded ones: the same classes (except where
the recorded top two probabilities are closer than the tolerance allows to tell apart) and
probabilities within `atol`. A server that loaded another version or a damaged copy fails it.

What is sent is decided in one place, `request_tensor`, from data, never from a modality
test: the examples' own values under their `input_key` (float32 images under `images`, UTF-8
sentences under `text`, a text TFLite variant's token ids under `input_ids`), in the dtype the
called signature declares for that input (`SignatureSpec`, whose `name` is the signature).
"""

from __future__ import annotations

import logging
import time

import grpc
import numpy as np

from ampflow.artifacts.canary_examples import CanaryExamples
from ampflow.components.deploy_serving.model_store import SignatureSpec
from ampflow.errors import DeployError
from ampflow.serving.model_format import CLASS_IDS_OUTPUT, PROBABILITIES_OUTPUT

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


def recorded_examples(version_dir) -> CanaryExamples:
    """The version's recorded expected answers; DeployError (nothing changed yet) if absent."""
    from ampflow.artifacts.canary_examples import load_canary_examples
    from ampflow.errors import ModelLoadError

    try:
        return load_canary_examples(version_dir)
    except ModelLoadError as e:
        raise DeployError(f"cannot check what the server answers: {e}. Nothing was "
                          "changed.") from e


def check_version_served(
    address: str,
    model_name: str,
    version: int,
    spec: SignatureSpec,
    examples: CanaryExamples,
    *,
    timeout_s: float,
    atol: float,
) -> int:
    """Wait for `version` of `model_name` to be AVAILABLE at `address`, then check its answers.

    Returns the version the Predict response names; raises `DeployError` naming the address,
    the state or code last seen (or the wrong answers), and the time waited.
    """
    from ampflow_client._proto.tensorflow_serving.apis import (
        model_service_pb2_grpc,
        prediction_service_pb2_grpc,
    )

    tensor = request_tensor(spec, examples)  # before any call: a mismatch is one line
    with grpc.insecure_channel(address) as channel:
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        _wait_available(models, address, model_name, version, timeout_s)
        predictions = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        outputs, served = _predict(predictions, address, model_name, version,
                                   spec.name, {examples.input_key: tensor})
    compare_answers(outputs, examples, atol, f"{model_name} version {version} at {address}")
    log.info("%s version %d at %s answered all %d recorded examples as expected", model_name,
             version, address, len(examples.images))
    return served


def request_tensor(spec: SignatureSpec, examples: CanaryExamples):
    """The recorded requests as the TensorProto the signature takes under their input key.

    The one place a modality becomes a request: the dtype is the one `spec` declares for
    `examples.input_key` (DT_FLOAT pixels, DT_STRING sentences, DT_INT32 token ids).
    """
    from ampflow_client.tensors import make_tensor_proto, numpy_dtype

    if examples.input_key not in spec.inputs:
        raise DeployError(f"the signature {spec.name!r} must take {examples.input_key!r} (the "
                          f"recorded examples' input). Received inputs: {sorted(spec.inputs)}")
    dtype, _shape = spec.inputs[examples.input_key]
    try:
        return make_tensor_proto(examples.images, dtype=numpy_dtype(dtype))
    except (TypeError, ValueError) as e:
        raise DeployError(f"the recorded examples ({examples.images.dtype} "
                          f"{list(examples.images.shape)}) cannot be sent as the signature "
                          f"{spec.name!r}'s input {examples.input_key!r}: {e}") from e


def compare_answers(outputs: dict[str, np.ndarray], examples: CanaryExamples, atol: float,
                    where: str) -> None:
    """Raise DeployError unless `outputs` match the recorded answers (see the module doc)."""
    probabilities = outputs.get(PROBABILITIES_OUTPUT)
    class_ids = outputs.get(CLASS_IDS_OUTPUT)
    if probabilities is None or class_ids is None:
        raise DeployError(f"{where} must answer {PROBABILITIES_OUTPUT!r} and "
                          f"{CLASS_IDS_OUTPUT!r}. Received: {sorted(outputs)}")
    expected = examples.probabilities
    if probabilities.shape != expected.shape or class_ids.shape != examples.class_ids.shape:
        raise DeployError(f"{where} answered shapes {probabilities.shape}/{class_ids.shape}; "
                          f"expected {expected.shape}/{examples.class_ids.shape}")
    diff = float(np.max(np.abs(probabilities.astype(np.float64) - expected)))
    top2 = np.sort(expected, axis=1)[:, -2:]
    decidable = (top2[:, 1] - top2[:, 0]) > 2 * atol
    wrong = int(np.sum((class_ids != examples.class_ids) & decidable))
    if wrong or not diff <= atol:
        raise DeployError(
            f"{where} does not give the recorded answers on {len(expected)} real examples: "
            f"{wrong} with another class, max |probability - recorded| = {diff:.3g} "
            f"(allowed {atol:g}); the server is not serving this version's model")


def _wait_available(stub, address: str, model_name: str, version: int, timeout_s: float) -> None:
    """Poll GetModelStatus for the version until AVAILABLE or the deadline passes."""
    from ampflow_client._proto.tensorflow_serving.apis import get_model_status_pb2

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


def _predict(stub, address: str, model_name: str, version: int, signature: str,
             inputs: dict):
    """One Predict of `inputs` (TensorProtos) on the exact version, retried on transient codes."""
    from ampflow_client._proto.tensorflow_serving.apis import predict_pb2
    from ampflow_client.tensors import make_ndarray

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature
    request.model_spec.version.value = version
    for key, tensor in inputs.items():
        request.inputs[key].CopyFrom(tensor)
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
    served = response.model_spec.version.value if response.model_spec.HasField("version") else 0
    if served not in (0, version):
        raise DeployError(f"canary Predict at {address}: expected an answer from version "
                          f"{version}. Received: one from version {served}")
    outputs = {key: make_ndarray(proto) for key, proto in response.outputs.items()}
    return outputs, served or version
