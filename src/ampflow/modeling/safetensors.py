"""The `.safetensors` format read and written with NumPy alone (no torch, no `safetensors` wheel).

The format (huggingface/safetensors, docs "Format"): an 8-byte little-endian unsigned header
length N, N bytes of a UTF-8 JSON object `{name: {"dtype", "shape", "data_offsets": [begin,
end]}, "__metadata__": {str: str}}`, then the data: each tensor's little-endian bytes,
row-major, at its offsets counted from the end of the header. The reader checks what the
`safetensors` package checks (offsets in range, contiguous, each range exactly shape × item
size, the data covering the buffer) so a file the reference refuses is refused here too, as one
`ModelConfigError` naming the file: a checkpoint a user points at is a configuration input
(exit 2), and reading it happens before any work starts.

BF16 has no NumPy dtype: it is returned as float32, widened exactly (a bfloat16 is the upper
half of a float32), so a bfloat16 checkpoint assigned to float32 variables is bit-exact.
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ampflow.errors import ModelConfigError

_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100_000_000  # the `safetensors` package's own limit
METADATA_KEY = "__metadata__"
BF16 = "BF16"

# the format's dtype names, as NumPy little-endian dtypes (BF16 is read as uint16, then widened)
_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    BF16: np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items() if name != BF16}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's header entry: the format's dtype name, its shape and its byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the file by name (read-only arrays; BF16 widened to float32)."""
    path = Path(path)
    data, entries, _ = _read(path)
    return {entry.name: _array(data, entry) for entry in entries}


def read_safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The header's `__metadata__` (free text, e.g. `{"format": "pt"}`), `{}` when absent."""
    return _read(Path(path))[2]


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> Path:
    """Write `tensors` as the `safetensors` package does, through a temp file and a rename.

    Sorted by name, the header space-padded to a multiple of 8 bytes; returns the path. The
    write side exists so a checkpoint made here (a test's, a later pretraining step's) is in
    the layout users download; BF16 is not written (NumPy has no such dtype).
    """
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        little = array.dtype.newbyteorder("<")
        if little not in _NAMES:
            raise ModelConfigError(
                f"write_safetensors takes tensors of {sorted(_NAMES.values())}. Received: "
                f"{name!r} of dtype {array.dtype}")
        blob = np.ascontiguousarray(array, dtype=little).tobytes()
        header[name] = {"dtype": _NAMES[little], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header = {METADATA_KEY: dict(metadata), **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _read(path: Path) -> tuple[memoryview, list[TensorEntry], dict[str, str]]:
    """The data section, the checked entries (by offset) and the metadata."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as e:
        raise ModelConfigError(
            f"Expected a safetensors file at {path}. Received: no such file") from e
    except OSError as e:
        raise ModelConfigError(f"Could not read the safetensors file {path}: {e.strerror}") from e
    header, start = _header(path, raw)
    data = memoryview(raw)[start:]
    metadata = header.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise _bad(path, "__metadata__ to map strings to strings", repr(metadata)[:200])
    entries = sorted((_entry(path, name, value) for name, value in header.items()),
                     key=lambda e: (e.begin, e.end))
    _check_layout(path, entries, len(data))
    return data, entries, metadata


def _header(path: Path, raw: bytes) -> tuple[dict, int]:
    """The parsed JSON header and where the data starts."""
    if len(raw) < _LENGTH_BYTES:
        raise _bad(path, "at least the 8-byte header length",
                   f"a file of {len(raw)} bytes (truncated?)")
    (length,) = struct.unpack("<Q", raw[:_LENGTH_BYTES])
    if length > MAX_HEADER_BYTES:
        raise _bad(path, f"a header of at most {MAX_HEADER_BYTES} bytes",
                   f"a header length of {length} (not a safetensors file?)")
    start = _LENGTH_BYTES + length
    if start > len(raw):
        raise _bad(path, f"a header of {length} bytes after the 8-byte length",
                   f"a file of {len(raw)} bytes: the header runs past the end (truncated?)")
    try:
        header = json.loads(raw[_LENGTH_BYTES:start].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, "a JSON object as the header", f"unparsable JSON ({e})") from e
    if not isinstance(header, dict):
        raise _bad(path, "a JSON object as the header", type(header).__name__)
    return header, start


def _entry(path: Path, name: str, value) -> TensorEntry:
    """One header entry, its fields checked: a known dtype, a shape, two ordered offsets."""
    if not isinstance(value, dict) or not {"dtype", "shape", "data_offsets"} <= value.keys():
        raise _bad(path, f"tensor {name!r} to have dtype, shape and data_offsets",
                   repr(value)[:200])
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in _DTYPES:
        raise _bad(path, f"tensor {name!r} to have a dtype in {sorted(_DTYPES)}",
                   f"dtype={dtype!r}")
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        raise _bad(path, f"tensor {name!r} to have a shape of non-negative integers",
                   f"shape={shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_natural, offsets))
            or offsets[0] > offsets[1]):
        raise _bad(path, f"tensor {name!r} to have data_offsets [begin, end] with "
                   "0 <= begin <= end", f"data_offsets={offsets!r}")
    entry = TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])
    expected = math.prod(entry.shape) * _DTYPES[dtype].itemsize
    if entry.end - entry.begin != expected:
        raise _bad(path, f"tensor {name!r} ({dtype} {list(shape)}) to span {expected} bytes",
                   f"data_offsets={offsets!r} ({entry.end - entry.begin} bytes)")
    return entry


def _check_layout(path: Path, entries: list[TensorEntry], data_bytes: int) -> None:
    """Contiguous from 0, no overlap, the last tensor ending where the file ends."""
    position = 0
    for entry in entries:
        if entry.end > data_bytes:
            raise _bad(path, f"tensor {entry.name!r} to end within the data's {data_bytes} "
                       "bytes", f"data_offsets=[{entry.begin}, {entry.end}] (truncated?)")
        if entry.begin != position:
            what = "overlaps the tensor before it" if entry.begin < position else "leaves a gap"
            raise _bad(path, f"tensor {entry.name!r} to start at byte {position} of the data",
                       f"data_offsets=[{entry.begin}, {entry.end}]: it {what}")
        position = entry.end
    if position != data_bytes:
        raise _bad(path, f"the tensors to cover the data's {data_bytes} bytes",
                   f"they end at byte {position}")


def _array(data: memoryview, entry: TensorEntry) -> np.ndarray:
    array = np.frombuffer(data[entry.begin:entry.end], dtype=_DTYPES[entry.dtype])
    if entry.dtype == BF16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.reshape(entry.shape)


def _natural(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _bad(path: Path, expected: str, received: str) -> ModelConfigError:
    return ModelConfigError(
        f"{path} is not a valid safetensors file: expected {expected}. Received: {received}")
