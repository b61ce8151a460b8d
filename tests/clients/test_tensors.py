"""numpy <-> TensorProto of the client equals TensorFlow's on a corpus of arrays."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from ampflow_client import tensors
from ampflow_client._proto.tensorflow.core.framework import tensor_pb2 as client_tensor_pb2
from tensorflow.core.framework import tensor_pb2 as tf_tensor_pb2

NUMERIC = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.int16, np.int32,
           np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]
SHAPES = [(), (1,), (0,), (3, 0, 2), (2, 3), (4, 5, 1), (1, 1)]


def _corpus(dtype):
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        size = int(np.prod(shape))
        if dtype is np.bool_:
            values = rng.integers(0, 2, size).astype(bool)
        elif np.issubdtype(np.dtype(dtype), np.integer):
            info = np.iinfo(dtype)
            values = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
            if size >= 2:
                values[:2] = [info.min, info.max]
        else:
            values = (rng.standard_normal(size) * 1e3).astype(dtype)
            if size >= 4:
                values[:4] = np.array([np.inf, -np.inf, -0.0, 1e-3]).astype(dtype)
        yield np.asarray(values, dtype=dtype).reshape(shape)


def _to_tf(proto) -> tf_tensor_pb2.TensorProto:
    return tf_tensor_pb2.TensorProto.FromString(proto.SerializeToString())


def _to_client(proto) -> client_tensor_pb2.TensorProto:
    return client_tensor_pb2.TensorProto.FromString(proto.SerializeToString())


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_make_tensor_proto_numeric_equals_tensorflow(dtype):
    for array in _corpus(dtype):
        ours = tensors.make_tensor_proto(array)
        theirs = tf.make_tensor_proto(array)
        assert _to_tf(ours) == theirs, (array.shape, ours, theirs)
        # and both directions of decoding agree, bit for bit
        _assert_same_bits(tensors.make_ndarray(_to_client(theirs)), tf.make_ndarray(theirs))
        back = tensors.make_ndarray(ours)
        assert back.dtype == array.dtype and back.shape == array.shape


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_make_ndarray_typed_fields_and_scalar_broadcast_equal_tensorflow(dtype):
    """TF Serving's forms: every value in *_val, or one value for the whole shape."""
    for array in _corpus(dtype):
        if array.size == 0:
            continue
        for shape in (array.shape, (2, 3)):
            values = array.ravel() if shape == array.shape else array.ravel()[:1]
            theirs = tf.make_tensor_proto(values, shape=shape) if values.size > 1 else \
                tf.make_tensor_proto(values.reshape(()), shape=shape)
            theirs.ClearField("tensor_content")
            field = {np.float16: "half_val"}.get(dtype)
            if field is None and theirs.ByteSize() and not _has_values(theirs):
                continue
            ours = tensors.make_ndarray(_to_client(theirs))
            _assert_same_bits(ours, tf.make_ndarray(theirs))


def _assert_same_bits(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert np.ascontiguousarray(ours).tobytes() == np.ascontiguousarray(theirs).tobytes()


def _has_values(proto) -> bool:
    return any(len(getattr(proto, f)) for f in ("half_val", "float_val", "double_val",
                                                 "int_val", "int64_val", "uint32_val",
                                                 "uint64_val", "bool_val"))


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_make_tensor_proto_broadcast_shape_equals_tensorflow(dtype):
    one = next(a for a in _corpus(dtype) if a.shape == (1,))
    ours = tensors.make_tensor_proto(one[0], shape=(2, 3))
    theirs = tf.make_tensor_proto(one[0], shape=(2, 3))
    assert _to_tf(ours) == theirs
    np.testing.assert_array_equal(tensors.make_ndarray(ours), tf.make_ndarray(theirs))


@pytest.mark.parametrize("values", [
    [b"a", b"\x00bc\x00", b""],
    [[b"x", b"y"], [b"\xff\xd8\xff", b"z\x00"]],
    [b"only"],
], ids=["flat", "2d", "one"])
def test_strings_equal_tensorflow(values):
    ours = tensors.make_tensor_proto(values)
    theirs = tf.make_tensor_proto(values)
    assert _to_tf(ours) == theirs
    back = tensors.make_ndarray(ours)
    assert back.dtype == object
    np.testing.assert_array_equal(back, tf.make_ndarray(theirs))


def test_string_scalar_and_broadcast_equal_tensorflow():
    for value, shape in ((b"abc", None), (b"abc", (2, 2))):
        ours = tensors.make_tensor_proto(value, shape=shape)
        theirs = tf.make_tensor_proto(value, shape=shape)
        assert _to_tf(ours) == theirs
        np.testing.assert_array_equal(tensors.make_ndarray(ours), tf.make_ndarray(theirs))


def test_bfloat16_without_ml_dtypes_rounds_like_tensorflow(monkeypatch):
    """No ml_dtypes: float32 in, TensorFlow's bfloat16 bits on the wire, float32 back."""
    monkeypatch.setattr(tensors, "_ML_BFLOAT16", None)
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.standard_normal(64).astype(np.float32) * 100,
                             np.array([np.inf, -np.inf, 0.0, -0.0, 1.00390625, 1.01171875,
                                       3.4e38, 1e-40], np.float32)])
    ours = tensors.make_tensor_proto(values, dtype="bfloat16")
    theirs = tf.make_tensor_proto(values.astype(ml_dtypes.bfloat16))
    assert _to_tf(ours) == theirs
    np.testing.assert_array_equal(tensors.make_ndarray(ours),
                                  values.astype(ml_dtypes.bfloat16).astype(np.float32))
    nan = tensors.make_ndarray(tensors.make_tensor_proto(np.float32([np.nan, 1]), "bfloat16"))
    assert np.isnan(nan[0]) and nan[1] == 1


def test_unsupported_dtype_is_refused_with_a_clear_message():
    with pytest.raises(TypeError, match="complex64"):
        tensors.make_tensor_proto(np.zeros(2, np.complex64))
