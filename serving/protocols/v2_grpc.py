"""`inference.GRPCInferenceService` (KServe V2 / Open Inference Protocol) on the gRPC port.

Always registered beside TF Serving's services: a V2 client and a TF Serving client reach the
same models, limits and metrics on one port. The messages come from the vendored
`grpc_predict_v2.proto` in a private descriptor pool (grpc_predict_v2_pb2.py), so the service is
registered by hand here (method paths `/inference.GRPCInferenceService/<Method>`); server
reflection lists it from a pool that server.py copies its file into (`reflection_pool`).

ModelInfer reads each input from `raw_input_contents` (all inputs, or none) or from its typed
`contents` field (FP16 has none: raw only), and answers every output in `raw_output_contents`,
as Triton does (tritonclient and the kserve SDK read both).
"""

from __future__ import annotations

import logging
import math

import grpc

from ampflow.serving.core.inference import CallObserver, Observer
from ampflow.serving.protocols import grpc_predict_v2_pb2 as pb
from ampflow.serving.protocols import v2 as v2_protocol
from ampflow.serving.protocols.v2 import V2Input, V2Protocol
from ampflow.serving.status import clip
from ampflow.serving.status import invalid_argument as invalid
from ampflow.serving.transport.grpc import abort_with, time_remaining

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
# The typed contents field of each datatype (FP16 has none in the protocol: raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


class V2Servicer:
    """The six V2 methods over `V2Protocol`; errors become the protocol's gRPC status codes."""

    def __init__(self, v2: V2Protocol, observe: Observer | None = None) -> None:
        self.v2 = v2
        self.calls = CallObserver(v2.core, observe)

    def handler(self) -> grpc.GenericRpcHandler:
        """The service's generic handler, for `grpc.Server.add_generic_rpc_handlers`."""
        methods = {
            "ServerLive": (pb.ServerLiveRequest, lambda r, c: pb.ServerLiveResponse(live=True)),
            "ServerReady": (pb.ServerReadyRequest, lambda r, c: pb.ServerReadyResponse(
                ready=self.v2.server_ready())),
            "ModelReady": (pb.ModelReadyRequest, self.model_ready),
            "ServerMetadata": (pb.ServerMetadataRequest, lambda r, c: pb.ServerMetadataResponse(
                **self.v2.server_metadata())),
            "ModelMetadata": (pb.ModelMetadataRequest, self.model_metadata),
            "ModelInfer": (pb.ModelInferRequest, self.model_infer),
        }
        handlers = {}
        for name, (request_type, fn) in methods.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._guarded(name, fn), request_deserializer=request_type.FromString,
                response_serializer=_serialize)
        return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)

    @staticmethod
    def _guarded(method: str, fn):
        def call(request, context):
            try:
                return fn(request, context)
            except Exception as e:  # noqa: BLE001 - every error becomes a status
                abort_with(context, method, e)
        return call

    def model_ready(self, request, _context):
        """ready=False for anything unknown or not loaded (Triton's answer), never an error."""
        with self.calls.call("ModelReady") as record:
            v2_protocol.record_names(record, request.name, request.version)
            return pb.ModelReadyResponse(ready=self.v2.model_ready(request.name,
                                                                   request.version))

    def model_metadata(self, request, _context):
        """The default signature's inputs and outputs with V2 datatypes; served versions."""
        with self.calls.call("ModelMetadata") as record:
            v2_protocol.record_names(record, request.name, request.version)
            meta = self.v2.model_metadata(request.name, request.version)
            response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"],
                                                platform=meta["platform"])
            for field in ("inputs", "outputs"):
                for tensor in meta[field]:
                    getattr(response, field).add(**tensor)
            return response

    def model_infer(self, request, context):
        """Inputs from raw or typed contents; outputs in raw_output_contents."""
        with self.calls.call("ModelInfer") as record:
            v2_protocol.record_names(record, request.model_name, request.model_version)
            signature, names = _options(request)
            result = self.v2.infer(request.model_name, request.model_version,
                                   _inputs(request), names, signature, time_remaining(context))
            record.answered = str(result.servable.version)
            response = pb.ModelInferResponse(model_name=result.servable.model,
                                             model_version=record.answered, id=request.id)
            for name, array in result.outputs.items():
                response.outputs.add(name=name, datatype=v2_protocol.output_datatype(array),
                                     shape=list(array.shape))
                response.raw_output_contents.append(v2_protocol.raw_bytes(array))
            return response


def _serialize(message) -> bytes:
    return message.SerializeToString()


def _options(request) -> tuple[str, list[str]]:
    """The signature parameter and the outputs asked for (classification refused)."""
    signature = ""
    if v2_protocol.SIGNATURE_PARAMETER in request.parameters:
        param = request.parameters[v2_protocol.SIGNATURE_PARAMETER]
        if param.WhichOneof("parameter_choice") != "string_param":
            raise invalid(f"parameter {v2_protocol.SIGNATURE_PARAMETER} must be a string")
        signature = param.string_param
    names = []
    for output in request.outputs:
        if "classification" in output.parameters:
            raise invalid(f"output '{clip(output.name)}': the classification extension is not "
                          "supported by ampflow serve")
        names.append(output.name)
    return signature, names


def _inputs(request) -> list[V2Input]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(f"raw_input_contents must hold one entry per input ({len(request.inputs)})."
                      f" Received: {len(raw)}")
    specs = []
    for i, tensor in enumerate(request.inputs):
        name, shape = tensor.name, tuple(tensor.shape)
        if raw:
            if tensor.HasField("contents"):
                raise invalid(f"input '{clip(name)}' has both contents and raw_input_contents")
            longest = _raw_longest(raw[i], shape) if tensor.datatype == "BYTES" else 0
            specs.append(V2Input(name, tensor.datatype, shape, len(raw[i]),
                                 _raw_builder(name, raw[i]), longest))
            continue
        values, sizes = _typed_values(name, tensor)
        specs.append(V2Input(name, tensor.datatype, shape, sum(sizes),
                             _values_builder(name, values), max(sizes, default=0)))
    return specs


def _typed_values(name: str, tensor) -> tuple[list, list[int]]:
    """The values of the datatype's own contents field, and each BYTES value's length.

    Any other field set is refused.
    """
    if tensor.datatype not in v2_protocol.DATATYPES:
        return [], []  # V2Input.declare names the unknown datatype
    field = CONTENTS_FIELD.get(tensor.datatype)
    used = [f.name for f, _ in tensor.contents.ListFields()]
    if field is None:
        raise invalid(f"input '{clip(name)}': {tensor.datatype} values travel only in "
                      "raw_input_contents")
    if any(f != field for f in used):
        raise invalid(f"input '{clip(name)}' of datatype {clip(tensor.datatype)} carries its "
                      f"values in {field or 'raw_input_contents'}. Received: {used}")
    values = list(getattr(tensor.contents, field))
    return values, (list(map(len, values)) if tensor.datatype == "BYTES" else [])


def _raw_builder(name: str, raw: bytes):
    return lambda dtype, shape: v2_protocol.from_raw(name, raw, dtype, shape)


def _raw_longest(raw: bytes, shape: tuple[int, ...]):
    """The longest raw BYTES element, read by the core once the element count has passed."""
    return lambda: v2_protocol.longest_raw_element(raw, math.prod(shape))


def _values_builder(name: str, values: list):
    return lambda dtype, shape: v2_protocol.from_values(name, values, dtype, shape)
