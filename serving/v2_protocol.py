"""The Open Inference Protocol (KServe V2) over `InferenceCore`: one logic for REST and gRPC.

A V2 call names a model and an optional version *string*, and sends typed tensors
(`name`, `datatype` such as FP32/INT64/BYTES, `shape`, then the values in one of three
encodings: JSON `data`, gRPC typed `contents`, or raw little-endian bytes). `V2Core`:
- resolves the model and version (a number, or one of the model's version labels; anything
  unknown is NOT_FOUND, as the protocol says);
- checks every input's name, datatype and shape against the signature, and its *declared* size
  (shape x datatype, or the raw bytes sent for BYTES) against `--max-message-bytes`, before any
  tensor is built;
- then builds the TensorProtos of a PredictRequest (each encoding must hold exactly
  prod(shape) values) and answers through `InferenceCore.predict`, so batching, limits, errors
  and outputs are those of TF Serving's Predict on the same model.
Transports (v2_rest.py, v2_grpc.py) turn their wire format into `InputSpec`s and the answer
(`InferResult`) back; nothing here knows a tensor name.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Sequence

import grpc
import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2

from ampflow.serving import tensors
from ampflow.serving.inference import InferenceCore
from ampflow.serving.model_format import DEFAULT_SIGNATURE
from ampflow.serving.servable import ServableVersion
from ampflow.serving.status import ServingStatusError, VersionState, clip, not_found
from ampflow.serving.status import invalid_argument as invalid

# The protocol's tensor datatypes and TensorFlow's (BF16 has no numpy dtype here: refused).
DATATYPES: dict[str, int] = {
    "BOOL": types_pb2.DT_BOOL,
    "UINT8": types_pb2.DT_UINT8, "UINT16": types_pb2.DT_UINT16,
    "UINT32": types_pb2.DT_UINT32, "UINT64": types_pb2.DT_UINT64,
    "INT8": types_pb2.DT_INT8, "INT16": types_pb2.DT_INT16,
    "INT32": types_pb2.DT_INT32, "INT64": types_pb2.DT_INT64,
    "FP16": types_pb2.DT_HALF, "FP32": types_pb2.DT_FLOAT, "FP64": types_pb2.DT_DOUBLE,
    "BYTES": types_pb2.DT_STRING,
}
DATATYPE_OF: dict[int, str] = {dt: name for name, dt in DATATYPES.items()}
SIGNATURE_PARAMETER = "signature_name"  # a request parameter: which SignatureDef to run
BYTES_LENGTH = struct.Struct("<I")  # raw BYTES: each element is a 4-byte length, then bytes
SERVER_NAME = "ampflow"
EXTENSIONS = ("binary_tensor_data",)  # REST: raw tensor bytes after the JSON (Triton's)


def datatype_of(dtype: int) -> str:
    """The V2 name of a TensorFlow dtype (`DT_...` itself when V2 has none)."""
    return DATATYPE_OF.get(dtype, tensors.dtype_name(dtype))


@dataclasses.dataclass
class InputSpec:
    """One input as sent: its declared name, datatype and shape, and how to build it.

    `payload_bytes`: the bytes the client sent for it (counted for BYTES, whose decoded size
    is its payload); `build(dtype, shape)` returns the TensorProto, and is called only after
    the declared size has passed the limits.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    payload_bytes: int
    build: Callable[[int, tuple[int, ...]], tensor_pb2.TensorProto]


@dataclasses.dataclass
class InferResult:
    """What a V2 infer answers: the version that ran and the outputs in answer order."""

    model: str
    version: str
    outputs: dict[str, np.ndarray]
    request: predict_pb2.PredictRequest  # what ran, for the metrics' model/version labels


