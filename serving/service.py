"""PredictionService and ModelService over the model registry, with TF Serving's status codes.

The request logic lives in `InferenceCore` (plain methods that take and return the real
`tensorflow_serving.apis` protos and raise `ServingStatusError`), so the gRPC servicers, the
warm-up replay and the tests all go through the same validation. Nothing here knows a tensor
name: inputs, outputs, dtypes and shapes come from each version's SignatureDefs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FuturesTimeout

import grpc
import numpy as np
from google.protobuf import any_pb2
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
)

from ampflow.errors import ConfigError
from ampflow.serving import tensors
from ampflow.serving.config import model_configs_from_proto
from ampflow.serving.model_registry import (
    ModelRegistry,
    ServableVersion,
    ServingStatusError,
    read_warmup_records,
)

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"

Runner = Callable[[ServableVersion, str, dict, "float | None"], dict]


def _direct_run(servable: ServableVersion, signature: str, inputs: dict, _timeout) -> dict:
    return servable.run(signature, inputs)


class InferenceCore:
    """Validates requests like TF Serving and answers them from a resolved servable."""

    def __init__(self, registry: ModelRegistry, runner: Runner | None = None) -> None:
        self.registry = registry
        self.runner = runner or _direct_run

    # ---- shared -------------------------------------------------------------------------

    def resolve(self, request) -> ServableVersion:
        """The servable a request's ModelSpec names (Missing ModelSpec is INVALID_ARGUMENT)."""
        if not request.HasField("model_spec"):
            raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        spec = request.model_spec
        choice = spec.WhichOneof("version_choice")
        version = spec.version.value if choice == "version" else None
        label = spec.version_label if choice == "version_label" else None
        return self.registry.resolve(spec.name, version, label)

    @staticmethod
    def signature(servable: ServableVersion, name: str) -> meta_graph_pb2.SignatureDef:
        """The named SignatureDef, FAILED_PRECONDITION when it does not exist (as TF Serving)."""
        name = name or DEFAULT_SIGNATURE
        if name not in servable.signature_defs or not servable.can_run(name):
            raise ServingStatusError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f'Serving signature key "{name}" not found. Available signatures: '
                f"{sorted(n for n in servable.signature_defs if servable.can_run(n))}",
            )
        return servable.signature_defs[name]

    # ---- Predict ------------------------------------------------------------------------

    def predict(self, request: predict_pb2.PredictRequest, timeout_s: float | None = None,
                servable: ServableVersion | None = None) -> predict_pb2.PredictResponse:
        """Predict by signature name, honouring `output_filter`."""
        servable = servable or self.resolve(request)
        sig_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        sig = self.signature(servable, sig_name)
        inputs = self._predict_inputs(request, sig)
        aliases = self._output_aliases(request, sig)
        outputs = self._run(servable, sig_name, inputs, timeout_s)
        response = predict_pb2.PredictResponse()
        _fill_spec(response.model_spec, servable, sig_name)
        for alias in aliases:
            response.outputs[alias].CopyFrom(tensors.to_proto(outputs[alias]))
        return response

    def _predict_inputs(self, request, sig) -> dict[str, np.ndarray]:
        sent, expected = set(request.inputs), set(sig.inputs)
        if sent != expected:
            raise ServingStatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"input size does not match signature: {len(sent)}!={len(expected)} "
                f"len({{{','.join(sorted(sent))}}}) vs len({{{','.join(sorted(expected))}}}). "
                f"Sent extra: {{{','.join(sorted(sent - expected))}}}. Missing but required: "
                f"{{{','.join(sorted(expected - sent))}}}.",
            )
        inputs = {}
        for name in sorted(expected):
            array = tensors.to_ndarray(name, request.inputs[name])
            tensors.check_against_signature(name, array, sig.inputs[name])
            inputs[name] = array
        return inputs

    @staticmethod
    def _output_aliases(request, sig) -> list[str]:
        if not request.output_filter:
            return sorted(sig.outputs)
        seen: set[str] = set()
        for alias in request.output_filter:
            if alias not in sig.outputs:
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"output tensor alias not found in signature: {alias} Outputs expected to "
                    f"be in the set {{{','.join(sorted(sig.outputs))}}}.",
                )
            if alias in seen:
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"duplicate output tensor alias: {alias}"
                )
            seen.add(alias)
        return list(request.output_filter)

    def _run(self, servable, sig_name, inputs, timeout_s) -> dict:
        try:
            return self.runner(servable, sig_name, inputs, timeout_s)
        except ServingStatusError:
            raise
        except FuturesTimeout as e:  # the batch did not run within the caller's deadline
            raise ServingStatusError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                     "Deadline exceeded while waiting for a batch") from e
        except Exception as e:  # an op failing on valid-looking data is the caller's input
            import tensorflow as tf

            if isinstance(e, (tf.errors.InvalidArgumentError, ValueError, TypeError)):
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{type(e).__name__}: {e}"[:1000]
                ) from e
            raise

    # ---- Classify -----------------------------------------------------------------------

    def classify(self, request: classification_pb2.ClassificationRequest,
                 timeout_s: float | None = None, servable: ServableVersion | None = None
                 ) -> classification_pb2.ClassificationResponse:
        """Classify tf.Examples through a `tensorflow/serving/classify` signature."""
        servable = servable or self.resolve(request)
        sig_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        sig = self.signature(servable, sig_name)
        input_key = _classify_input_key(sig, sig_name)
        examples = _serialized_examples(request.input)
        batch = np.empty(len(examples), dtype=object)
        batch[:] = examples
        outputs = self._run(servable, sig_name, {input_key: batch}, timeout_s)
        response = classification_pb2.ClassificationResponse()
        _fill_spec(response.model_spec, servable, sig_name)
        _fill_classifications(response.result, outputs, len(examples))
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
                    f"Metadata field {field} is not supported. Expected: signature_def",
                )
        servable = self.resolve(request)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        _fill_spec(response.model_spec, servable, "")
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        for name, sig in servable.signature_defs.items():
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
            version = self.registry.resolve(spec.name, None, spec.version_label).version
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, status in self.registry.status(spec.name, version):
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = int(status.state)
            entry.status.error_code = status.error_code.value[0]
            entry.status.error_message = status.error
        return response

    def reload_config(self, request: model_management_pb2.ReloadConfigRequest
                      ) -> model_management_pb2.ReloadConfigResponse:
        """HandleReloadConfigRequest: swap models and version labels without a restart."""
        response = model_management_pb2.ReloadConfigResponse()
        try:
            models = model_configs_from_proto(request.config, source="ReloadConfigRequest")
            self.registry.reload_config(models)
        except ConfigError as e:
            response.status.error_code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
            response.status.error_message = str(e)
        except ServingStatusError as e:
            response.status.error_code = e.code.value[0]
            response.status.error_message = e.message
        else:
            log.info("model config reloaded: %s", [m.name for m in models])
        return response

    # ---- warm-up ------------------------------------------------------------------------

    def warmup(self, servable: ServableVersion) -> int:
        """Replay `assets.extra/tf_serving_warmup_requests`; any failure fails the load."""
        count = 0
        for raw in read_warmup_records(servable.path):
            entry = prediction_log_pb2.PredictionLog.FromString(raw)
            kind = entry.WhichOneof("log_type")
            if kind == "predict_log":
                self.predict(entry.predict_log.request, servable=servable)
            elif kind == "classify_log":
                self.classify(entry.classify_log.request, servable=servable)
            else:
                raise ValueError(f"unsupported warm-up record type {kind!r}")
            count += 1
        return count


