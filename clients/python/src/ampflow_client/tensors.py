"""numpy <-> TensorProto without TensorFlow, as `tf.make_tensor_proto` / `tf.make_ndarray`.

`make_tensor_proto(array)` writes what TensorFlow writes: numbers in `tensor_content` (raw
little-endian bytes) when the tensor has more than one element, else in the typed field
(`float_val`, `int_val`, `half_val` for float16/bfloat16 bit patterns, ...); bool always in
`bool_val`; strings in `string_val`. `make_ndarray(proto)` reads any of those forms,
including TF Serving's short `*_val` lists that repeat their last value to fill the shape
(one value for a whole tensor: the scalar broadcast).

bfloat16: numpy has no such type. With `ml_dtypes` installed (TensorFlow's own bfloat16),
arrays of `ml_dtypes.bfloat16` go both ways. Without it, `make_tensor_proto(a, "bfloat16")`
rounds float32 to bfloat16 (to nearest even, as TensorFlow does), and `make_ndarray` returns a
bfloat16 tensor as float32, which holds every bfloat16 value exactly.
"""

from __future__ import annotations

import math

import numpy as np

from ampflow_client._proto.tensorflow.core.framework import tensor_pb2, types_pb2

try:  # optional: TensorFlow's bfloat16 numpy type
    from ml_dtypes import bfloat16 as _ML_BFLOAT16
except ImportError:  # pragma: no cover - depends on the environment
    _ML_BFLOAT16 = None

TensorProto = tensor_pb2.TensorProto

# DataType -> (numpy dtype, typed value field)
_BY_ENUM: dict[int, tuple[np.dtype | None, str]] = {
    types_pb2.DT_FLOAT: (np.dtype(np.float32), "float_val"),
    types_pb2.DT_DOUBLE: (np.dtype(np.float64), "double_val"),
    types_pb2.DT_HALF: (np.dtype(np.float16), "half_val"),
    types_pb2.DT_BFLOAT16: (None, "half_val"),
    types_pb2.DT_INT8: (np.dtype(np.int8), "int_val"),
    types_pb2.DT_INT16: (np.dtype(np.int16), "int_val"),
    types_pb2.DT_INT32: (np.dtype(np.int32), "int_val"),
    types_pb2.DT_INT64: (np.dtype(np.int64), "int64_val"),
    types_pb2.DT_UINT8: (np.dtype(np.uint8), "int_val"),
    types_pb2.DT_UINT16: (np.dtype(np.uint16), "int_val"),
    types_pb2.DT_UINT32: (np.dtype(np.uint32), "uint32_val"),
    types_pb2.DT_UINT64: (np.dtype(np.uint64), "uint64_val"),
    types_pb2.DT_BOOL: (np.dtype(np.bool_), "bool_val"),
    types_pb2.DT_STRING: (np.dtype(object), "string_val"),
}
_BY_NUMPY = {dtype: enum for enum, (dtype, _) in _BY_ENUM.items()
             if dtype is not None and dtype.kind != "O"}
# What TensorFlow writes to tensor_content (tensor_util._TENSOR_CONTENT_TYPES): not bool,
# strings or uint16 (those go in their typed fields at every size).
_CONTENT = {e for e in _BY_ENUM
            if e not in (types_pb2.DT_BOOL, types_pb2.DT_STRING, types_pb2.DT_UINT16)}
_NAMES = {"bfloat16": types_pb2.DT_BFLOAT16, "string": types_pb2.DT_STRING,
          "bytes": types_pb2.DT_STRING}


def dtype_enum(dtype) -> int:
    """The TensorFlow DataType of a numpy dtype (or "bfloat16"/"string"/"bytes")."""
    if isinstance(dtype, str) and dtype in _NAMES:
        return _NAMES[dtype]
    if _ML_BFLOAT16 is not None and np.dtype(dtype) == np.dtype(_ML_BFLOAT16):
        return types_pb2.DT_BFLOAT16
    np_dtype = np.dtype(dtype)
    if np_dtype.kind in "OSU":
        return types_pb2.DT_STRING
    if np_dtype.newbyteorder("=") in _BY_NUMPY:
        return _BY_NUMPY[np_dtype.newbyteorder("=")]
    raise TypeError(f"dtype must be one a TensorProto carries (float16/32/64, bfloat16, "
                    f"int8..64, uint8..64, bool, bytes). Received: {np_dtype}")


def numpy_dtype(enum: int) -> np.dtype:
    """The numpy dtype of a DataType (bfloat16: ml_dtypes' if installed, else float32)."""
    if enum == types_pb2.DT_BFLOAT16:
        return np.dtype(_ML_BFLOAT16) if _ML_BFLOAT16 is not None else np.dtype(np.float32)
    if enum not in _BY_ENUM:
        raise TypeError(f"DataType {_name(enum)} has no numpy type in this client")
    return _BY_ENUM[enum][0]


def _name(enum: int) -> str:
    try:
        return types_pb2.DataType.Name(enum)
    except ValueError:
        return str(enum)