class V2Core:
    """Readiness, metadata and inference of the V2 protocol, over an `InferenceCore`."""

    def __init__(self, core: InferenceCore) -> None:
        self.core = core

    # ---- health and metadata -----------------------------------------------------------

    @staticmethod
    def server_metadata() -> dict:
        """name, version and the extensions this server speaks."""
        from ampflow import __version__

        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def server_ready(self) -> bool:
        """Ready once every configured model has a version loaded (as grpc.health)."""
        return self.core.registry.any_available()

    def resolve(self, name: str, version: str) -> ServableVersion:
        """The version a V2 (name, version) names; unknown model or version is NOT_FOUND."""
        if not name:
            raise invalid("a model name is required")
        number, label = parse_version(version)
        try:
            return self.core.registry.resolve(name, number, label)
        except ServingStatusError as e:
            if label is not None and e.code == grpc.StatusCode.INVALID_ARGUMENT:
                raise not_found(f"model {clip(name)} has no version {clip(version)}") from e
            raise

    def knows_model(self, name: str) -> bool:
        """Whether `name` is a configured model (loaded or not)."""
        return name in self.core.registry.model_names()

    def model_ready(self, name: str, version: str) -> bool:
        """Whether the model (version) can answer now: False for anything unknown (as Triton)."""
        try:
            self.resolve(name, version)
        except ServingStatusError:
            return False
        return True

    def model_metadata(self, name: str, version: str, signature: str = "") -> dict:
        """name, versions (served, as strings), platform, inputs/outputs of the signature."""
        servable = self.resolve(name, version)
        sig = self.core.signature(servable, signature or DEFAULT_SIGNATURE)
        if version:
            versions = [str(servable.version)]
        else:
            versions = [str(v) for v, status in self.core.registry.status(name, None)
                        if status.state == VersionState.AVAILABLE]
        return {"name": servable.model, "versions": versions, "platform": servable.platform,
                "inputs": _tensor_metadata(sig.inputs), "outputs": _tensor_metadata(sig.outputs)}

    # ---- inference ----------------------------------------------------------------------

    def infer(self, name: str, version: str, inputs: Sequence[InputSpec],
              output_names: Sequence[str], signature: str = "",
              timeout_s: float | None = None) -> InferResult:
        """Check the declared inputs, build them, run Predict, return the outputs asked."""
        servable = self.resolve(name, version)
        sig_name = signature or DEFAULT_SIGNATURE
        sig = self.core.signature(servable, sig_name)
        self._check_inputs(inputs, sig)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = servable.model
        request.model_spec.version.value = servable.version
        request.model_spec.signature_name = sig_name
        for spec in inputs:
            request.inputs[spec.name].CopyFrom(
                spec.build(sig.inputs[spec.name].dtype, spec.shape))
        request.output_filter.extend(output_names)
        response = self.core.predict(request, timeout_s, servable=servable)
        order = list(output_names) or sorted(response.outputs)
        outputs = {k: tensors.to_ndarray(k, response.outputs[k]) for k in order}
        return InferResult(servable.model, str(servable.version), outputs, request)

    def _check_inputs(self, inputs: Sequence[InputSpec], sig) -> None:
        """Names, datatypes, shapes and declared sizes, before any tensor is built."""
        sent = [spec.name for spec in inputs]
        if len(set(sent)) != len(sent):
            raise invalid(f"input names must be unique. Received: {clip(sent, 300)}")
        if set(sent) != set(sig.inputs):
            raise invalid(
                f"the model expects inputs {sorted(sig.inputs)}. Received: {clip(sent, 300)}")
        budget = self.core.limits.max_bytes
        for spec in inputs:
            info = sig.inputs[spec.name]
            expected = datatype_of(info.dtype)
            if spec.datatype not in DATATYPES:
                raise invalid(f"input '{clip(spec.name)}': unknown datatype "
                              f"{clip(spec.datatype)} (expected {expected})")
            if spec.datatype != expected:
                raise invalid(f"input '{clip(spec.name)}' must be {expected}. Received: "
                              f"{clip(spec.datatype)}")
            _check_shape(spec.name, spec.shape)
            tensors.check_against_signature(spec.name, info.dtype, spec.shape, info,
                                            self.core.limits.max_rows)
            budget -= declared_bytes(spec)
            if budget < 0:
                raise ServingStatusError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the inputs of this request declare more than {self.core.limits.max_bytes}"
                    " bytes (--max-message-bytes)")


