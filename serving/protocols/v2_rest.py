"""The Open Inference Protocol's (KServe V2) REST API, on the TF Serving REST port.

- `GET /v2/health/live`, `/v2/health/ready` (`{"live"|"ready": true}`; not ready: 503);
- `GET /v2` (server metadata), `/v2/models/{m}[/versions/{v}]` (model metadata);
- `GET /v2/models/{m}[/versions/{v}]/ready` (200 when ready, 400 when not, 404 unknown model);
- `POST /v2/models/{m}[/versions/{v}]/infer` with JSON tensors, and Triton's binary tensor data
  extension: when the `Inference-Header-Content-Length` header is set, the body is that many
  bytes of JSON followed by the raw bytes of every input whose `parameters.binary_data_size`
  says how many are its own; outputs asked with `parameters.binary_data` (or all, with the
  request parameter `binary_data_output`) come back the same way. tritonclient's HTTP client
  sends and asks for binary data by default, so without the extension it would fail unless
  every call said `binary_data=False`.
Errors are `{"error": "..."}` with the HTTP code of the gRPC code (as the v1 API).
"""

from __future__ import annotations

import json
import logging
import math
import re
import urllib.parse

import grpc

from ampflow.serving.core.inference import CallRecord, Observer
from ampflow.serving.protocols import v2 as v2_protocol
from ampflow.serving.protocols.rest import RestDoor
from ampflow.serving.protocols.v2 import V2Input, V2Protocol
from ampflow.serving.status import ServingStatusError, clip, not_found
from ampflow.serving.status import invalid_argument as invalid
from ampflow.serving.transport.http import REST_TIMEOUT_S, Reply, dumps, json_reply

log = logging.getLogger(__name__)

HEADER_LENGTH = "inference-header-content-length"
_MODEL_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?")


class V2RestHandler(RestDoor):
    """One V2 HTTP request in, (status, body, headers) out; never raises (RestDoor.handle)."""

    def __init__(self, v2: V2Protocol, observe: Observer | None = None,
                 timeout_s: float | None = REST_TIMEOUT_S) -> None:
        super().__init__(v2.core, observe, timeout_s)
        self.v2 = v2

    def answers(self, path: str) -> bool:
        """`/v2` and everything under it."""
        return path == "/v2" or path.startswith("/v2/")

    def route(self, method: str, path: str, headers: dict[str, str], body: bytes,
              record: CallRecord) -> Reply:
        """One request under /v2."""
        if path in ("/v2", "/v2/"):
            _need(method, "GET", path)
            return json_reply(200, self.v2.server_metadata())
        if path == "/v2/health/live":
            _need(method, "GET", path)
            return json_reply(200, {"live": True})
        if path == "/v2/health/ready":
            _need(method, "GET", path)
            ready = self.v2.server_ready()
            return json_reply(200 if ready else 503, {"ready": ready})
        match = _MODEL_PATH.fullmatch(path)
        if not match:
            raise not_found(f"no V2 endpoint {clip(path, 200)}")
        name = urllib.parse.unquote(match.group(1))
        version = urllib.parse.unquote(match.group(2) or "")
        action = match.group(3)
        v2_protocol.record_names(record, name, version)
        if action == "/infer":
            _need(method, "POST", path)
            record.method = "ModelInfer"
            return self._infer(name, version, headers, body, record)
        _need(method, "GET", path)
        if action == "/ready":
            record.method = "ModelReady"
            if not self.v2.knows_model(name):
                raise not_found(f"Unknown model: {clip(name)}")
            if not self.v2.model_ready(name, version):
                raise invalid(f"model {clip(name)} version {clip(version) or '(latest)'} is "
                              "not ready")
            return json_reply(200, {"name": name, "ready": True})
        record.method = "ModelMetadata"
        return json_reply(200, self.v2.model_metadata(name, version))

    def _infer(self, name, version, headers, body, record: CallRecord) -> Reply:
        doc, binary = _split_body(headers, body)
        params = _object(doc.get("parameters", {}), "parameters")
        inputs = _inputs(doc, binary)
        outputs = _requested_outputs(doc)
        result = self.v2.infer(name, version, inputs, [n for n, _ in outputs],
                               _string_param(params, v2_protocol.SIGNATURE_PARAMETER),
                               self.timeout_s)
        record.answered = str(result.servable.version)
        all_binary = _bool_param(params, "binary_data_output")
        wants = {n: b for n, b in outputs}
        reply: dict = {"model_name": result.servable.model, "model_version": record.answered}
        if "id" in doc:
            reply["id"] = doc["id"]
        tensors, tail = [], []
        for out_name, array in result.outputs.items():
            entry = {"name": out_name, "datatype": v2_protocol.output_datatype(array),
                     "shape": list(array.shape)}
            as_binary = wants.get(out_name)
            if as_binary if as_binary is not None else all_binary:
                raw = v2_protocol.raw_bytes(array)
                entry["parameters"] = {"binary_data_size": len(raw)}
                tail.append(raw)
            else:
                entry["data"] = _json_data(out_name, array)
            tensors.append(entry)
        reply["outputs"] = tensors
        head = dumps(reply)
        if not tail:
            return 200, head, [(b"content-type", b"application/json")]
        return 200, head + b"".join(tail), [
            (b"content-type", b"application/octet-stream"),
            (HEADER_LENGTH.encode(), str(len(head)).encode())]


# ---- request parsing --------------------------------------------------------------------------

def _need(method: str, wanted: str, path: str) -> None:
    if method != wanted:
        raise ServingStatusError(grpc.StatusCode.UNIMPLEMENTED,
                                 f"{method} is not supported on {clip(path, 200)} (use {wanted})")


