"""The Open Inference Protocol (KServe V2) over the core: one logic for REST and gRPC.

A V2 call names a model and an optional version *string*, and sends typed tensors
(`name`, `datatype` such as FP32/INT64/BYTES, `shape`, then the values in one of three
encodings: JSON `data`, gRPC typed `contents`, or raw little-endian bytes). `V2Protocol`:
- resolves the model and version (a number, or one of the model's version labels; anything
  unknown is NOT_FOUND, as the protocol says);
- hands each input to `InferenceCore.infer` as a `V2Input`: its datatype and shape checked as
  the wire requires, its size declared (shape x datatype, or the raw bytes sent for BYTES), and
  its array built only after the core has checked everything against the signature and the
  limits. Raw bytes become a numpy view of the request's own buffer (no copy); typed values
  are converted once. The core's output arrays are what the transports write back.
Transports (v2_rest.py, v2_grpc.py) turn their wire format into `V2Input`s and the core's
`InferResponse` back; nothing here knows a tensor name.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Sequence

import grpc
import numpy as np

from ampflow.serving.core import dtypes
from ampflow.serving.core.inference import (
    CallRecord,
    Declared,
    Dialect,
    InferenceCore,
    InferRequest,
    InferResponse,
)
from ampflow.serving.model_format import DEFAULT_SIGNATURE, parse_version_name
from ampflow.serving.models.servable import Servable
from ampflow.serving.status import ServingStatusError, clip, not_found
from ampflow.serving.status import invalid_argument as invalid

types = dtypes.types_pb2
# The protocol's tensor datatypes and TensorFlow's (BF16 has no numpy dtype here: refused).
DATATYPES: dict[str, int] = {
    "BOOL": types.DT_BOOL,
    "UINT8": types.DT_UINT8, "UINT16": types.DT_UINT16,
    "UINT32": types.DT_UINT32, "UINT64": types.DT_UINT64,
    "INT8": types.DT_INT8, "INT16": types.DT_INT16,
    "INT32": types.DT_INT32, "INT64": types.DT_INT64,
    "FP16": types.DT_HALF, "FP32": types.DT_FLOAT, "FP64": types.DT_DOUBLE,
    "BYTES": types.DT_STRING,
}
DATATYPE_OF: dict[int, str] = {dt: name for name, dt in DATATYPES.items()}
SIGNATURE_PARAMETER = "signature_name"  # a request parameter: which SignatureDef to run
BYTES_LENGTH = struct.Struct("<I")  # raw BYTES: each element is a 4-byte length, then bytes
SERVER_NAME = "ampflow"
EXTENSIONS = ("binary_tensor_data",)  # REST: raw tensor bytes after the JSON (Triton's)


def datatype_of(dtype: int) -> str:
    """The V2 name of a TensorFlow dtype (`DT_...` itself when V2 has none)."""
    return DATATYPE_OF.get(dtype, dtypes.dtype_name(dtype))


def _inputs_text(sent: set[str], expected: set[str]) -> str:
    return f"the model expects inputs {sorted(expected)}. Received: {clip(sorted(sent), 300)}"


V2_DIALECT = Dialect(type_name=datatype_of, inputs_text=_inputs_text, graph_shapes=False)


@dataclasses.dataclass(frozen=True)
class V2Input:
    """One input as sent: its declared name, datatype and shape, and how to build its array.

    `payload_bytes`: the bytes the client sent for it (counted for BYTES, whose decoded size
    is its payload); `make(dtype, shape)` returns the array, and is called only after the
    declared size has passed the limits. `longest`: BYTES only, the bytes of its longest
    element, or a function that reads it from raw length prefixes (called by the core once
    the element count has passed the limits).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    payload_bytes: int
    make: Callable[[int, tuple[int, ...]], np.ndarray]
    longest: int | Callable[[], int] = 0

    def declare(self, expected_dtype: int) -> Declared:
        """A known datatype and a valid shape, as the protocol requires; the decoded size."""
        if self.datatype not in DATATYPES:
            raise invalid(f"input '{clip(self.name)}': unknown datatype "
                          f"{clip(self.datatype)} (expected {datatype_of(expected_dtype)})")
        _check_shape(self.name, self.shape)
        measure = self.longest if callable(self.longest) else None
        return Declared(DATATYPES[self.datatype], self.shape, declared_bytes(self),
                        0 if measure else self.longest, measure)

    def build(self) -> np.ndarray:
        """The array of the declared datatype and shape."""
        return self.make(DATATYPES[self.datatype], self.shape)


