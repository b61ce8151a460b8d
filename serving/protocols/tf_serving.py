"""TF Serving's API (PredictionService, ModelService) over the core, for gRPC and REST alike.

Plain methods that take and return the real `tensorflow_serving.apis` protos and raise
`ServingStatusError` with TF Serving's codes; the gRPC servicers (tf_serving_grpc.py), the REST
API (tf_serving_rest.py) and the warm-up replay all call them. Predict is an adapter: the
request's TensorProtos become declared inputs (`ProtoInput`, decoded only after the core's
checks), the core's arrays become the response's TensorProtos. Classify, metadata, status and
config reloads are TF Serving's alone and live here whole.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import grpc
import numpy as np
from google.protobuf import any_pb2
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    predict_pb2,
    regression_pb2,
)

from ampflow.errors import ConfigError
from ampflow.serving.config import model_configs_from_proto
from ampflow.serving.core.inference import (
    CallRecord,
    Declared,
    InferenceCore,
    InferRequest,
)
from ampflow.serving.model_format import CLASSIFY_METHOD, read_warmup_records
from ampflow.serving.models.servable import Servable
from ampflow.serving.protocols import classification, regression, tensors
from ampflow.serving.status import ServingStatusError, clip

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ProtoInput:
    """A request TensorProto as a declared input: its shape checked, decoded on `build`."""

    name: str
    proto: tensor_pb2.TensorProto
    _shape: tuple[int, ...] = ()

    def declare(self, expected_dtype: int) -> Declared:  # noqa: ARG002 - the protocol's
        """The proto's dtype, declared shape (validity checked), decoded bytes, longest string."""
        self._shape = tensors.declared_shape(self.name, self.proto)
        return Declared(self.proto.dtype, self._shape,
                        tensors.decoded_bytes(self.proto, self._shape),
                        tensors.longest_string(self.proto))

    def build(self) -> np.ndarray:
        """The array: a view of `tensor_content`, or the typed values decoded."""
        return tensors.decode_checked(self.name, self.proto, self._shape)


def spec_of(request) -> tuple[str, int | None, str | None]:
    """(name, version, label) of a request's ModelSpec; Missing ModelSpec is INVALID_ARGUMENT."""
    if not request.HasField("model_spec"):
        raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    spec = request.model_spec
    choice = spec.WhichOneof("version_choice")
    return (spec.name, spec.version.value if choice == "version" else None,
            spec.version_label if choice == "version_label" else None)


def record_spec(record: CallRecord, spec) -> None:
    """Name a ModelSpec's model and version in the call's metric record (None: names none)."""
    if spec is None:  # HandleReloadConfigRequest names no model
        return
    choice = spec.WhichOneof("version_choice")
    record.names(spec.name, spec.version.value if choice == "version" else None,
                 spec.version_label if choice == "version_label" else None)


def request_spec(request):
    """The ModelSpec a request names (MultiInference: its first task's; None: none)."""
    tasks = getattr(request, "tasks", None)
    if tasks is not None:
        return tasks[0].model_spec if tasks else None
    return getattr(request, "model_spec", None)


def answered_version(response) -> str:
    """The version in a response's ModelSpec (MultiInference: its first result's; or "")."""
    results = getattr(response, "results", None)
    if results is not None:
        spec = results[0].model_spec if results else None
    else:
        spec = getattr(response, "model_spec", None)
    return str(spec.version.value) if spec is not None and spec.HasField("version") else ""


