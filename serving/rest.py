"""TF Serving's REST API (`--rest-api-port`), over the same `InferenceCore` as gRPC.

The behaviour follows TF Serving's `http_rest_api_handler.cc`, `http_rest_api_util.cc`,
`http_server.cc` and `util/json_tensor.cc` (read, not copied):
- `POST /v1/models/{name}[/versions/{n}|/labels/{l}]:(predict|classify|regress)`;
  `GET /v1/models/{name}[/versions/{n}|/labels/{l}][/metadata]` (status or metadata);
- predict takes `instances` (row format: a list, of objects when there are several inputs)
  or `inputs` (columnar: a value, or an object keyed by input name), with dtypes and shapes
  from the signature; answers `predictions` / `outputs`; `{"b64": ...}` carries bytes both
  ways (outputs whose name ends in `_bytes`); `NaN`/`Infinity` are accepted and written;
- classify takes `examples` (+ optional `context`) and answers `results`;
- every error is `{"error": "..."}` with TF Serving's HTTP code for the gRPC code.
Each JSON request becomes the gRPC request proto and goes through `InferenceCore`, so REST and
gRPC run the same validation and limits and give the same answers. HTTP itself is parsed by
uvicorn (h11); the body is bounded by `--max-message-bytes` before it is parsed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import re
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
from google.protobuf import json_format
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    predict_pb2,
)

from ampflow.errors import ServingError
from ampflow.serving import tensors
from ampflow.serving.model_registry import ServingStatusError
from ampflow.serving.service import InferenceCore, Observer, _Handler

log = logging.getLogger(__name__)

# http_server.cc: ToHTTPStatusCode
HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}
_PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)",
    re.IGNORECASE)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?",
    re.IGNORECASE)
_INT_DTYPES = {types_pb2.DT_INT8, types_pb2.DT_UINT8, types_pb2.DT_INT16, types_pb2.DT_UINT16,
               types_pb2.DT_INT32, types_pb2.DT_INT64, types_pb2.DT_UINT32, types_pb2.DT_UINT64}
_FLOAT_DTYPES = {types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_HALF}
REST_TIMEOUT_S = 30.0  # TF Serving's --rest_api_timeout_in_ms default


def _invalid(message: str) -> ServingStatusError:
    return ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, message)


# ---- the request handler (plain Python: method, path, body -> status, JSON) ------------------

class RestHandler:
    """Turns one HTTP request into an InferenceCore call and its answer into JSON."""

    def __init__(self, core: InferenceCore, observe: Observer | None = None) -> None:
        self.core = core
        self._labels = _Handler(core, None)
        self.observe = observe

    def handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, bytes]:
        """Answer one request: (HTTP status, JSON body). Never raises."""
        started, api, request = time.perf_counter(), "", None
        code, version = grpc.StatusCode.OK, ""
        try:
            api, request, payload = self._dispatch(method, raw_path, body)
            version = str(request.model_spec.version.value) if request is not None and \
                request.model_spec.HasField("version") else ""
        except ServingStatusError as e:
            code, payload = e.code, {"error": tensors.clip(e.message, 1024)}
        except Exception as e:  # a server bug must not end the process: INTERNAL
            log.exception("REST %s %s failed", method, tensors.clip(raw_path, 200))
            code = grpc.StatusCode.INTERNAL
            payload = {"error": f"internal error ({type(e).__name__}); see the server log"}
        if self.observe is not None and api:
            model, version = self._labels.labels(request, version) if request is not None \
                else ("", "")
            self.observe(model, version, api, code, time.perf_counter() - started)
        return HTTP_STATUS.get(code, 500), _dumps(payload)

    def _dispatch(self, method: str, raw_path: str, body: bytes):
        path = raw_path.split("?", 1)[0]
        malformed = _invalid(f"Malformed request: {method} {tensors.clip(path, 200)}")
        if method == "POST":
            match = _PREDICT_PATH.fullmatch(path)
            if not match:
                raise malformed
            spec = _model_spec(*match.groups()[:3])
            verb = match.group(4).lower()
            if verb == "predict":
                return ("Predict", *self._predict(spec, body))
            if verb == "classify":
                return ("Classify", *self._classify(spec, body))
            raise ServingStatusError(grpc.StatusCode.UNIMPLEMENTED,
                                     "Regress is not supported by ampflow serve")
        if method == "GET":
            match = _STATUS_PATH.fullmatch(path)
            if not match:
                raise malformed
            name = match.group(1)
            if not name:
                raise _invalid("Missing model name in request.")
            spec = _model_spec(*match.groups()[:3])
            if match.group(4):
                return ("GetModelMetadata", *self._metadata(spec))
            return ("GetModelStatus", *self._status(spec))
        raise malformed

    # ---- APIs -------------------------------------------------------------------------------

    def _predict(self, spec, body: bytes):
        doc = _parse_object(body)
        request = predict_pb2.PredictRequest()
        request.model_spec.CopyFrom(spec)
        request.model_spec.signature_name = _signature_name(doc)
        servable = self.core.resolve(request)
        sig_name = request.model_spec.signature_name or "serving_default"
        if sig_name not in servable.signature_defs or not servable.can_run(sig_name):
            raise _invalid(f'Serving signature name: "{tensors.clip(sig_name)}" not found in '
                           "signature def")
        infos = dict(servable.signature_defs[sig_name].inputs)
        row_format = _fill_inputs(doc, infos, request)
        response = self.core.predict(request, REST_TIMEOUT_S, servable=servable)
        outputs = {k: tensors.to_ndarray(k, v) for k, v in response.outputs.items()}
        payload = _row_json(outputs) if row_format else _columnar_json(outputs)
        return request, payload

    def _classify(self, spec, body: bytes):
        doc = _parse_object(body)
        request = classification_pb2.ClassificationRequest()
        request.model_spec.CopyFrom(spec)
        request.model_spec.signature_name = _signature_name(doc)
        _fill_examples(doc, request, self.core.limits.max_rows)
        response = self.core.classify(request, REST_TIMEOUT_S)
        results = [[[c.label, _float32(c.score)] for c in row.classes]
                   for row in response.result.classifications]
        return request, {"results": results}

    def _status(self, spec):
        request = get_model_status_pb2.GetModelStatusRequest(model_spec=spec)
        response = self.core.status(request)
        return request, json_format.MessageToDict(
            response, always_print_fields_with_no_presence=True)

    def _metadata(self, spec):
        request = get_model_metadata_pb2.GetModelMetadataRequest(model_spec=spec)
        request.metadata_field.append("signature_def")
        response = self.core.metadata(request)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(sig_map)
        options = {"preserving_proto_field_name": True,
                   "always_print_fields_with_no_presence": True}
        return request, {"model_spec": json_format.MessageToDict(response.model_spec, **options),
                         "metadata": {"signature_def": json_format.MessageToDict(sig_map,
                                                                                 **options)}}


def _model_spec(name: str, version: str | None, label: str | None):
    from tensorflow_serving.apis import model_pb2

    spec = model_pb2.ModelSpec(name=urllib.parse.unquote(name or ""))
    if version is not None:
        number = int(version)
        if number >= 2 ** 63:
            raise _invalid(f"Failed to convert version: {tensors.clip(version)} to numeric.")
        spec.version.value = number
    if label is not None:
        spec.version_label = urllib.parse.unquote(label)
    return spec


def _dumps(payload) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


# ---- JSON -> request protos (util/json_tensor.cc) --------------------------------------------

def _parse_object(body: bytes) -> dict:
    if not body:
        raise _invalid("JSON Parse error: The document is empty")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
        raise _invalid(f"JSON Parse error: {tensors.clip(e, 200)}") from None
    if not isinstance(doc, dict):
        raise _invalid(f"JSON Value: {_debug(doc)} Is not object")
    return doc


def _signature_name(doc: dict) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise _invalid(f"JSON Value: {_debug(doc)} not formatted correctly. 'signature_name' "
                       "key must be a string value.")
    return name


def _debug(value) -> str:
    """A JSON value for an error message: at most 256 characters, as TF Serving."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(type(value))
    return tensors.clip(text, 256)


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _fill_inputs(doc: dict, infos: dict, request) -> bool:
    """Fill request.inputs from `instances` (returns True: row format) or `inputs`."""
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise _invalid(f"JSON Value: {_debug(doc)} Not formatted correctly expecting only one "
                       "of 'inputs' or 'instances' keys to exist ")
    if not infos:
        raise _invalid("Failed to get input map for signature")
    if has_instances:
        instances = doc["instances"]
        if not isinstance(instances, list):
            raise _invalid(f"JSON Value: {_debug(doc)} Expecting 'instances' to be an "
                           "list/array")
        if not instances:
            raise _invalid(f"JSON Value: {_debug(doc)} No values in 'instances' array")
        objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
        if not objects:
            if len(infos) > 1:
                raise _invalid("instances is a plain list, but expecting list of objects as "
                               "multiple input tensors required as per tensorinfo_map")
            (name, info), = infos.items()
            request.inputs[name].CopyFrom(_tensor(name, instances, info.dtype))
            return True
        for i, item in enumerate(instances):
            if not isinstance(item, dict) or _is_b64(item):
                raise _invalid(f"Expecting object but got list at item {i} of input list")
            if set(item) != set(infos):
                raise _invalid(f"Failed to process element: {i} of 'instances' list. JSON "
                               f"object: {_debug(item)} keys must be equal to: "
                               f"{','.join(sorted(infos))}")
        for name, info in infos.items():
            request.inputs[name].CopyFrom(
                _tensor(name, [item[name] for item in instances], info.dtype))
        return True
    if has_inputs:
        value = doc["inputs"]
        if not isinstance(value, dict) or _is_b64(value):
            if len(infos) > 1:
                raise _invalid("inputs is a plain value/list, but expecting an object as "
                               "multiple input tensors required as per tensorinfo_map")
            (name, info), = infos.items()
            request.inputs[name].CopyFrom(_tensor(name, value, info.dtype))
            return False
        for name, info in infos.items():
            if name not in value:
                raise _invalid(f"Missing named input: {tensors.clip(name)} in 'inputs' object.")
            request.inputs[name].CopyFrom(_tensor(name, value[name], info.dtype))
        return False
    raise _invalid("Missing 'inputs' or 'instances' key")