class V2Protocol:
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
        return self.core.ready()

    def resolve(self, name: str, version: str) -> Servable:
        """The version a V2 (name, version) names; unknown model or version is NOT_FOUND."""
        if not name:
            raise invalid("a model name is required")
        number, label = parse_version(version)
        try:
            return self.core.resolve(name, number, label)
        except ServingStatusError as e:
            if label is not None and e.code == grpc.StatusCode.INVALID_ARGUMENT:
                raise not_found(f"model {clip(name)} has no version {clip(version)}") from e
            raise

    def knows_model(self, name: str) -> bool:
        """Whether `name` is a configured model (loaded or not)."""
        return self.core.knows_model(name)

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
            versions = [str(v) for v in self.core.available_versions(name)]
        return {"name": servable.model, "versions": versions, "platform": servable.platform,
                "inputs": _tensor_metadata(sig.inputs), "outputs": _tensor_metadata(sig.outputs)}

    # ---- inference ----------------------------------------------------------------------

    def infer(self, name: str, version: str, inputs: Sequence[V2Input],
              output_names: Sequence[str], signature: str = "",
              timeout_s: float | None = None) -> InferResponse:
        """Run the core on the declared inputs; the outputs asked for, as arrays."""
        sent = [spec.name for spec in inputs]
        if len(set(sent)) != len(sent):
            raise invalid(f"input names must be unique. Received: {clip(sent, 300)}")
        servable = self.resolve(name, version)
        return self.core.infer(InferRequest(name, signature=signature, inputs=inputs,
                                            outputs=output_names, servable=servable),
                               timeout_s, V2_DIALECT)


def record_names(record: CallRecord, name: str, version: str) -> None:
    """Name a V2 call's model and version in its metric record."""
    number = parse_version_name(version) if version else None
    record.names(name, number, version if version and number is None else None)


def parse_version(text: str) -> tuple[int | None, str | None]:
    """A V2 version string: "" = the latest, digits = a version number, else a version label."""
    if not text:
        return None, None
    number = parse_version_name(text)
    if number is not None:
        return number, None
    if text.isascii() and text.isdigit():  # digits past model_format.MAX_VERSION
        raise not_found(f"no version {clip(text)}")
    return None, text


def _check_shape(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) > dtypes.MAX_RANK:
        raise invalid(f"input '{clip(name)}': rank must be <= {dtypes.MAX_RANK}. "
                      f"Received: rank {len(shape)}")
    if any(d < 0 for d in shape):
        raise invalid(f"input '{clip(name)}': shape must not hold negative sizes. "
                      f"Received: {clip(list(shape))}")
    if math.prod(shape) > dtypes.MAX_ELEMENTS:
        raise invalid(f"input '{clip(name)}': shape {clip(list(shape))} has more than "
                      "2**63 - 1 elements")


def declared_bytes(spec: V2Input) -> int:
    """What an input will take once built: shape x item size; BYTES: its payload too."""
    count = math.prod(spec.shape)
    if spec.datatype == "BYTES":
        return count * dtypes.OBJECT_ITEM_BYTES + spec.payload_bytes
    return count * dtypes.numpy_dtype(DATATYPES[spec.datatype]).itemsize


def _tensor_metadata(infos) -> list[dict]:
    return [{"name": name, "datatype": datatype_of(info.dtype),
             "shape": [d.size for d in info.tensor_shape.dim]}
            for name, info in sorted(infos.items())]


# ---- building request arrays ----------------------------------------------------------------

