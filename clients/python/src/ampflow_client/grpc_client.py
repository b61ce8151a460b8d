"""TF Serving's gRPC API (real TF Serving or `ampflow serve`) without TensorFlow.

One channel; every call has a deadline; only UNAVAILABLE (a server starting or reloading, a
dropped connection) is retried, `retries` times with exponential backoff, `attempt i/N` in the
log. TLS with a CA, mutual TLS with a client certificate and key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
import numpy as np

from ampflow_client._common import (
    DEFAULT_SIGNATURE,
    STATE_NAMES,
    ClassifyResult,
    PredictResult,
    RegressResult,
    SignatureLookups,
    TensorSpec,
    check_version,
    examples_of,
)
from ampflow_client._proto.grpc_health.v1 import health_pb2, health_pb2_grpc
from ampflow_client._proto.tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from ampflow_client.errors import ConfigError, ServingError, code_of_number
from ampflow_client.tensors import as_array, make_ndarray, make_tensor_proto

log = logging.getLogger(__name__)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
HEALTH_STATES = {v: k for k, v in health_pb2.HealthCheckResponse.ServingStatus.items()}


class Client(SignatureLookups):
    """TF Serving gRPC client over one channel; a context manager, or call `close()`."""

    def __init__(self, address: str, *, timeout_s: float = 10.0, retries: int = 3,
                 backoff_s: float = 0.2, tls_ca: str | Path | None = None,
                 tls_cert: str | Path | None = None, tls_key: str | Path | None = None,
                 tls_server_name: str | None = None,
                 max_message_bytes: int = 64 * 1024 * 1024) -> None:
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0. Received: timeout_s={timeout_s}")
        if retries < 0:
            raise ConfigError(f"retries must be >= 0. Received: retries={retries}")
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("tls_cert and tls_key must be given together. Received: "
                              f"tls_cert={tls_cert}, tls_key={tls_key}")
        self.address = address
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls_ca is None and tls_cert is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca), private_key=_read(tls_key),
                certificate_chain=_read(tls_cert))
            self._channel = grpc.secure_channel(address, creds, options=options)
        self._prediction = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._model = model_service_pb2_grpc.ModelServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._specs: dict[tuple, dict[str, TensorSpec]] = {}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    # ---- transport ------------------------------------------------------------------------

    def _call(self, method: str, fn, request, timeout_s: float | None = None):
        """One RPC with a deadline; UNAVAILABLE is retried `retries` times with backoff."""
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return fn(request, timeout=timeout_s or self.timeout_s)
            except grpc.RpcError as e:
                code = e.code()
                if code not in RETRYABLE or attempt == attempts:
                    raise ServingError(method, code, e.details() or "") from e
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning("%s to %s: %s, attempt %d/%d, retrying in %.2fs", method,
                            self.address, code.name, attempt, attempts, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- ModelService and health ------------------------------------------------------------

    def status(self, model: str, version: int | None = None, *,
               version_label: str | None = None) -> list[dict]:
        """GetModelStatus as dicts: version, state (name), error_code (name), error_message."""
        request = get_model_status_pb2.GetModelStatusRequest()
        _set_spec(request.model_spec, model, version, version_label)
        response = self._call("GetModelStatus", self._model.GetModelStatus, request)
        return [{"version": s.version, "state": STATE_NAMES.get(s.state, str(s.state)),
                 "error_code": code_of_number(s.status.error_code).name,
                 "error_message": s.status.error_message}
                for s in response.model_version_status]

    def wait_until_available(self, model: str, timeout_s: float = 60.0,
                             version: int | None = None) -> int:
        """Poll GetModelStatus until a version is AVAILABLE; returns the highest such one."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            request = get_model_status_pb2.GetModelStatusRequest()
            _set_spec(request.model_spec, model, version)
            try:
                response = self._model.GetModelStatus(
                    request, timeout=max(0.1, min(self.timeout_s, deadline - time.monotonic())))
                ready = [s.version for s in response.model_version_status if s.state == 30]
                if ready:
                    return max(ready)
                last = str([(s.version, STATE_NAMES.get(s.state))
                            for s in response.model_version_status])
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
            time.sleep(0.1)
        raise ServingError("GetModelStatus", grpc.StatusCode.DEADLINE_EXCEEDED,
                           f"model {model!r} at {self.address} was not AVAILABLE within "
                           f"{timeout_s:g}s. Last status: {last}")

    def health(self, service: str = "") -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", ... ("" = the whole server)."""
        response = self._call("Health.Check", self._health.Check,
                              health_pb2.HealthCheckRequest(service=service))
        return HEALTH_STATES.get(response.status, str(response.status))

    def reload_config(self, config_text: str) -> None:
        """HandleReloadConfigRequest with a ModelServerConfig in text format."""
        from google.protobuf import text_format

        request = model_management_pb2.ReloadConfigRequest()
        text_format.Parse(config_text, request.config)
        response = self._call("HandleReloadConfigRequest",
                              self._model.HandleReloadConfigRequest, request)
        if response.status.error_code:
            raise ServingError("HandleReloadConfigRequest",
                               code_of_number(response.status.error_code),
                               response.status.error_message)

    # ---- PredictionService ------------------------------------------------------------------

    def metadata(self, model: str, version: int | None = None) -> dict:
        """GetModelMetadata: signature name -> SignatureDef (decoded from its Any)."""
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        _set_spec(request.model_spec, model, version)
        request.metadata_field.append("signature_def")
        response = self._call("GetModelMetadata", self._prediction.GetModelMetadata, request)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        if not response.metadata["signature_def"].Unpack(sig_map):
            raise ServingError("GetModelMetadata", grpc.StatusCode.INTERNAL,
                               "metadata['signature_def'] is not a SignatureDefMap. Received: "
                               f"{response.metadata['signature_def'].type_url}")
        return dict(sig_map.signature_def)

    def input_specs(self, model: str, version: int | None = None,
                    signature: str = DEFAULT_SIGNATURE) -> dict[str, TensorSpec]:
        """Input key -> dtype/shape of a signature, from metadata (cached per version)."""
        key = (model, version, signature)
        if key not in self._specs:
            self._specs[key] = super().input_specs(model, version, signature)
        return self._specs[key]

    def predict(self, model: str, inputs, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, *, version_label: str | None = None,
                output_filter: Sequence[str] = (), timeout_s: float | None = None
                ) -> PredictResult:
        """Predict. `inputs`: a dict key -> array, or one array for a single-input signature.

        A single array is cast to the input's dtype from metadata; a string input takes a list
        of `bytes` (encoded images for `image_bytes`).
        """
        request = predict_pb2.PredictRequest()
        _set_spec(request.model_spec, model, version, version_label)
        request.model_spec.signature_name = signature
        if not isinstance(inputs, Mapping):
            inputs = self._single_input(model, version, signature, inputs)
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(make_tensor_proto(value))
        request.output_filter.extend(output_filter)
        response = self._call("Predict", self._prediction.Predict, request, timeout_s)
        outputs = {k: make_ndarray(v) for k, v in response.outputs.items()}
        return PredictResult(outputs, response.model_spec.version.value, signature)

    def _single_input(self, model, version, signature, value) -> dict[str, np.ndarray]:
        specs = self.input_specs(model, version, signature)
        if len(specs) != 1:
            raise ConfigError(f"signature {signature!r} has inputs {sorted(specs)}: pass a dict "
                              "of arrays keyed by input name")
        (spec,) = specs.values()
        return {spec.name: cast_to(spec, as_array(value), signature)}

    def classify(self, model: str, examples, version: int | None = None,
                 signature: str = DEFAULT_SIGNATURE, *, version_label: str | None = None,
                 context=None, timeout_s: float | None = None) -> ClassifyResult:
        """Classify tf.Examples (dicts of features, serialized bytes or Example protos)."""
        request = classification_pb2.ClassificationRequest()
        _fill_input(request, model, version, version_label, signature, examples, context)
        response = self._call("Classify", self._prediction.Classify, request, timeout_s)
        classes = [[(c.label, c.score) for c in row.classes]
                   for row in response.result.classifications]
        return ClassifyResult(classes, response.model_spec.version.value)

    def regress(self, model: str, examples, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, *, version_label: str | None = None,
                context=None, timeout_s: float | None = None) -> RegressResult:
        """Regress tf.Examples (dicts of features, serialized bytes or Example protos)."""
        request = regression_pb2.RegressionRequest()
        _fill_input(request, model, version, version_label, signature, examples, context)
        response = self._call("Regress", self._prediction.Regress, request, timeout_s)
        return RegressResult([r.value for r in response.result.regressions],
                             response.model_spec.version.value)


