"""PredictionService and ModelService over the model registry, with TF Serving's status codes.

The request logic lives in `InferenceCore` (plain methods that take and return the real
`tensorflow_serving.apis` protos and raise `ServingStatusError`), so the gRPC servicers, the
warm-up replay and the tests all go through the same validation. Nothing here knows a tensor
name: inputs, outputs, dtypes and shapes come from each version's SignatureDefs.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path

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


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """What one request may cost, checked before anything is decoded or run.

    `max_bytes`: decoded input tensors (all inputs together), and Classify examples with their
    context merged in; `max_rows`: the batch (first dimension) of a batched input, and the
    number of Classify examples (0 = no cap).
    """

    max_bytes: int = 64 * 1024 * 1024
    max_rows: int = 0


@dataclasses.dataclass(frozen=True)
class ReloadPolicy:
    """Who may use HandleReloadConfigRequest.

    Off unless the operator allows it, and then only for base paths under `roots` (none given:
    only the base paths configured at start).
    """

    allowed: bool = False
    roots: tuple[Path, ...] = ()


class InferenceCore:
    """Validates requests like TF Serving and answers them from a resolved servable."""

    def __init__(self, registry: ModelRegistry, runner: Runner | None = None,
                 limits: RequestLimits | None = None,
                 reload_policy: ReloadPolicy | None = None) -> None:
        self.registry = registry
        self.runner = runner or _direct_run
        self.limits = limits or RequestLimits()
        self.reload_policy = reload_policy or ReloadPolicy()
        self._started_base_paths = {Path(m.base_path).resolve() for m in registry.configs()}

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
                f'Serving signature key "{tensors.clip(name)}" not found. Available signatures: '
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
        """Check declared dtypes, shapes and sizes first, then decode.

        Signature and limits are checked before decoding: nothing is allocated for a
        request that will be refused.
        """
        sent, expected = set(request.inputs), set(sig.inputs)
        if sent != expected:
            raise ServingStatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"input size does not match signature: {len(sent)}!={len(expected)} "
                f"len({_names(sent)}) vs len({_names(expected)}). "
                f"Sent extra: {_names(sent - expected)}. Missing but required: "
                f"{_names(expected - sent)}.",
            )
        budget = self.limits.max_bytes
        for name in sorted(expected):
            proto = request.inputs[name]
            shape = tensors.declared_shape(name, proto)
            tensors.check_against_signature(name, proto.dtype, shape, sig.inputs[name],
                                            self.limits.max_rows)
            budget -= tensors.decoded_bytes(proto, shape)
            if budget < 0:
                raise ServingStatusError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the inputs of this request would decode to more than "
                    f"{self.limits.max_bytes} bytes (--max-message-bytes)",
                )
        return {name: tensors.to_ndarray(name, request.inputs[name]) for name in sorted(expected)}

    @staticmethod
    def _output_aliases(request, sig) -> list[str]:
        if not request.output_filter:
            return sorted(sig.outputs)
        seen: set[str] = set()
        for alias in request.output_filter:
            if alias not in sig.outputs:
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"output tensor alias not found in signature: {tensors.clip(alias)} Outputs "
                    f"expected to be in the set {{{','.join(sorted(sig.outputs))}}}.",
                )
            if alias in seen:
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"duplicate output tensor alias: {tensors.clip(alias)}",
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
                    grpc.StatusCode.INVALID_ARGUMENT, op_error_text(e)
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
        examples = _serialized_examples(request.input, self.limits)
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
                    f"Metadata field {tensors.clip(field)} is not supported. Expected: "
                    "signature_def",
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
        """HandleReloadConfigRequest: swap models and version labels without a restart.

        Refused (PERMISSION_DENIED) unless the operator allowed it, and for any base path
        outside the allowed roots; a reload that fails fails the RPC with its code, as in
        TF Serving (the response's `status` is not where a stock client looks).
        """
        if not self.reload_policy.allowed:
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
                    f"base path {tensors.clip(model.base_path)} of model "
                    f"{tensors.clip(model.name)} is not under a root the operator allowed "
                    "(--reload-config-root)",
                )
        self.registry.reload_config(models)
        log.info("model config reloaded: %s", [m.name for m in models])
        return model_management_pb2.ReloadConfigResponse()

    def _reload_path_allowed(self, base_path: Path) -> bool:
        resolved = base_path.resolve()
        roots = self.reload_policy.roots
        if not roots:
            return resolved in self._started_base_paths
        return any(resolved.is_relative_to(Path(root).resolve()) for root in roots)

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


def _serialized_examples(input_proto, limits: RequestLimits) -> list[bytes]:
    """tf.Examples of a request Input, with any context merged into each (as TF Serving).

    The count is capped like a batch, and the merged size is computed before merging: a big
    context copied into every example must not multiply the request's memory.
    """
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        examples, context = input_proto.example_list.examples, None
    elif kind == "example_list_with_context":
        examples = input_proto.example_list_with_context.examples
        context = input_proto.example_list_with_context.context
    else:
        examples, context = [], None
    if not examples:
        raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")
    if limits.max_rows and len(examples) > limits.max_rows:
        raise ServingStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Input has {len(examples)} examples; this server takes at most {limits.max_rows} "
            "per request (--max-request-batch-size)",
        )
    context_bytes = context.ByteSize() if context is not None else 0
    merged = sum(e.ByteSize() for e in examples) + context_bytes * len(examples)
    if limits.max_bytes and merged > limits.max_bytes:
        raise ServingStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"merging the context ({context_bytes} bytes) into each of {len(examples)} examples "
            f"makes {merged} bytes; the limit is {limits.max_bytes} bytes (--max-message-bytes)",
        )
    if context is None:
        return [e.SerializeToString() for e in examples]
    serialized = []
    for example in examples:
        combined = type(context)()
        combined.CopyFrom(context)
        combined.MergeFrom(example)
        serialized.append(combined.SerializeToString())
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


MAX_ERROR_MESSAGE = 1024  # well under gRPC's 8 KiB metadata limit, whatever the client sent
UNKNOWN_LABEL = "<unknown>"


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
            context.abort(e.code, tensors.clip(e.message, MAX_ERROR_MESSAGE))
        except Exception as e:  # a server bug must not kill the process: report INTERNAL
            log.exception("%s failed", method)
            code = grpc.StatusCode.INTERNAL
            context.abort(code, f"internal error ({type(e).__name__}); see the server log")
        finally:
            if self.observe is not None:
                model, version = self.labels(request, version)
                self.observe(model, version, method, code, time.perf_counter() - started)

    def labels(self, request, answered: str) -> tuple[str, str]:
        """Metric labels: only configured model names and known versions.

        Anything else a client sends collapses to one value, so labels cannot grow without bound.
        """
        spec = getattr(request, "model_spec", None)
        if spec is None:
            return "", ""
        if spec.name not in self.core.registry.model_names():
            return (UNKNOWN_LABEL if spec.name else ""), ""
        if answered:
            return spec.name, answered
        choice = spec.WhichOneof("version_choice")
        if choice == "version" and self.core.registry.knows_version(spec.name,
                                                                     spec.version.value):
            return spec.name, str(spec.version.value)
        return spec.name, UNKNOWN_LABEL if choice else ""


def _names(names) -> str:
    """A set of client-sent names for an error message: at most 10, each clipped."""
    ordered = sorted(names)
    shown = ",".join(tensors.clip(n, 64) for n in ordered[:10])
    more = f",...({len(ordered) - 10} more)" if len(ordered) > 10 else ""
    return f"{{{shown}{more}}}"


_PATH = re.compile(r"(?<![\w.])/(?:[\w.+@-]+/)+[\w.+@-]*")
_TF_TRACE = re.compile(r"Detected at node .*? defined at \(most recent call last\):.*?\n\n",
                       re.DOTALL)


def op_error_text(error: Exception) -> str:
    """A TensorFlow/Python error as a client may see it.

    The error itself, without the Python stack TensorFlow appends and without any file-system
    path of the server.
    """
    text = getattr(error, "message", None) or str(error)
    text = _TF_TRACE.sub("", text).replace("Graph execution error:\n\n", "")
    return tensors.clip(f"{type(error).__name__}: {scrub_paths(text.strip())}", 900)


def scrub_paths(text: str) -> str:
    """Replace absolute file-system paths with `<path>`."""
    return _PATH.sub("<path>", text)



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