def from_raw(name: str, raw, dtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw little-endian bytes (BYTES: length-prefixed elements), exactly prod(shape) values.

    Numbers are a read-only view of `raw` itself (bytes or a memoryview of the request body):
    the only copy is the one the model's runtime makes of its input.
    """
    count = math.prod(shape)
    if dtype == types.DT_STRING:
        return _object_array(split_bytes(name, raw, count), shape)
    np_dtype = dtypes.numpy_dtype(dtype).newbyteorder("<")
    if len(raw) != count * np_dtype.itemsize:
        raise invalid(f"input '{clip(name)}': shape {list(shape)} of {datatype_of(dtype)} needs "
                      f"{count * np_dtype.itemsize} bytes. Received: {len(raw)} bytes")
    return np.frombuffer(raw, dtype=np_dtype).reshape(shape)


def split_bytes(name: str, raw, count: int) -> list[bytes]:
    """Length-prefixed BYTES elements: exactly `count` of them and nothing after."""
    items, offset, view = [], 0, memoryview(raw)
    while offset < len(view):
        if len(items) == count or offset + 4 > len(view):
            raise invalid(f"input '{clip(name)}': raw BYTES hold more than {count} elements or "
                          "a truncated length prefix")
        (size,) = BYTES_LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + size > len(view):
            raise invalid(f"input '{clip(name)}': a raw BYTES element declares {size} bytes, "
                          f"only {len(view) - offset} follow")
        items.append(bytes(view[offset:offset + size]))
        offset += size
    if len(items) != count:
        raise invalid(f"input '{clip(name)}': shape needs {count} BYTES elements. Received: "
                      f"{len(items)}")
    return items


def string_sizes(values: list) -> list[int]:
    """The bytes each BYTES value will hold: UTF-8 of a JSON string, a gRPC value's length.

    An ASCII string's length is read without encoding it; a value of another type counts 0
    (`from_values` refuses it when the array is built).
    """
    sizes = []
    for value in values:
        if isinstance(value, bytes):
            sizes.append(len(value))
        elif isinstance(value, str):
            sizes.append(len(value) if value.isascii()
                         else len(value.encode("utf-8", "surrogatepass")))
        else:
            sizes.append(0)
    return sizes


def longest_raw_element(raw, count: int) -> int:
    """The longest of the first `count` length-prefixed BYTES elements, lengths only.

    Walks the 4-byte prefixes without copying an element; a truncated or overlong buffer
    stops the walk (`split_bytes` refuses it in words when the array is built).
    """
    longest, offset, view = 0, 0, memoryview(raw)
    for _ in range(count):
        if offset + 4 > len(view):
            break
        (size,) = BYTES_LENGTH.unpack_from(view, offset)
        longest = max(longest, min(size, len(view) - offset - 4))
        offset += 4 + size
    return longest


def from_values(name: str, values: list, dtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """A flat list of Python values (JSON data or gRPC typed contents), type-checked.

    No silent conversions: a bool is not a number, a float is not an integer, a string is not
    a number; integers must fit the datatype.
    """
    count = math.prod(shape)
    if len(values) != count:
        raise invalid(f"input '{clip(name)}': shape {list(shape)} needs {count} values. "
                      f"Received: {len(values)}")
    v2_type = datatype_of(dtype)
    if dtype == types.DT_STRING:
        if not all(isinstance(v, (str, bytes)) for v in values):
            raise invalid(f"input '{clip(name)}': BYTES values must be strings")
        try:
            items = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        except UnicodeEncodeError:  # a JSON lone surrogate escape such as "\ud800"
            raise invalid(f"input '{clip(name)}': a BYTES value is not valid Unicode (a lone "
                          "surrogate); send bytes that are not UTF-8 text as binary data"
                          ) from None
        return _object_array(items, shape)
    np_dtype = dtypes.numpy_dtype(dtype)
    bad = next((v for v in values if not _fits_kind(v, dtype, np_dtype)), _NONE)
    if bad is not _NONE:
        raise invalid(f"input '{clip(name)}': {clip(repr(bad), 64)} is not a {v2_type} value")
    if np_dtype.kind in "iu" and values:
        info = np.iinfo(np_dtype)
        if min(values) < info.min or max(values) > info.max:
            raise invalid(f"input '{clip(name)}': a value does not fit {v2_type} "
                          f"({info.min}..{info.max})")
    return np.asarray(values, dtype=np_dtype).reshape(shape)


def _object_array(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


_NONE = object()


def _fits_kind(value, dtype: int, np_dtype: np.dtype) -> bool:
    if dtype == types.DT_BOOL:
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
        if dtype != types.DT_STRING and dtypes.numpy_dtype(dtype) == array.dtype:
            return name
    raise ServingStatusError(grpc.StatusCode.INTERNAL,
                             f"output dtype {array.dtype} has no V2 datatype")