def _fill_spec(spec, servable: ServableVersion, signature: str) -> None:
    spec.name = servable.model
    spec.version.value = servable.version
    if signature:
        spec.signature_name = signature


def _classify_input_key(sig, sig_name: str) -> str:
    if sig.method_name != CLASSIFY_METHOD:
        raise ServingStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Expected classification signature method_name to be {CLASSIFY_METHOD}. "
            f"Was: {sig.method_name} (signature {sig_name!r})",
        )
    if len(sig.inputs) != 1 or next(iter(sig.inputs.values())).dtype != types_pb2.DT_STRING:
        raise ServingStatusError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"Classification signature {sig_name!r} must have exactly one DT_STRING input. "
            f"Received: {sorted(sig.inputs)}",
        )
    if not ({"classes", "scores"} & set(sig.outputs)):
        raise ServingStatusError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"Classification signature {sig_name!r} must output 'classes' or 'scores'. "
            f"Received: {sorted(sig.outputs)}",
        )
    return next(iter(sig.inputs))


def _serialized_examples(input_proto) -> list[bytes]:
    """tf.Examples of a request Input, with any context merged into each (as TF Serving)."""
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        examples = list(input_proto.example_list.examples)
        serialized = [e.SerializeToString() for e in examples]
    elif kind == "example_list_with_context":
        ctx = input_proto.example_list_with_context.context
        serialized = []
        for example in input_proto.example_list_with_context.examples:
            merged = type(ctx)()
            merged.CopyFrom(ctx)
            merged.MergeFrom(example)
            serialized.append(merged.SerializeToString())
    else:
        serialized = []
    if not serialized:
        raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")
    return serialized


