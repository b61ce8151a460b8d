"""TensorProto <-> numpy, strictly, with TF Serving's encodings and status codes.

Responses use what TF Serving returns (`Tensor::AsProtoTensorContent`): numeric tensors in
`tensor_content`, strings in `string_val`; `tf.make_tensor_proto` gives exactly that. Requests
are decoded here rather than with `tf.make_ndarray` so that every malformed tensor becomes an
INVALID_ARGUMENT that names the input, instead of an exception deep inside TensorFlow.
"""

from __future__ import annotations

import grpc
import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2

from ampflow.serving.model_registry import ServingStatusError

# dtype enum -> (numpy dtype, typed repeated field)
_DTYPES: dict[int, tuple[type, str]] = {
    types_pb2.DT_FLOAT: (np.float32, "float_val"),
    types_pb2.DT_DOUBLE: (np.float64, "double_val"),
    types_pb2.DT_INT32: (np.int32, "int_val"),
    types_pb2.DT_INT16: (np.int16, "int_val"),
    types_pb2.DT_INT8: (np.int8, "int_val"),
    types_pb2.DT_UINT8: (np.uint8, "int_val"),
    types_pb2.DT_UINT16: (np.uint16, "int_val"),
    types_pb2.DT_INT64: (np.int64, "int64_val"),
    types_pb2.DT_UINT32: (np.uint32, "uint32_val"),
    types_pb2.DT_UINT64: (np.uint64, "uint64_val"),
    types_pb2.DT_BOOL: (np.bool_, "bool_val"),
    types_pb2.DT_HALF: (np.float16, "half_val"),
    types_pb2.DT_STRING: (np.object_, "string_val"),
}


def dtype_name(dtype: int) -> str:
    """`DT_FLOAT`-style name of a DataType enum value."""
    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:
        return f"DataType({dtype})"


def _invalid(message: str) -> ServingStatusError:
    return ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, message)


def to_ndarray(name: str, proto: tensor_pb2.TensorProto) -> np.ndarray:
    """Decode one request tensor; every inconsistency is INVALID_ARGUMENT naming `name`."""
    if proto.dtype not in _DTYPES:
        raise _invalid(f"tensor parsing error: {name}: unsupported dtype {dtype_name(proto.dtype)}")
    np_dtype, field = _DTYPES[proto.dtype]
    if proto.tensor_shape.unknown_rank:
        raise _invalid(f"tensor parsing error: {name}: tensor_shape must be fully defined")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise _invalid(f"tensor parsing error: {name}: negative dimension in shape {list(shape)}")
    count = int(np.prod(shape, dtype=np.int64))
    if proto.tensor_content and proto.dtype != types_pb2.DT_STRING:
        return _from_content(name, proto.tensor_content, np.dtype(np_dtype), shape, count)
    values = getattr(proto, field)
    return _from_values(name, values, proto.dtype, np_dtype, shape, count)


def _from_content(name: str, content: bytes, dtype: np.dtype, shape: tuple, count: int):
    expected = count * dtype.itemsize
    if len(content) != expected:
        raise _invalid(
            f"tensor parsing error: {name}: tensor_shape {list(shape)} needs {count} "
            f"{dtype.name} values ({expected} bytes) in tensor_content. Received: "
            f"{len(content)} bytes"
        )
    return np.frombuffer(content, dtype=dtype).reshape(shape)


def _from_values(name: str, values, dtype_enum: int, np_dtype, shape: tuple, count: int):
    """Typed repeated fields: TF fills a short list with its last value; longer is an error."""
    n = len(values)
    if n > count or (n == 0 and count > 0):
        raise _invalid(
            f"tensor parsing error: {name}: tensor_shape {list(shape)} needs {count} values. "
            f"Received: {n} values in {dtype_name(dtype_enum)} field"
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


def to_proto(array) -> tensor_pb2.TensorProto:
    """Encode an output like TF Serving: `tensor_content` for numbers, `string_val` for bytes."""
    import tensorflow as tf

    return tf.make_tensor_proto(np.asarray(array))


def check_against_signature(name: str, array: np.ndarray, info) -> None:
    """Check dtype and shape of one input against its signature `TensorInfo`."""
    expected_dtype = info.dtype
    received = _dtype_of(array)
    if received != expected_dtype:
        raise _invalid(
            f"input '{name}' must be {dtype_name(expected_dtype)}. Received: {dtype_name(received)}"
        )
    if info.tensor_shape.unknown_rank:
        return
    dims = [d.size for d in info.tensor_shape.dim]
    if array.ndim != len(dims) or any(
            e >= 0 and e != r for e, r in zip(dims, array.shape, strict=True)):
        raise _invalid(
            f"input '{name}' must have shape {dims} (-1 = any size; the first dimension is the "
            f"batch). Received: shape {list(array.shape)}"
        )
    if dims and dims[0] == -1 and array.shape[0] == 0:
        raise _invalid(f"input '{name}' must have a batch size >= 1. Received: batch size 0")


def _dtype_of(array: np.ndarray) -> int:
    if array.dtype == np.object_:
        return types_pb2.DT_STRING
    for enum_value, (np_dtype, _field) in _DTYPES.items():
        if np_dtype is not np.object_ and array.dtype == np.dtype(np_dtype):
            return enum_value
    return types_pb2.DT_INVALID