def labels_request(name: str, version: str) -> predict_pb2.PredictRequest:
    """A request naming (name, version) for the metrics' labels of a V2 call."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version.isascii() and version.isdigit() and int(version) < 2 ** 63:
        request.model_spec.version.value = int(version)
    elif version:
        request.model_spec.version_label = version
    return request


def parse_version(text: str) -> tuple[int | None, str | None]:
    """A V2 version string: "" = the latest, digits = a version number, else a version label."""
    if not text:
        return None, None
    if text.isascii() and text.isdigit():
        number = int(text)
        if number >= 2 ** 63:
            raise not_found(f"no version {clip(text)}")
        return number, None
    return None, text


def _check_shape(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) > tensors.MAX_RANK:
        raise invalid(f"input '{clip(name)}': rank must be <= {tensors.MAX_RANK}. "
                      f"Received: rank {len(shape)}")
    if any(d < 0 for d in shape):
        raise invalid(f"input '{clip(name)}': shape must not hold negative sizes. "
                      f"Received: {clip(list(shape))}")
    if math.prod(shape) > tensors.MAX_ELEMENTS:
        raise invalid(f"input '{clip(name)}': shape {clip(list(shape))} has more than "
                      "2**63 - 1 elements")


def declared_bytes(spec: InputSpec) -> int:
    """What an input will take once built: shape x item size; BYTES: its payload too."""
    count = math.prod(spec.shape)
    if spec.datatype == "BYTES":
        return count * tensors.OBJECT_ITEM_BYTES + spec.payload_bytes
    return count * np.dtype(tensors.DTYPES[DATATYPES[spec.datatype]][0]).itemsize


def _tensor_metadata(infos) -> list[dict]:
    return [{"name": name, "datatype": datatype_of(info.dtype),
             "shape": [d.size for d in info.tensor_shape.dim]}
            for name, info in sorted(infos.items())]


# ---- building request tensors ---------------------------------------------------------------

def empty_proto(dtype: int, shape: tuple[int, ...]) -> tensor_pb2.TensorProto:
    """A TensorProto of `dtype` and `shape`, no values yet."""
    return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in shape]))


def from_raw(name: str, raw: bytes, dtype: int, shape: tuple[int, ...]
             ) -> tensor_pb2.TensorProto:
    """Raw little-endian bytes (BYTES: length-prefixed elements), exactly prod(shape) values."""
    count = math.prod(shape)
    proto = empty_proto(dtype, shape)
    if dtype == types_pb2.DT_STRING:
        proto.string_val.extend(split_bytes(name, raw, count))
        return proto
    itemsize = np.dtype(tensors.DTYPES[dtype][0]).itemsize
    if len(raw) != count * itemsize:
        raise invalid(f"input '{clip(name)}': shape {list(shape)} of {datatype_of(dtype)} needs "
                      f"{count * itemsize} bytes. Received: {len(raw)} bytes")
    proto.tensor_content = bytes(raw)
    return proto


def split_bytes(name: str, raw: bytes, count: int) -> list[bytes]:
    """Length-prefixed BYTES elements: exactly `count` of them and nothing after."""
    items, offset, view = [], 0, memoryview(raw)
    while offset < len(raw):
        if len(items) == count or offset + 4 > len(raw):
            raise invalid(f"input '{clip(name)}': raw BYTES hold more than {count} elements or "
                          "a truncated length prefix")
        (size,) = BYTES_LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + size > len(raw):
            raise invalid(f"input '{clip(name)}': a raw BYTES element declares {size} bytes, "
                          f"only {len(raw) - offset} follow")
        items.append(bytes(view[offset:offset + size]))
        offset += size
    if len(items) != count:
        raise invalid(f"input '{clip(name)}': shape needs {count} BYTES elements. Received: "
                      f"{len(items)}")
    return items


def from_values(name: str, values: list, dtype: int, shape: tuple[int, ...]
                ) -> tensor_pb2.TensorProto:
    """A flat list of Python values (JSON data or gRPC typed contents), type-checked.

    No silent conversions: a bool is not a number, a float is not an integer, a string is not
    a number; integers must fit the datatype.
    """
    count = math.prod(shape)
    if len(values) != count:
        raise invalid(f"input '{clip(name)}': shape {list(shape)} needs {count} values. "
                      f"Received: {len(values)}")
    proto = empty_proto(dtype, shape)
    v2_type = datatype_of(dtype)
    if dtype == types_pb2.DT_STRING:
        if not all(isinstance(v, (str, bytes)) for v in values):
            raise invalid(f"input '{clip(name)}': BYTES values must be strings")
        proto.string_val.extend(v.encode() if isinstance(v, str) else v for v in values)
        return proto
    np_dtype = np.dtype(tensors.DTYPES[dtype][0])
    bad = next((v for v in values if not _fits_kind(v, dtype, np_dtype)), _NONE)
    if bad is not _NONE:
        raise invalid(f"input '{clip(name)}': {clip(repr(bad), 64)} is not a {v2_type} value")
    if np_dtype.kind in "iu" and values:
        info = np.iinfo(np_dtype)
        if min(values) < info.min or max(values) > info.max:
            raise invalid(f"input '{clip(name)}': a value does not fit {v2_type} "
                          f"({info.min}..{info.max})")
    proto.tensor_content = np.asarray(values, dtype=np_dtype).tobytes()
    return proto


_NONE = object()


def _fits_kind(value, dtype: int, np_dtype: np.dtype) -> bool:
    if dtype == types_pb2.DT_BOOL:
        return type(value) is bool
    if np_dtype.kind in "iu":
        return type(value) is int
    return type(value) in (int, float)


# ---- output encodings -----------------------------------------------------------------------

def raw_bytes(array: np.ndarray) -> bytes:
    """An output as raw little-endian bytes, row-major (BYTES: length-prefixed elements)."""
    if array.dtype == np.object_:
        return b"".join(BYTES_LENGTH.pack(len(v)) + v for v in (_as_bytes(x)
                                                                   for x in array.ravel()))
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _as_bytes(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def output_datatype(array: np.ndarray) -> str:
    """The V2 datatype of an output array."""
    if array.dtype == np.object_:
        return "BYTES"
    for name, dtype in DATATYPES.items():
        if dtype != types_pb2.DT_STRING and np.dtype(tensors.DTYPES[dtype][0]) == array.dtype:
            return name
    raise ServingStatusError(grpc.StatusCode.INTERNAL,
                             f"output dtype {array.dtype} has no V2 datatype")