def _fill_classifications(result, outputs: dict, n: int) -> None:
    classes = outputs.get("classes")
    scores = outputs.get("scores")
    for i in range(n):
        row = result.classifications.add()
        width = (scores if scores is not None else classes).shape[1]
        for j in range(width):
            klass = row.classes.add()
            if classes is not None:
                label = classes[i][j]
                klass.label = label.decode() if isinstance(label, bytes) else str(label)
            if scores is not None:
                klass.score = float(scores[i][j])


# ---- gRPC servicers ---------------------------------------------------------------------

Observer = Callable[[str, str, str, grpc.StatusCode, float], None]


class _Handler:
    """Turns `ServingStatusError` into the right status; one bad request never escapes."""

    def __init__(self, core: InferenceCore, observe: Observer | None) -> None:
        self.core = core
        self.observe = observe

    def call(self, method: str, request, context, fn):
        started = time.perf_counter()
        code, version = grpc.StatusCode.OK, ""
        try:
            response = fn(request, _remaining(context))
            version = str(response.model_spec.version.value) if hasattr(
                response, "model_spec") else ""
            return response
        except ServingStatusError as e:
            code = e.code
            context.abort(e.code, e.message)
        except Exception as e:  # a server bug must not kill the process: report INTERNAL
            log.exception("%s failed", method)
            code = grpc.StatusCode.INTERNAL
            context.abort(code, f"{type(e).__name__}: {e}"[:1000])
        finally:
            if self.observe is not None:
                spec = getattr(request, "model_spec", None)
                model = spec.name if spec is not None else ""
                version = version or _requested_version(spec)
                self.observe(model, version, method, code, time.perf_counter() - started)


def _requested_version(spec) -> str:
    """The version (or label) a failed request asked for, for the metrics labels."""
    if spec is None:
        return ""
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return str(spec.version.value)
    return spec.version_label if choice == "version_label" else ""


def _remaining(context) -> float | None:
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e6 else None


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """tensorflow.serving.PredictionService: Predict, Classify, GetModelMetadata."""

    def __init__(self, core: InferenceCore, observe: Observer | None = None) -> None:
        self._h = _Handler(core, observe)

    def Predict(self, request, context):  # noqa: D102 - gRPC method names are fixed
        return self._h.call("Predict", request, context, self._h.core.predict)

    def Classify(self, request, context):  # noqa: D102
        return self._h.call("Classify", request, context, self._h.core.classify)

    def GetModelMetadata(self, request, context):  # noqa: D102
        return self._h.call("GetModelMetadata", request, context,
                            lambda r, _t: self._h.core.metadata(r))

    def Regress(self, request, context):  # noqa: D102
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Regress is not supported by ampflow serve")

    def MultiInference(self, request, context):  # noqa: D102
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      "MultiInference is not supported by ampflow serve")


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    """tensorflow.serving.ModelService: GetModelStatus, HandleReloadConfigRequest."""

    def __init__(self, core: InferenceCore, observe: Observer | None = None) -> None:
        self._h = _Handler(core, observe)

    def GetModelStatus(self, request, context):  # noqa: D102
        return self._h.call("GetModelStatus", request, context,
                            lambda r, _t: self._h.core.status(r))

    def HandleReloadConfigRequest(self, request, context):  # noqa: D102
        return self._h.call("HandleReloadConfigRequest", request, context,
                            lambda r, _t: self._h.core.reload_config(r))