def _tensor(name: str, value, dtype: int) -> tensor_pb2.TensorProto:
    """A dense JSON value (nested lists) as a TensorProto of the signature's dtype.

    The shape comes from the first element at each level; every list must match it, and
    every leaf must be of the dtype's JSON type (no silent bool->number or string->number).
    """
    dims, probe = [], value
    while isinstance(probe, list):
        dims.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    leaves = [value]
    for level, size in enumerate(dims):
        flat = []
        for item in leaves:
            if not isinstance(item, list):
                raise _invalid(f"JSON Value: {_debug(item)} found at incorrect level: "
                               f"{level + 1} in the JSON DOM. Expected at level: {len(dims)}")
            if len(item) != size:
                raise _invalid(f"Encountered list at unexpected size: {len(item)} at level: "
                               f"{level} expected size: {size}")
            flat.extend(item)
        leaves = flat
    proto = tensor_pb2.TensorProto(dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims]))
    if dtype == types_pb2.DT_STRING:
        proto.string_val.extend(_string_leaf(leaf) for leaf in leaves)
        return proto
    kinds = set(map(type, leaves))
    if list in kinds:
        raise _invalid(f"Encountered list at unexpected level: {len(dims)} expected < "
                       f"{len(dims)} (tensor {tensors.clip(name)})")
    expected = ({int, float} if dtype in _FLOAT_DTYPES else {int} if dtype in _INT_DTYPES
                else {bool} if dtype == types_pb2.DT_BOOL else None)
    if expected is None:
        raise ServingStatusError(grpc.StatusCode.UNIMPLEMENTED,
                                 f"Conversion of JSON to type {tensors.dtype_name(dtype)} of "
                                 f"input {tensors.clip(name)} is not supported")
    if not kinds <= expected:
        bad = next(leaf for leaf in leaves if type(leaf) not in expected)
        raise _invalid(f"JSON Value: {_debug(bad)} Type: {_json_type(bad)} is not of expected "
                       f"type: {tensors.dtype_name(dtype)[3:].lower()}")
    np_dtype = tensors._DTYPES[dtype][0]
    try:
        array = np.asarray(leaves, dtype=np_dtype) if leaves else np.zeros(0, np_dtype)
    except OverflowError:
        raise _invalid(f"a value of input {tensors.clip(name)} does not fit "
                       f"{tensors.dtype_name(dtype)}") from None
    proto.tensor_content = array.tobytes()
    return proto


