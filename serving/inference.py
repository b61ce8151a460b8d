"""The request logic of the server, one for every transport: `InferenceCore`.

Plain methods that take and return the real `tensorflow_serving.apis` protos and raise
`ServingStatusError` with TF Serving's codes, so the gRPC servicers (service.py), the REST API
(rest.py), the warm-up replay and the tests all go through the same validation and limits.
Nothing here knows a tensor name: inputs, outputs, dtypes and shapes come from each version's
SignatureDefs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path

import grpc
import numpy as np
from google.protobuf import any_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    predict_pb2,
)

from ampflow.errors import ConfigError
from ampflow.serving import classification, tensors
from ampflow.serving.config import model_configs_from_proto
from ampflow.serving.model_format import (
    DEFAULT_SIGNATURE,
    read_warmup_records,
)
from ampflow.serving.model_registry import ModelRegistry
from ampflow.serving.servable import ServableVersion
from ampflow.serving.status import ServingStatusError, clip, scrub_paths

log = logging.getLogger(__name__)

UNKNOWN_LABEL = "<unknown>"  # the metric label of any name or version the server does not know

Runner = Callable[[ServableVersion, str, dict, "float | None"], dict]
# What each transport reports of every call: model, version, method, code, seconds.
Observer = Callable[[str, str, str, grpc.StatusCode, float], None]


def _direct_run(servable: ServableVersion, signature: str, inputs: dict, _timeout) -> dict:
    return servable.run(signature, inputs)


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """What one request may cost, checked before anything is decoded or run.

    `max_bytes`: decoded input tensors (all inputs together; a string tensor counts its strings'
    bytes, e.g. the encoded images of `image_bytes`), and Classify examples with their context
    merged in; `max_rows`: the batch (first dimension) of a batched input, and the
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
                f'Serving signature key "{clip(name)}" not found. Available signatures: '
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
            tensors.to_proto(outputs[alias], out=response.outputs[alias])
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
        shapes = {}
        for name in sorted(expected):
            proto = request.inputs[name]
            shape = shapes[name] = tensors.declared_shape(name, proto)
            tensors.check_against_signature(name, proto.dtype, shape, sig.inputs[name],
                                            self.limits.max_rows)
            budget -= tensors.decoded_bytes(proto, shape)
            if budget < 0:
                raise ServingStatusError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the inputs of this request would decode to more than "
                    f"{self.limits.max_bytes} bytes (--max-message-bytes)",
                )
        return {name: tensors.decode_checked(name, request.inputs[name], shape)
                for name, shape in shapes.items()}

    @staticmethod
    def _output_aliases(request, sig) -> list[str]:
        if not request.output_filter:
            return sorted(sig.outputs)
        seen: set[str] = set()
        for alias in request.output_filter:
            if alias not in sig.outputs:
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"output tensor alias not found in signature: {clip(alias)} Outputs "
                    f"expected to be in the set {{{','.join(sorted(sig.outputs))}}}.",
                )
            if alias in seen:
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"duplicate output tensor alias: {clip(alias)}",
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
        input_key = classification.classify_input_key(sig, sig_name)
        examples = classification.serialized_examples(
            request.input, self.limits.max_rows, self.limits.max_bytes)
        batch = np.empty(len(examples), dtype=object)
        batch[:] = examples
        outputs = self._run(servable, sig_name, {input_key: batch}, timeout_s)
        response = classification_pb2.ClassificationResponse()
        _fill_spec(response.model_spec, servable, sig_name)
        classification.fill_classifications(response.result, outputs, len(examples))
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
                    f"base path {clip(model.base_path)} of model "
                    f"{clip(model.name)} is not under a root the operator allowed "
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
        for entry in read_warmup_records(servable.path):
            kind = entry.WhichOneof("log_type")
            if kind == "predict_log":
                self.predict(entry.predict_log.request, servable=servable)
            elif kind == "classify_log":
                self.classify(entry.classify_log.request, servable=servable)
            else:
                raise ValueError(f"unsupported warm-up record type {kind!r}")
            count += 1
        return count

    # ---- metrics ------------------------------------------------------------------------

    def metric_labels(self, request, answered: str) -> tuple[str, str]:
        """(model, version) labels of a request: only configured names and known versions.

        Anything else a client sends collapses to one value, so labels cannot grow without
        bound. `answered` is the version that answered, when one did.
        """
        spec = getattr(request, "model_spec", None)
        if spec is None:
            return "", ""
        if spec.name not in self.registry.model_names():
            return (UNKNOWN_LABEL if spec.name else ""), ""
        if answered:
            return spec.name, answered
        choice = spec.WhichOneof("version_choice")
        if choice == "version" and self.registry.knows_version(spec.name, spec.version.value):
            return spec.name, str(spec.version.value)
        return spec.name, UNKNOWN_LABEL if choice else ""


