"""TensorProto <-> numpy, strictly, with TF Serving's encodings and status codes (its wire).

Responses use what TF Serving returns (`Tensor::AsProtoTensorContent`): numeric tensors in
`tensor_content`, strings in `string_val`; `tf.make_tensor_proto` gives exactly that. Requests
are decoded here rather than with `tf.make_ndarray` so that every malformed tensor becomes an
INVALID_ARGUMENT that names the input, instead of an exception deep inside TensorFlow.
"""

from __future__ import annotations

import math

import grpc
import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2

from ampflow.serving.core.dtypes import (
    DTYPES,
    MAX_ELEMENTS,
    MAX_RANK,
    OBJECT_ITEM_BYTES,
    dtype_name,
)
from ampflow.serving.status import ServingStatusError, clip
from ampflow.serving.status import invalid_argument as _invalid


def declared_shape(name: str, proto: tensor_pb2.TensorProto) -> tuple[int, ...]:
    """The shape a request tensor declares, checked without allocating anything.

    Python integers do not overflow, so a shape whose element count exceeds int64 is
    INVALID_ARGUMENT (as TensorFlow's TensorShape says), never a wrapped-around count.
    """
    if proto.dtype not in DTYPES:
        raise _invalid(f"tensor parsing error: {clip(name)}: unsupported dtype "
                       f"{dtype_name(proto.dtype)}")
    if proto.tensor_shape.unknown_rank:
        raise _invalid(f"tensor parsing error: {clip(name)}: tensor_shape must be fully defined")
    rank = len(proto.tensor_shape.dim)
    if rank > MAX_RANK:
        raise _invalid(f"tensor parsing error: {clip(name)}: rank must be <= {MAX_RANK}. "
                       f"Received: rank {rank}")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise _invalid(f"tensor parsing error: {clip(name)}: negative dimension in shape "
                       f"{clip(list(shape))}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise _invalid(f"tensor parsing error: {clip(name)}: shape {clip(list(shape))} has "
                       "more than 2**63 - 1 elements")
    return shape


def decoded_bytes(proto: tensor_pb2.TensorProto, shape: tuple[int, ...]) -> int:
    """Bytes the decoded array of a (valid) declared shape takes, strings' payload included.

    A string tensor counts its bytes as TensorFlow will hold them: every string, and the last
    one again for each element a short `string_val` leaves to be filled with it (a model
    copies each element; an encoded-image batch is mostly payload). Counted from the proto's
    lengths, before anything is decoded.
    """
    np_dtype = DTYPES[proto.dtype][0]
    count = math.prod(shape)
    if np_dtype is not np.object_:
        return count * np.dtype(np_dtype).itemsize
    values = proto.string_val
    payload = sum(map(len, values))
    if 0 < len(values) < count:
        payload += (count - len(values)) * len(values[-1])
    return count * OBJECT_ITEM_BYTES + payload


def longest_string(proto: tensor_pb2.TensorProto) -> int:
    """Bytes of the longest element of a string tensor (0 for numbers), from `string_val`.

    Protobuf has parsed the request already, so this reads lengths only; no string is copied.
    """
    if proto.dtype != types_pb2.DT_STRING or not proto.string_val:
        return 0
    return max(map(len, proto.string_val))


def to_ndarray(name: str, proto: tensor_pb2.TensorProto, max_bytes: int = 0) -> np.ndarray:
    """Decode one request tensor; every inconsistency is INVALID_ARGUMENT naming `name`.

    `max_bytes` (0 = no limit) bounds the decoded array: a short value list that TensorFlow
    would repeat to fill a huge declared shape is refused with RESOURCE_EXHAUSTED before
    anything is allocated.
    """
    shape = declared_shape(name, proto)
    size = decoded_bytes(proto, shape)
    if max_bytes and size > max_bytes:
        raise ServingStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"tensor {clip(name)} of shape {clip(list(shape))} would decode to {size} bytes; "
            f"the limit is {max_bytes} bytes (--max-message-bytes)",
        )
    return decode_checked(name, proto, shape)