def as_array(value) -> np.ndarray:
    """`value` as an array; a list of bytes/str becomes an object array, so no NUL is lost."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (bytes, str)):
        array = np.empty((), dtype=object)
        array[()] = value
        return array
    if isinstance(value, (list, tuple)) and value and _all_text(value):
        array = np.empty(_dense_shape(value), dtype=object)
        array[...] = _nested(value)
        return array
    return np.asarray(value)


def _all_text(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_all_text(v) for v in value)
    return isinstance(value, (bytes, bytearray, str))


def _dense_shape(value) -> tuple[int, ...]:
    shape = []
    while isinstance(value, (list, tuple)):
        shape.append(len(value))
        value = value[0] if value else None
    return tuple(shape)


def _nested(value):
    if isinstance(value, (list, tuple)):
        return [_nested(v) for v in value]
    return bytes(value) if isinstance(value, bytearray) else value


def _bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (NaN stays a quiet NaN)."""
    if _ML_BFLOAT16 is not None and array.dtype == np.dtype(_ML_BFLOAT16):
        return array.view(np.uint16)
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(array.astype(np.float32))
    return np.where(nan, ((bits >> 16) | 0x0040).astype(np.uint16), rounded)


def make_tensor_proto(values, dtype=None, shape=None) -> tensor_pb2.TensorProto:
    """A TensorProto of `values`, encoded as `tf.make_tensor_proto` encodes it.

    `dtype`: a numpy dtype, "bfloat16" or "string"; default: the array's own (float64 and
    int64 kept as they are: pass numpy arrays of the dtype the model takes). `shape`: the
    declared shape, for a single value broadcast to it (TF Serving fills the rest).
    """
    array = as_array(values)
    enum = dtype_enum(array.dtype if dtype is None else dtype)
    proto = tensor_pb2.TensorProto(dtype=enum)
    proto.tensor_shape.SetInParent()  # present even for a scalar, as TensorFlow writes it
    dims = array.shape if shape is None else tuple(int(d) for d in shape)
    for d in dims:
        proto.tensor_shape.dim.add().size = d
    count = math.prod(dims)
    if array.size > count:
        raise ValueError(f"values must have at most {count} elements for shape {list(dims)}. "
                         f"Received: {array.size}")
    if enum == types_pb2.DT_STRING:
        flat = array.ravel()
        proto.string_val.extend(v.encode() if isinstance(v, str) else bytes(v) for v in flat)
        return proto
    if enum == types_pb2.DT_BFLOAT16:
        bits = _bfloat16_bits(array).ravel()
        if array.size == count and count > 1:
            proto.tensor_content = bits.astype("<u2").tobytes()
        else:
            proto.half_val.extend(bits.astype(np.int32).tolist())
        return proto
    np_dtype, field = _BY_ENUM[enum]
    array = np.asarray(array, dtype=np_dtype)
    if enum in _CONTENT and array.size == count and count > 1:
        proto.tensor_content = array.astype(np_dtype.newbyteorder("<")).tobytes()
        return proto
    flat = array.ravel()
    if enum == types_pb2.DT_HALF:
        getattr(proto, field).extend(flat.view(np.uint16).astype(np.int32).tolist())
    else:
        getattr(proto, field).extend(flat.tolist())
    return proto


def make_ndarray(proto: tensor_pb2.TensorProto) -> np.ndarray:
    """The numpy array a TensorProto holds, in any of its encodings (as `tf.make_ndarray`)."""
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    count = math.prod(shape)
    enum = proto.dtype
    if enum not in _BY_ENUM:
        raise TypeError(f"TensorProto dtype {_name(enum)} is not supported by this client "
                        "(float16/32/64, bfloat16, int8..64, uint8..64, bool, string)")
    field = _BY_ENUM[enum][1]
    if enum == types_pb2.DT_STRING:
        values = list(proto.string_val)
        if 0 < len(values) < count:
            values += [values[-1]] * (count - len(values))
        elif not values:
            values = [b""] * count
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.reshape(shape)
    if enum == types_pb2.DT_BFLOAT16:
        if proto.tensor_content:
            bits = np.frombuffer(proto.tensor_content, dtype="<u2").astype(np.uint16)
        else:
            bits = _fill(np.asarray(proto.half_val, dtype=np.int32).astype(np.uint16), count)
        return _from_bfloat16_bits(bits).reshape(shape)
    np_dtype = _BY_ENUM[enum][0]
    if proto.tensor_content:
        return np.frombuffer(proto.tensor_content,
                             dtype=np_dtype.newbyteorder("<")).astype(np_dtype).reshape(shape)
    values = getattr(proto, field)
    if enum == types_pb2.DT_HALF:
        array = np.asarray(values, dtype=np.int32).astype(np.uint16).view(np.float16)
    else:
        array = np.asarray(values, dtype=np_dtype)
    return _fill(array, count).reshape(shape)


def _fill(array: np.ndarray, count: int) -> np.ndarray:
    """TensorFlow's rule: a short list repeats its last value; an empty one means zeros."""
    if array.size == 0:
        return np.zeros(count, dtype=array.dtype)
    if array.size < count:
        return np.concatenate([array, np.repeat(array[-1:], count - array.size)])
    if array.size > count:
        raise ValueError(f"TensorProto holds {array.size} values for a shape of {count} "
                         "elements")
    return array


def _from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    if _ML_BFLOAT16 is not None:
        return bits.view(_ML_BFLOAT16)
    return (bits.astype(np.uint32) << 16).view(np.float32)