@dataclasses.dataclass
class CallRecord:
    """What a transport learns of one call for the metrics, filled in as the call goes.

    `method`: the label ("Predict", "ModelInfer"; "" = not counted); `request`: anything with
    a `model_spec` (the model/version labels come from it); `answered`: the version that
    answered, when one did.
    """

    method: str = ""
    request: object = None
    answered: str = ""
    code: grpc.StatusCode = grpc.StatusCode.OK


class CallObserver:
    """The one call wrapper of every transport (gRPC, REST, V2): code, labels, seconds.

    Every transport labels a call by the version that *answered* it (a request for the latest
    version counts under the number that ran), so REST and gRPC report the same series.
    """

    def __init__(self, core: InferenceCore, observe: Observer | None) -> None:
        self.core = core
        self.observe = observe

    @contextlib.contextmanager
    def call(self, method: str = "") -> Iterator[CallRecord]:
        """Time the block; a ServingStatusError's code (INTERNAL for others) is recorded."""
        record, started = CallRecord(method), time.perf_counter()
        try:
            yield record
        except ServingStatusError as e:
            record.code = e.code
            raise
        except Exception:
            record.code = grpc.StatusCode.INTERNAL
            raise
        finally:
            if self.observe is not None and record.method:
                model, version = self.core.metric_labels(record.request, record.answered)
                self.observe(model, version, record.method, record.code,
                             time.perf_counter() - started)


def answered_version(response) -> str:
    """The version in a response's ModelSpec ("" when it has none)."""
    spec = getattr(response, "model_spec", None)
    return str(spec.version.value) if spec is not None and spec.HasField("version") else ""


def _fill_spec(spec, servable: ServableVersion, signature: str) -> None:
    spec.name = servable.model
    spec.version.value = servable.version
    if signature:
        spec.signature_name = signature


def _names(names) -> str:
    """A set of client-sent names for an error message: at most 10, each clipped."""
    ordered = sorted(names)
    shown = ",".join(clip(n, 64) for n in ordered[:10])
    more = f",...({len(ordered) - 10} more)" if len(ordered) > 10 else ""
    return f"{{{shown}{more}}}"


# "Detected at node N defined at (most recent call last):" then the Python stack and a blank
# line, or, for a loaded SavedModel, "<stack traces unavailable>" and one newline.
_TF_TRACE = re.compile(r"Detected at node .*? defined at \(most recent call last\):\n"
                       r"(?:<stack traces unavailable>\n|.*?\n\n)", re.DOTALL)


def op_error_text(error: Exception) -> str:
    """A TensorFlow/Python error as a client may see it.

    The error itself, without the Python stack TensorFlow appends and without any file-system
    path of the server.
    """
    text = getattr(error, "message", None) or str(error)
    text = _TF_TRACE.sub("", text).replace("Graph execution error:\n\n", "")
    return clip(f"{type(error).__name__}: {scrub_paths(text.strip())}", 900)
