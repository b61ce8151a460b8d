"""The tensor vocabulary every protocol maps to: TensorFlow's dtypes, numpy's, the shape rules.

A request's inputs are checked against a SignatureDef in TensorFlow's terms (`DT_FLOAT`, a
shape with -1 for any size) whatever protocol brought them; each protocol names a dtype in its
own words when it refuses one (`type_name`: `DT_FLOAT` for TF Serving, `FP32` for V2).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tensorflow.core.framework import types_pb2

from ampflow.serving.status import clip
from ampflow.serving.status import invalid_argument as _invalid

# dtype enum -> (numpy dtype, TensorProto's typed repeated field)
DTYPES: dict[int, tuple[type, str]] = {
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
MAX_RANK = 254  # TensorShape::MaxDimensions() in TensorFlow
MAX_ELEMENTS = 2 ** 63 - 1  # TensorShape's limit on the element count
OBJECT_ITEM_BYTES = 8  # one pointer per string element of an object array


def dtype_name(dtype: int) -> str:
    """`DT_FLOAT`-style name of a DataType enum value."""
    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:
        return f"DataType({dtype})"


def numpy_dtype(dtype: int) -> np.dtype:
    """The numpy dtype of a (supported) DataType enum value."""
    return np.dtype(DTYPES[dtype][0])


def check_against_signature(name: str, dtype: int, shape: tuple[int, ...], info,
                            max_rows: int = 0,
                            type_name: Callable[[int], str] = dtype_name, *,
                            shapes: bool = True) -> None:
    """Check a declared dtype and shape against the signature, before decoding.

    Also the rows (first dimension) of a batched input against `max_rows` (0 = no cap), and
    an empty batch. `shapes=False` (TF Serving's Predict): the graph decides the shape, so
    only the dtype and the rows are checked; the rows of any input sent with at least one
    dimension to a signature whose first dimension is the batch, whatever its rank.
    """
    if dtype != info.dtype:
        raise _invalid(
            f"input '{clip(name)}' must be {type_name(info.dtype)}. Received: {type_name(dtype)}"
        )
    if info.tensor_shape.unknown_rank:
        return
    dims = [d.size for d in info.tensor_shape.dim]
    if shapes and (len(shape) != len(dims) or any(
            e >= 0 and e != r for e, r in zip(dims, shape, strict=True))):
        raise _invalid(
            f"input '{clip(name)}' must have shape {dims} (-1 = any size; the first dimension "
            f"is the batch). Received: shape {clip(list(shape), 200)}"
        )
    if dims and dims[0] == -1 and shape:
        if shape[0] == 0:
            raise _invalid(f"input '{clip(name)}' must have a batch size >= 1. Received: batch "
                           "size 0")
        if max_rows and shape[0] > max_rows:
            raise _invalid(
                f"input '{clip(name)}' has batch size {shape[0]}; this server takes at most "
                f"{max_rows} rows per request (--max-request-batch-size)"
            )