def _string_leaf(leaf) -> bytes:
    if isinstance(leaf, str):
        return leaf.encode()
    if _is_b64(leaf):
        try:
            return base64.b64decode(leaf["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise _invalid("Unable to base64 decode") from None
    if isinstance(leaf, dict):
        raise _invalid(f"JSON Value: {_debug(leaf)} not formatted correctly for base64 data")
    raise _invalid(f"JSON Value: {_debug(leaf)} Type: {_json_type(leaf)} is not of expected "
                   "type: string")


def _json_type(value) -> str:
    return {bool: "True" if value else "False", int: "Number", float: "Number", str: "String",
            list: "Array", dict: "Object", type(None): "Null"}.get(type(value), "Unknown")


def _fill_examples(doc: dict, request, max_rows: int) -> None:
    """`examples` (+ `context`) as tf.Examples, as FillClassifyRegressRequestFromJson."""
    if "context" in doc:
        _example(doc["context"], request.input.example_list_with_context.context)
        target = request.input.example_list_with_context.examples
    else:
        target = request.input.example_list.examples
    examples = doc.get("examples")
    if examples is None:
        raise _invalid(f"JSON Value: {_debug(doc)} When method is classify, key 'examples' is "
                       "expected and was not found")
    if not isinstance(examples, list):
        raise _invalid(f"JSON Value: {_debug(doc)} Expecting 'examples' value to be an "
                       "list/array")
    if not examples:
        raise _invalid(f"JSON Value: {_debug(doc)} 'examples' value is an empty array")
    if max_rows and len(examples) > max_rows:  # checked again by the core; refuse before work
        raise _invalid(f"Input has {len(examples)} examples; this server takes at most "
                       f"{max_rows} per request (--max-request-batch-size)")
    for item in examples:
        _example(item, target.add())


def _example(value, example: example_pb2.Example) -> None:
    if not isinstance(value, dict):
        raise _invalid(f"Example must be JSON object but got JSON {_json_type(value)}")
    for name, content in value.items():
        feature = feature_pb2.Feature()
        for item in content if isinstance(content, list) else [content]:
            _add_feature_value(name, item, feature)
        example.features.feature[name].CopyFrom(feature)


def _add_feature_value(name: str, value, feature: feature_pb2.Feature) -> None:
    kind = feature.WhichOneof("kind")

    def need(wanted: str) -> None:
        if kind not in (None, wanted):
            raise _invalid(f"Unexpected element type in feature: {tensors.clip(name)} "
                           f"expecting type: {kind.split('_')[0]}")

    if isinstance(value, bool):
        need("int64_list")
        feature.int64_list.value.append(int(value))
    elif isinstance(value, int):
        need("int64_list")
        if not -2 ** 63 <= value < 2 ** 63:
            raise _invalid(f"Feature: {tensors.clip(name)} has uint64_t element. Only int64_t "
                           "is supported.")
        feature.int64_list.value.append(value)
    elif isinstance(value, float):
        need("float_list")
        feature.float_list.value.append(value)
    elif isinstance(value, str) or _is_b64(value):
        need("bytes_list")
        feature.bytes_list.value.append(_string_leaf(value))
    else:
        raise _invalid(f"Feature: {tensors.clip(name)} has element with unexpected JSON type: "
                       f"{_json_type(value)}")


# ---- response tensors -> JSON ---------------------------------------------------------------

def _float32(value: float) -> float:
    """A float32 as the shortest decimal that reads back to it (TF Serving's WriteDecimal)."""
    return float(np.float32(value).astype(str)) if math.isfinite(value) else value


def _json_values(name: str, array: np.ndarray):
    """Nested lists of JSON values: float32 shortest, bytes as text or `{"b64"}` (`_bytes`)."""
    if array.dtype == np.object_:
        as_b64 = name.endswith("_bytes")
        flat = [({"b64": base64.b64encode(v).decode()} if as_b64 else
                 v.decode("utf-8", "replace")) for v in array.ravel()]
        return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim \
            else flat[0]
    if array.dtype == np.float32 or array.dtype == np.float16:
        return array.astype(str).astype(np.float64).tolist()
    return array.tolist()


def _row_json(outputs: dict[str, np.ndarray]) -> dict:
    batch = {a.shape[0] if a.ndim else None for a in outputs.values()}
    if None in batch or len(batch) != 1:
        raise _invalid(f"outputs have inconsistent or no batch sizes: "
                       f"{ {k: list(v.shape) for k, v in outputs.items()} }")
    values = {name: _json_values(name, array) for name, array in sorted(outputs.items())}
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    rows = batch.pop()
    return {"predictions": [{name: v[i] for name, v in values.items()} for i in range(rows)]}


def _columnar_json(outputs: dict[str, np.ndarray]) -> dict:
    values = {name: _json_values(name, array) for name, array in sorted(outputs.items())}
    return {"outputs": next(iter(values.values())) if len(values) == 1 else values}


# ---- the ASGI app and its uvicorn server -----------------------------------------------------

class RestApp:
    """A minimal ASGI app: bounded body, one worker thread per request, JSON out."""

    def __init__(self, handler: RestHandler, max_body_bytes: int, workers: int,
                 metrics=None) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="ampflow-rest")
        self.metrics = metrics  # a prometheus CollectorRegistry served at /metrics, or None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if self.metrics is not None and scope["path"] in ("/metrics",
                                                           "/monitoring/prometheus/metrics"):
            import prometheus_client as prom

            await _reply(send, 200, prom.generate_latest(self.metrics), "text/plain")
            return
        body = await self._read_body(scope, receive)
        if body is None:
            payload = {"error": f"request body larger than {self.max_body_bytes} bytes "
                                "(--max-message-bytes)"}
            await _reply(send, 429, _dumps(payload))
            return
        raw_path = scope.get("raw_path") or scope["path"].encode()
        loop = asyncio.get_running_loop()
        status, payload = await loop.run_in_executor(
            self.pool, self.handler.handle, scope["method"], raw_path.decode("latin-1"), body)
        await _reply(send, status, payload)

    async def _read_body(self, scope, receive) -> bytes | None:
        """The request body, or None once it exceeds the limit (nothing more is read)."""
        for key, value in scope.get("headers", []):
            if key == b"content-length" and value.isdigit() and \
                    int(value) > self.max_body_bytes:
                return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b""
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)


