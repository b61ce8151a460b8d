"""The NumPy safetensors reader against the `safetensors` package, on files written both ways.

Every bad file is refused by the reference too (so the reader is not stricter than what users'
tools write), and here it is one `ModelConfigError` line naming the file.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import safetensors
import safetensors.numpy

from ampflow.errors import ModelConfigError
from ampflow.modeling.safetensors import (
    read_safetensors,
    read_safetensors_metadata,
    write_safetensors,
)


def _tensors():
    rng = np.random.default_rng(7)
    return {
        "f64": rng.standard_normal((2, 3)),
        "embeddings.word_embeddings.weight": rng.standard_normal((5, 4)).astype(np.float32),
        "half": rng.standard_normal((3,)).astype(np.float16),
        "ids": np.arange(6, dtype=np.int64).reshape(3, 2) - 3,
        "i32": np.array([-(2**31), 2**31 - 1], dtype=np.int32),
        "i8": np.array([[-128, 127]], dtype=np.int8),
        "u8": np.array([0, 255], dtype=np.uint8),
        "mask": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_a_file_the_safetensors_package_wrote_reads_here_exactly(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(_tensors(), path, metadata={"format": "pt"})
    _assert_same(read_safetensors(path), _tensors())
    assert read_safetensors_metadata(path) == {"format": "pt"}


def test_a_file_written_here_reads_in_the_safetensors_package_exactly(tmp_path):
    path = write_safetensors(tmp_path / "model.safetensors", _tensors(), {"format": "np"})
    _assert_same(safetensors.numpy.load_file(path), _tensors())
    with safetensors.safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "np"}
    assert read_safetensors_metadata(path) == {"format": "np"}


def test_a_big_endian_array_is_written_little_endian(tmp_path):
    values = np.array([1.5, -2.25, 3e-5], dtype=">f4")
    path = write_safetensors(tmp_path / "be.safetensors", {"x": values})
    np.testing.assert_array_equal(safetensors.numpy.load_file(path)["x"], values)


def test_bfloat16_reads_as_float32_widened_exactly(tmp_path):
    import safetensors.tensorflow
    import tensorflow as tf

    values = tf.constant([[1.0, -2.5e-3, 3.0e38], [65504.0, 1e-40, -0.0]], tf.bfloat16)
    path = tmp_path / "bf16.safetensors"
    safetensors.tensorflow.save_file({"w": values}, path)
    got = read_safetensors(path)["w"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32),
                                  tf.cast(values, tf.float32).numpy().view(np.uint32))


def test_a_dtype_the_format_has_no_name_for_is_refused_on_write(tmp_path):
    with pytest.raises(ModelConfigError, match=r"Received: 'c' of dtype complex64"):
        write_safetensors(tmp_path / "c.safetensors", {"c": np.zeros(2, np.complex64)})
    assert list(tmp_path.iterdir()) == []


# ---- every way a file can be bad: one line naming the file, refused by the reference too -----

def _raw(header: dict, data: bytes, *, length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def _good(shape=(2, 3)) -> tuple[dict, bytes]:
    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    b = np.arange(4, dtype=np.int64)
    header = {"a": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, a.nbytes]},
              "b": {"dtype": "I64", "shape": [4], "data_offsets": [a.nbytes, a.nbytes + 32]}}
    return header, a.tobytes() + b.tobytes()


def _with(entry: str, **fields) -> bytes:
    header, data = _good()
    header[entry] = {**header[entry], **fields}
    return _raw(header, data)


BAD_FILES = {
    "shorter than the length": (lambda: b"\x10\x00\x00", "the 8-byte header length"),
    "header past the end": (lambda: _raw(*_good(), length=10_000),
                            "the header runs past the end"),
    "header not JSON": (lambda: struct.pack("<Q", 4) + b"{no}", "a JSON object as the header"),
    "header a list": (lambda: _raw([], b""), "a JSON object as the header"),  # type: ignore
    "data truncated": (lambda: _raw(*_good())[:-5], "'b' to end within the data's 51 bytes"),
    "offsets out of range": (lambda: _with("b", data_offsets=[24, 24 + 32 + 8]),
                             "'b' (I64 [4]) to span 32 bytes"),
    "offsets overlapping": (lambda: _with("b", data_offsets=[16, 48]), "it overlaps"),
    "offsets reversed": (lambda: _with("a", data_offsets=[24, 0]), "0 <= begin <= end"),
    "a gap": (lambda: _raw(*_good()) + b"\0" * 8, "to cover the data's 64 bytes"),
    "unknown dtype": (lambda: _with("a", dtype="F8_E4M3X"), "dtype='F8_E4M3X'"),
    "shape times itemsize": (lambda: _with("a", shape=[2, 4]), "'a' (F32 [2, 4]) to span 32"),
    "negative dimension": (lambda: _with("a", shape=[-2, -3]), "non-negative integers"),
    "missing field": (lambda: _raw({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4),
                      "dtype, shape and data_offsets"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_one_line_naming_it_and_the_reference_refuses_it_too(case, tmp_path):
    make, expected = BAD_FILES[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(make())
    with pytest.raises(Exception):  # noqa: B017 (the reference's own error types vary)
        safetensors.numpy.load_file(path)
    with pytest.raises(ModelConfigError) as caught:
        read_safetensors(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path} is not a valid safetensors file: expected ")
    assert "Received: " in message
    assert expected in message
    assert caught.value.exit_code == 2


def test_a_missing_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "model.safetensors"
    with pytest.raises(ModelConfigError,
                       match=rf"^Expected a safetensors file at {path}\. Received: no such file$"):
        read_safetensors(path)


def test_the_good_file_the_bad_ones_start_from_reads(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(_raw(*_good()))
    got = read_safetensors(path)
    np.testing.assert_array_equal(got["a"], np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(got["b"], np.arange(4))
    _assert_same(got, safetensors.numpy.load_file(path))
