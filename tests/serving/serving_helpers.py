"""Helpers shared by the serving tests (a uniquely named module: tests/ dirs share sys.path)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ports import free_port  # noqa: F401 - the tests import it from here (tests/ports.py says why)

from ampflow.serving.testing import install_version  # noqa: F401 - the tests import it from here

MODEL = os.environ.get("AMPFLOW_SERVING_MODEL", "ampflow")
EXTERNAL_TARGET = os.environ.get("AMPFLOW_SERVING_TARGET")
LOCAL_MAX_MESSAGE_BYTES = 1024 * 1024

local_only = pytest.mark.skipif(
    EXTERNAL_TARGET is not None,
    reason="needs to control the server (AMPFLOW_SERVING_TARGET points at an external one)",
)


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the conformance tests send requests, and what they compare against."""

    address: str
    model: str
    base_path: Path
    local: bool
    max_message_bytes: int | None


def predict_request(model: str, images, **spec):
    """A PredictRequest of `images` (None: no input) for `model`; `spec` sets ModelSpec fields.

    `version=3` sets the version, any other key (`version_label`, `signature_name`) the field
    of that name.
    """
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    if images is not None:
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
    return request


@contextlib.contextmanager
def running_server(config):
    """`ampflow serve`'s server in-process for `config`; stopped (0.5 s grace) on the way out."""
    from ampflow.serving.server import start_local_server

    server = start_local_server(config)
    try:
        yield server
    finally:
        server.stop(0.5)


def rest_json(server, path: str, payload) -> tuple[int, dict]:
    """(HTTP status, parsed JSON) of one REST POST to a running server's `rest_address`."""
    request = urllib.request.Request(f"http://{server.rest_address}{path}",
                                     data=json.dumps(payload).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