async def _reply(send, status: int, body: bytes, content_type: str = "application/json"):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class RestServer:
    """uvicorn serving a `RestApp` on its own thread and event loop."""

    def __init__(self, app: RestApp, host: str, port: int, tls=None) -> None:
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError as e:
            self._socket.close()
            raise ServingError(f"cannot bind the REST API port. Received: {host}:{port} "
                               f"({e.strerror})") from e
        self.port = self._socket.getsockname()[1]
        ssl_options = {}
        if tls is not None:
            import ssl

            ssl_options = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
            if tls.client_ca_file is not None:
                ssl_options.update(ssl_ca_certs=str(tls.client_ca_file),
                                   ssl_cert_reqs=ssl.CERT_REQUIRED)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", http="h11",
            ws="none", interface="asgi3", timeout_keep_alive=5, limit_concurrency=256,
            h11_max_incomplete_event_size=64 * 1024, **ssl_options)
        self._server = uvicorn.Server(config)
        self._app = app
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="ampflow-rest", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise ServingError(f"the REST API did not start on {host}:{self.port}")

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to `grace_s`), then close."""
        self._server.should_exit = True
        self._thread.join(timeout=grace_s + 5)
        self._app.pool.shutdown(wait=False, cancel_futures=True)
        self._socket.close()