def decode_checked(name: str, proto: tensor_pb2.TensorProto,
                   shape: tuple[int, ...]) -> np.ndarray:
    """Decode a tensor whose `declared_shape` (and byte budget) the caller already checked.

    Numeric `tensor_content` becomes a read-only view of the request's bytes
    (`np.frombuffer`, no copy, native = little-endian order as on the wire); its length
    must be exactly what the shape needs.
    """
    np_dtype, field = DTYPES[proto.dtype]
    count = math.prod(shape)
    if proto.tensor_content and proto.dtype != types_pb2.DT_STRING:
        return _from_content(name, proto.tensor_content, np.dtype(np_dtype), shape, count)
    values = getattr(proto, field)
    return _from_values(name, values, proto.dtype, np_dtype, shape, count)


def _from_content(name: str, content: bytes, dtype: np.dtype, shape: tuple, count: int):
    expected = count * dtype.itemsize
    if len(content) != expected:
        raise _invalid(
            f"tensor parsing error: {clip(name)}: tensor_shape {list(shape)} needs {count} "
            f"{dtype.name} values ({expected} bytes) in tensor_content. Received: "
            f"{len(content)} bytes"
        )
    return np.frombuffer(content, dtype=dtype).reshape(shape)


def _from_values(name: str, values, dtype_enum: int, np_dtype, shape: tuple, count: int):
    """Typed repeated fields: TF fills a short list with its last value; longer is an error."""
    n = len(values)
    if n > count or (n == 0 and count > 0):
        raise _invalid(
            f"tensor parsing error: {clip(name)}: tensor_shape {list(shape)} needs {count} "
            f"values. Received: {n} values in {dtype_name(dtype_enum)} field"
        )
    if dtype_enum == types_pb2.DT_STRING:
        array = np.empty(n, dtype=object)
        array[:] = list(values)
    elif dtype_enum == types_pb2.DT_HALF:
        array = np.asarray(values, dtype=np.uint16).view(np.float16)
    else:
        array = np.asarray(values, dtype=np_dtype)
    if 0 < n < count:
        array = np.concatenate([array, np.repeat(array[-1:], count - n)])
    return array.reshape(shape)


# The numeric dtypes `tf.make_tensor_proto` writes to tensor_content when a tensor has more
# than one element (tensor_util._TENSOR_CONTENT_TYPES), and the typed field it uses for one
# element or none; native byte order only.
_CONTENT_DTYPES: dict[np.dtype, tuple[int, str]] = {
    np.dtype(np_dtype): (enum, DTYPES[enum][1]) for enum, np_dtype in (
        (types_pb2.DT_HALF, np.float16), (types_pb2.DT_FLOAT, np.float32),
        (types_pb2.DT_DOUBLE, np.float64), (types_pb2.DT_INT8, np.int8),
        (types_pb2.DT_INT16, np.int16), (types_pb2.DT_INT32, np.int32),
        (types_pb2.DT_INT64, np.int64), (types_pb2.DT_UINT8, np.uint8),
        (types_pb2.DT_UINT32, np.uint32), (types_pb2.DT_UINT64, np.uint64))}
_MAX_CONTENT_BYTES = 1 << 31  # make_tensor_proto refuses 2 GB and more


def to_proto(array, out: tensor_pb2.TensorProto | None = None) -> tensor_pb2.TensorProto:
    """Encode an output like TF Serving: `tensor_content` for numbers, `string_val` for bytes.

    Byte for byte what `tf.make_tensor_proto` writes; the common case (a numeric tensor of
    more than one element) is built here directly, ~10x faster than TensorFlow's generic
    converter, which stays in charge of every other case (strings, bool, single values).
    `out`: an empty TensorProto to fill (a response's output entry) instead of a new one.
    """
    array = np.asarray(array)
    proto = tensor_pb2.TensorProto() if out is None else out
    known = _CONTENT_DTYPES.get(array.dtype)
    if known is not None and array.nbytes < _MAX_CONTENT_BYTES:
        enum, field = known
        proto.dtype = enum
        proto.tensor_shape.SetInParent()  # present even for a scalar, as TensorFlow writes it
        dims = proto.tensor_shape.dim
        for size in array.shape:
            dims.add().size = size
        if array.size > 1:
            proto.tensor_content = array.tobytes()
        elif enum == types_pb2.DT_HALF:  # half_val holds the float16 bit patterns
            proto.half_val.extend(array.ravel().view(np.uint16).tolist())
        else:
            getattr(proto, field).extend(array.ravel().tolist())
        return proto
    import tensorflow as tf

    proto.CopyFrom(tf.make_tensor_proto(array))
    return proto