def _split_body(headers: dict[str, str], body: bytes) -> tuple[dict, memoryview]:
    """The JSON object and the binary tail (binary tensor data extension)."""
    length = headers.get(HEADER_LENGTH)
    if length is None:
        head, tail = body, b""
    else:
        if not length.isdigit() or int(length) > len(body):
            raise invalid(f"Inference-Header-Content-Length must be a byte count within the "
                          f"body ({len(body)} bytes). Received: {clip(length, 40)}")
        # the tail as a view: binary inputs become arrays over the body itself, no copy
        head, tail = body[:int(length)], memoryview(body)[int(length):]
    if not head:
        raise invalid("JSON parse error: the request body is empty")
    try:
        doc = json.loads(head)
    except (ValueError, RecursionError) as e:
        raise invalid(f"JSON parse error: {clip(e, 200)}") from None
    return _object(doc, "the request"), memoryview(tail)  # (a view of a view: no copy)


def _object(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(f"{what} must be a JSON object. Received: {clip(json.dumps(value), 100)}")
    return value


def _bool_param(params: dict, key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise invalid(f"parameter {key} must be true or false. Received: {clip(value, 40)}")
    return value


def _string_param(params: dict, key: str) -> str:
    value = params.get(key, "")
    if not isinstance(value, str):
        raise invalid(f"parameter {key} must be a string. Received: {clip(value, 40)}")
    return value


def _inputs(doc: dict, binary: memoryview) -> list[V2Input]:
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        raise invalid("'inputs' must be a non-empty list of tensors")
    specs, offset = [], 0
    for item in items:
        item = _object(item, "an input")
        name, datatype, shape = _tensor_header(item)
        size = _object(item.get("parameters", {}), f"parameters of input {name}").get(
            "binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0 or offset + size > len(binary):
                raise invalid(f"input '{clip(name)}': binary_data_size {clip(size, 40)} does not "
                              f"fit the {len(binary) - offset} binary bytes left in the body")
            if "data" in item:
                raise invalid(f"input '{clip(name)}' has both data and binary_data_size")
            raw = binary[offset:offset + size]
            offset += size
            specs.append(V2Input(name, datatype, shape, size, _raw_builder(name, raw),
                                 _raw_longest(raw, shape) if datatype == "BYTES" else 0))
            continue
        if "data" not in item:
            raise invalid(f"input '{clip(name)}' has no data (nor binary_data_size)")
        values = _flatten(item["data"])
        sizes = v2_protocol.string_sizes(values) if datatype == "BYTES" else []
        specs.append(V2Input(name, datatype, shape, sum(sizes), _values_builder(name, values),
                             max(sizes, default=0)))
    if offset != len(binary):
        raise invalid(f"{len(binary) - offset} bytes of binary data after the last input's "
                      "binary_data_size")
    return specs


def _tensor_header(item: dict) -> tuple[str, str, tuple[int, ...]]:
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if not isinstance(name, str) or not name:
        raise invalid("every input needs a 'name' (a string)")
    if not isinstance(datatype, str):
        raise invalid(f"input '{clip(name)}' needs a 'datatype' (a string such as FP32)")
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        raise invalid(f"input '{clip(name)}' needs a 'shape' (a list of integers). Received: "
                      f"{clip(json.dumps(shape), 100)}")
    return name, datatype, tuple(shape)


def _raw_builder(name: str, raw: memoryview):
    """The array of binary tensor data: a view of the request body itself, no copy."""
    return lambda dtype, shape: v2_protocol.from_raw(name, raw, dtype, shape)


def _raw_longest(raw: memoryview, shape: tuple[int, ...]):
    """The longest raw BYTES element, read by the core once the element count has passed."""
    return lambda: v2_protocol.longest_raw_element(raw, math.prod(shape))


def _values_builder(name: str, values: list):
    return lambda dtype, shape: v2_protocol.from_values(name, values, dtype, shape)


def _flatten(data) -> list:
    """`data` row-major: a flat list, nested lists, or one scalar."""
    if not isinstance(data, list):
        return [data]
    flat, stack = [], [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


def _requested_outputs(doc: dict) -> list[tuple[str, bool | None]]:
    """(name, binary_data or None) of every output asked for ([] = all)."""
    items = doc.get("outputs", [])
    if not isinstance(items, list):
        raise invalid("'outputs' must be a list")
    wanted = []
    for item in items:
        item = _object(item, "an output")
        name = item.get("name")
        if not isinstance(name, str):
            raise invalid("every requested output needs a 'name' (a string)")
        params = _object(item.get("parameters", {}), f"parameters of output {name}")
        if params.get("classification"):
            raise invalid(f"output '{clip(name)}': the classification extension is not "
                          "supported by ampflow serve")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise invalid(f"output '{clip(name)}': binary_data must be true or false")
        wanted.append((name, binary))
    return wanted


# ---- response encoding ------------------------------------------------------------------------

def _json_data(name: str, array) -> list:
    """Row-major JSON values: float32/16 as the shortest decimal, BYTES as UTF-8 text."""
    import numpy as np

    flat = array.ravel()
    if array.dtype == np.object_:
        try:
            return [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
        except UnicodeDecodeError:
            raise invalid(f"output '{clip(name)}' holds bytes that are not UTF-8: ask for it "
                          "with parameters.binary_data") from None
    if array.dtype in (np.float32, np.float16):
        return flat.astype(str).astype(np.float64).tolist()
    return flat.tolist()