def cast_to(spec: TensorSpec, array: np.ndarray, signature: str) -> np.ndarray:
    """`array` in the input's dtype (numbers to numbers only), with a clear refusal."""
    if spec.dtype is None or array.dtype == spec.dtype:
        return array
    if spec.dtype.kind == "O" and array.dtype.kind in "OSU":
        return array
    if spec.dtype.kind not in "biuf" or array.dtype.kind not in "biuf":
        raise ConfigError(
            f"signature {signature!r} input {spec.name!r} takes {spec.dtype.name}. Received: "
            f"an array of {array.dtype.name} (a string input takes a list of bytes; a "
            "classify signature takes tf.Examples: use classify())")
    return array.astype(spec.dtype)


def _fill_input(request, model, version, label, signature, examples, context) -> None:
    _set_spec(request.model_spec, model, version, label)
    request.model_spec.signature_name = signature
    items = examples_of(examples)
    if context is None:
        request.input.example_list.examples.extend(items)
    else:
        (ctx,) = examples_of([context])
        request.input.example_list_with_context.examples.extend(items)
        request.input.example_list_with_context.context.CopyFrom(ctx)


def _set_spec(spec, model: str, version: int | None, label: str | None = None) -> None:
    check_version(version, label)
    spec.name = model
    if version is not None:
        spec.version.value = int(version)
    elif label:
        spec.version_label = label


def _read(path: str | Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"TLS file must be readable. Received: {path} ({e.strerror})") from e
