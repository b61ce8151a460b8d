"""Helpers of the V2 (Open Inference Protocol) tests: a model of every datatype, HTTP and gRPC.

A uniquely named module: tests/ dirs share sys.path.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ECHO_MODEL = "echo"
# V2 datatype -> numpy dtype of every input of the echo model (name: lower-case datatype)
ECHO_DTYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_,
}


def write_echo_model(base: Path, version: int = 1, skip: tuple[str, ...] = ()) -> Path:
    """`<base>/<version>`: serving_default takes one [-1, 2] input per datatype, returns each.

    Input `fp32` comes back as output `fp32_out`, and so on, unchanged (tf.identity); the
    datatypes in `skip` are left out.
    """
    import tensorflow as tf

    specs = [tf.TensorSpec([None, 2], tf.as_dtype(np.dtype(dt)) if dt is not np.object_
                           else tf.string, name.lower())
             for name, dt in ECHO_DTYPES.items() if name not in skip]

    class Echo(tf.Module):
        @tf.function(input_signature=specs)
        def serve(self, *args):
            return {f"{spec.name}_out": tf.identity(arg) for spec, arg in
                    zip(specs, args, strict=True)}

    module = Echo()
    path = base / str(version)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def echo_values(rows: int = 2, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """One [rows, 2] array per datatype, with values at each integer type's edges."""
    out = {}
    for name, dt in ECHO_DTYPES.items():
        if name in skip:
            continue
        if dt is np.object_:
            array = np.array([[b"a", "\u00e9t\u00e9".encode()]] * rows, dtype=object)
        elif dt is np.bool_:
            array = np.array([[True, False]] * rows)
        elif np.dtype(dt).kind in "iu":
            info = np.iinfo(dt)
            array = np.array([[info.min, info.max]] * rows, dtype=dt)
        else:
            array = np.array([[1.5, -0.25]] * rows, dtype=dt)
        out[name.lower()] = array
    return out


def http(base_url: str, method: str, path: str, payload=None, raw: bytes | None = None,
         headers: dict | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one HTTP call; never raises for an HTTP error code."""
    data = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    request = urllib.request.Request(base_url + path, data=data, method=method,
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def v2_stub(channel, method: str):
    """A callable for `/inference.GRPCInferenceService/<method>` with our generated messages."""
    from ampflow.serving.protocols import grpc_predict_v2_pb2 as pb
    from ampflow.serving.protocols.v2_grpc import SERVICE

    output = SERVICE.methods_by_name[method].output_type.name
    return channel.unary_unary(f"/{SERVICE.full_name}/{method}",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=getattr(pb, output).FromString)