class TFServingProtocol:
    """TF Serving's calls over an `InferenceCore`."""

    def __init__(self, core: InferenceCore) -> None:
        self.core = core
        self._started_base_paths = core.configured_base_paths()

    def resolve(self, request) -> Servable:
        """The servable a request's ModelSpec names."""
        return self.core.resolve(*spec_of(request))

    # ---- Predict ------------------------------------------------------------------------

    def predict(self, request: predict_pb2.PredictRequest, timeout_s: float | None = None,
                servable: Servable | None = None) -> predict_pb2.PredictResponse:
        """Predict by signature name, honouring `output_filter`."""
        model, version, label = spec_of(request) if servable is None else ("", None, None)
        answer = self.core.infer(InferRequest(
            model, version, label, request.model_spec.signature_name,
            [ProtoInput(name, proto) for name, proto in request.inputs.items()],
            list(request.output_filter), servable), timeout_s)
        response = predict_pb2.PredictResponse()
        fill_spec(response.model_spec, answer.servable, answer.signature)
        for alias, array in answer.outputs.items():
            tensors.to_proto(array, out=response.outputs[alias])
        return response

    # ---- Classify -----------------------------------------------------------------------

    def classify(self, request: classification_pb2.ClassificationRequest,
                 timeout_s: float | None = None, servable: Servable | None = None
                 ) -> classification_pb2.ClassificationResponse:
        """Classify tf.Examples through a `tensorflow/serving/classify` signature."""
        servable = servable or self.resolve(request)
        sig_name, sig = regression.signature_def(servable, request.model_spec.signature_name)
        input_key = classification.classify_input_key(
            sig, sig_name, {name: servable.signature_defs[name]
                            for name in servable.signature_defs if servable.can_run(name)},
            check_method=self.core.method_name_check)
        batch = self._examples(request.input)
        outputs = self.core.run(servable, sig_name, {input_key: batch}, timeout_s)
        response = classification_pb2.ClassificationResponse()
        fill_spec(response.model_spec, servable, sig_name)
        classification.fill_classifications(response.result, outputs, len(batch))
        return response

    def _examples(self, input_proto) -> np.ndarray:
        """A request Input's examples (context merged in) as a string batch, within limits."""
        limits = self.core.limits
        examples = classification.serialized_examples(
            input_proto, limits.max_rows, limits.max_bytes, limits.max_string_bytes,
            limits.max_strings)
        batch = np.empty(len(examples), dtype=object)
        batch[:] = examples
        return batch

    # ---- Regress and MultiInference -----------------------------------------------------

    def regress(self, request: regression_pb2.RegressionRequest,
                timeout_s: float | None = None, servable: Servable | None = None
                ) -> regression_pb2.RegressionResponse:
        """Regress tf.Examples through a signature of `inputs` -> `outputs` (regression.py)."""
        servable = servable or self.resolve(request)
        sig_name, sig = regression.signature_def(servable, request.model_spec.signature_name)
        input_key = regression.regress_input_key(sig, self.core.method_name_check)
        batch = self._examples(request.input)
        outputs = self.core.run(servable, sig_name, {input_key: batch}, timeout_s)
        response = regression_pb2.RegressionResponse()
        fill_spec(response.model_spec, servable, sig_name)
        regression.fill_regressions(response.result, outputs, len(batch))
        return response

    def multi_inference(self, request: inference_pb2.MultiInferenceRequest,
                        timeout_s: float | None = None) -> inference_pb2.MultiInferenceResponse:
        """Classify and Regress tasks of one model on the same examples, one result each."""
        plan = regression.multi_inference_tasks(request.tasks)
        servable = self.core.resolve(*spec_of(request.tasks[0]) if plan else ("", None, None))
        checked = []
        for method, name in plan:
            _, sig = regression.signature_def(
                servable, name, "Requested signature not found in model graph: ")
            checked.append((method, name, regression.task_input_key(
                method, sig, name, self.core.method_name_check)))
        batch = self._examples(request.input)
        response = inference_pb2.MultiInferenceResponse()
        for method, name, input_key in checked:
            outputs = self.core.run(servable, name, {input_key: batch}, timeout_s)
            result = response.results.add()
            fill_spec(result.model_spec, servable, name)
            if method == CLASSIFY_METHOD:
                classification.fill_classifications(result.classification_result, outputs,
                                                    len(batch))
            else:
                regression.fill_regressions(result.regression_result, outputs, len(batch))
        return response

    # ---- metadata and status ------------------------------------------------------------

    def metadata(self, request: get_model_metadata_pb2.GetModelMetadataRequest
                 ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        """GetModelMetadata: only `signature_def` is supported, as in TF Serving."""
        if not request.HasField("model_spec"):
            raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        if not request.metadata_field:
            raise ServingStatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "GetModelMetadataRequest must specify at least one metadata_field",
            )
        for field in request.metadata_field:
            if field != "signature_def":
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Metadata field {clip(field)} is not supported. Expected: "
                    "signature_def",
                )
        servable = self.resolve(request)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        fill_spec(response.model_spec, servable, "")
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        for name, sig in servable.metadata_signature_defs.items():
            sig_map.signature_def[name].CopyFrom(sig)
        packed = any_pb2.Any()
        packed.Pack(sig_map)
        response.metadata["signature_def"].CopyFrom(packed)
        return response

    def status(self, request: get_model_status_pb2.GetModelStatusRequest
               ) -> get_model_status_pb2.GetModelStatusResponse:
        """GetModelStatus: every known version (or the one asked) with state and error."""
        if not request.HasField("model_spec"):
            raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        spec = request.model_spec
        version = spec.version.value if spec.HasField("version") else None
        if spec.WhichOneof("version_choice") == "version_label":
            version = self.core.resolve(spec.name, None, spec.version_label).version
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, status in self.core.version_states(spec.name, version):
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = int(status.state)
            entry.status.error_code = status.error_code.value[0]
            entry.status.error_message = status.error
        return response

    def reload_config(self, request: model_management_pb2.ReloadConfigRequest
                      ) -> model_management_pb2.ReloadConfigResponse:
        """HandleReloadConfigRequest: swap models and version labels without a restart.

        Refused (PERMISSION_DENIED) unless the operator allowed it, and for any base path
        outside the allowed roots; a reload that fails fails the RPC with its code, as in
        TF Serving (the response's `status` is not where a stock client looks).
        """
        if not self.core.reload_policy.allowed:
            raise ServingStatusError(
                grpc.StatusCode.PERMISSION_DENIED,
                "HandleReloadConfigRequest is disabled on this server (the operator enables it "
                "with --allow-reload-config)",
            )
        try:
            models = model_configs_from_proto(request.config, source="ReloadConfigRequest")
        except ConfigError as e:
            raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
        for model in models:
            if not self._reload_path_allowed(Path(model.base_path)):
                raise ServingStatusError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"base path {clip(model.base_path)} of model "
                    f"{clip(model.name)} is not under a root the operator allowed "
                    "(--reload-config-root)",
                )
        self.core.reload_models(models)
        log.info("model config reloaded: %s", [m.name for m in models])
        return model_management_pb2.ReloadConfigResponse()

    def _reload_path_allowed(self, base_path: Path) -> bool:
        resolved = base_path.resolve()
        roots = self.core.reload_policy.roots
        if not roots:
            return resolved in self._started_base_paths
        return any(resolved.is_relative_to(Path(root).resolve()) for root in roots)

    # ---- warm-up ------------------------------------------------------------------------

    def warmup(self, servable: Servable) -> int:
        """Replay `assets.extra/tf_serving_warmup_requests`; any failure fails the load."""
        count = 0
        for entry in read_warmup_records(servable.path):
            kind = entry.WhichOneof("log_type")
            if kind == "predict_log":
                self.predict(entry.predict_log.request, servable=servable)
            elif kind == "classify_log":
                self.classify(entry.classify_log.request, servable=servable)
            elif kind == "regress_log":
                self.regress(entry.regress_log.request, servable=servable)
            else:
                raise ValueError(f"unsupported warm-up record type {kind!r}")
            count += 1
        return count


def fill_spec(spec, servable: Servable, signature: str) -> None:
    """A response's ModelSpec: the model and the version that answered, and the signature."""
    spec.name = servable.model
    spec.version.value = servable.version
    if signature:
        spec.signature_name = signature
