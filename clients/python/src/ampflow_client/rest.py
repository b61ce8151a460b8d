"""TF Serving's REST API (port 8501) without TensorFlow, on the standard library's http.client.

Why no HTTP library: the API is a handful of JSON calls on one host, and `http.client` gives a
kept-alive connection, TLS and mutual TLS (`ssl`), and timeouts, with nothing to install. One
connection per client, so use one client per thread.

The same calls as the gRPC `Client` (except health, which TF Serving's REST API lacks), with
the same results; TF Serving's `{"error": ...}` answers become `ServingError`s whose code is
the gRPC code of the HTTP status.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
from collections.abc import Mapping
from urllib.parse import quote

import grpc
import numpy as np

from ampflow_client._common import (
    DEFAULT_SIGNATURE,
    ClassifyResult,
    PredictResult,
    RegressResult,
    SignatureLookups,
    check_version,
    examples_of,
)
from ampflow_client._proto.tensorflow_serving.apis import get_model_metadata_pb2
from ampflow_client.errors import GRPC_OF_HTTP, ConfigError, ServingError, code_of_name
from ampflow_client.grpc_client import cast_to
from ampflow_client.tensors import as_array


class RestClient(SignatureLookups):
    """TF Serving REST client: `RestClient("host:8501")`; TLS when a CA or cert is given."""

    def __init__(self, address: str, *, timeout_s: float = 10.0, retries: int = 3,
                 backoff_s: float = 0.2, tls_ca=None, tls_cert=None, tls_key=None,
                 tls_server_name: str | None = None) -> None:
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0. Received: timeout_s={timeout_s}")
        if retries < 0:
            raise ConfigError(f"retries must be >= 0. Received: retries={retries}")
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("tls_cert and tls_key must be given together. Received: "
                              f"tls_cert={tls_cert}, tls_key={tls_key}")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"address must be host:port. Received: {address!r}")
        self.address = address
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._host, self._port = host.strip("[]"), int(port)
        self._context = None
        if tls_ca or tls_cert:
            self._context = ssl.create_default_context(cafile=tls_ca)
            if tls_cert:
                self._context.load_cert_chain(tls_cert, tls_key)
        self._server_name = tls_server_name
        self._conn: http.client.HTTPConnection | None = None

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the kept-alive connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- transport ------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._context is None:
                self._conn = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self.timeout_s)
            else:
                self._conn = _HTTPSConnection(self._host, self._port, timeout=self.timeout_s,
                                              context=self._context,
                                              server_name=self._server_name)
        return self._conn

    def call(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One HTTP call, JSON in and out; UNAVAILABLE (503, no connection) is retried."""
        body = None if payload is None else json.dumps(payload).encode()
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return self._once(method, path, body)
            except ServingError as e:
                if e.code != grpc.StatusCode.UNAVAILABLE or attempt == attempts:
                    raise
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, method: str, path: str, body: bytes | None) -> dict:
        what = f"{method} {path}"
        try:
            conn = self._connection()
            conn.request(method, path, body=body,
                         headers={"Content-Type": "application/json"} if body else {})
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            code = grpc.StatusCode.DEADLINE_EXCEEDED if isinstance(e, TimeoutError) else \
                grpc.StatusCode.UNAVAILABLE
            raise ServingError(what, code, str(e) or type(e).__name__) from e
        if response.status != 200:
            try:
                message = json.loads(data).get("error", "")
            except (ValueError, AttributeError):
                message = data.decode("utf-8", "replace")[:500]
            raise ServingError(what, GRPC_OF_HTTP.get(response.status, grpc.StatusCode.UNKNOWN),
                               message)
        try:
            return json.loads(data)
        except ValueError as e:
            raise ServingError(what, grpc.StatusCode.INTERNAL,
                               f"the answer is not JSON: {data[:200]!r}") from e

    @staticmethod
    def model_path(model: str, version: int | None = None, label: str | None = None) -> str:
        """`/v1/models/{name}[/versions/{n}|/labels/{l}]`, quoted."""
        check_version(version, label)
        path = f"/v1/models/{quote(model, safe='')}"
        if version is not None:
            path += f"/versions/{int(version)}"
        elif label:
            path += f"/labels/{quote(label, safe='')}"
        return path

    # ---- API ----------------------------------------------------------------------------

    def status(self, model: str, version: int | None = None, *,
               version_label: str | None = None) -> list[dict]:
        """GET status, as `Client.status` returns it."""
        answer = self.call("GET", self.model_path(model, version, version_label))
        return [{"version": int(s["version"]), "state": s["state"],
                 "error_code": code_of_name(s.get("status", {}).get("error_code", "OK")).name,
                 "error_message": s.get("status", {}).get("error_message", "")}
                for s in answer.get("model_version_status", [])]

    def wait_until_available(self, model: str, timeout_s: float = 60.0,
                             version: int | None = None) -> int:
        """Poll the status until a version is AVAILABLE; returns the highest such one."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                rows = self.status(model, version)
                ready = [r["version"] for r in rows if r["state"] == "AVAILABLE"]
                if ready:
                    return max(ready)
                last = str([(r["version"], r["state"]) for r in rows])
            except ServingError as e:
                last = str(e)
            time.sleep(0.1)
        raise ServingError("GET status", grpc.StatusCode.DEADLINE_EXCEEDED,
                           f"model {model!r} at {self.address} was not AVAILABLE within "
                           f"{timeout_s:g}s. Last status: {last}")

    def metadata(self, model: str, version: int | None = None) -> dict:
        """GET metadata: signature name -> SignatureDef proto."""
        from google.protobuf import json_format

        answer = self.call("GET", self.model_path(model, version) + "/metadata")
        sig_map = json_format.ParseDict(answer["metadata"]["signature_def"],
                                        get_model_metadata_pb2.SignatureDefMap(),
                                        ignore_unknown_fields=True)
        return dict(sig_map.signature_def)

    def predict(self, model: str, inputs, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, *, version_label: str | None = None,
                output_filter=()) -> PredictResult:
        """POST :predict in columnar form (`inputs`); outputs typed by the signature.

        Bytes (a list of `bytes`) go as TF Serving's `{"b64": ...}`.
        """
        if output_filter:
            raise ConfigError("TF Serving's REST API has no output_filter. Received: "
                              f"{list(output_filter)}")
        version = self._pinned(model, version, version_label)
        if not isinstance(inputs, Mapping):
            specs = self.input_specs(model, version, signature)
            if len(specs) != 1:
                raise ConfigError(f"signature {signature!r} has inputs {sorted(specs)}: pass a "
                                  "dict of arrays keyed by input name")
            (spec,) = specs.values()
            inputs = {spec.name: cast_to(spec, as_array(inputs), signature)}
        payload = {"signature_name": signature,
                   "inputs": {k: _json_value(v) for k, v in inputs.items()}}
        answer = self.call("POST", self.model_path(model, version, version_label) + ":predict",
                           payload)
        outputs = answer["outputs"]
        specs = self.output_specs(model, version, signature)
        if not isinstance(outputs, dict):  # one output: TF Serving drops its name
            outputs = {next(iter(specs)): outputs}
        arrays = {k: _from_json(v, specs.get(k)) for k, v in outputs.items()}
        return PredictResult(arrays, version or self._latest(model), signature)

    def classify(self, model: str, examples, version: int | None = None,
                 signature: str = DEFAULT_SIGNATURE, *, version_label: str | None = None,
                 context=None) -> ClassifyResult:
        """POST :classify; examples as for `Client.classify`."""
        version = self._pinned(model, version, version_label)
        answer = self.call("POST", self.model_path(model, version, version_label) + ":classify",
                           _examples_payload(signature, examples, context))
        classes = [[(str(label), float(score)) for label, score in row]
                   for row in answer["results"]]
        return ClassifyResult(classes, version or self._latest(model))

    def regress(self, model: str, examples, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, *, version_label: str | None = None,
                context=None) -> RegressResult:
        """POST :regress; examples as for `Client.regress`."""
        version = self._pinned(model, version, version_label)
        answer = self.call("POST", self.model_path(model, version, version_label) + ":regress",
                           _examples_payload(signature, examples, context))
        return RegressResult([float(v) for v in answer["results"]],
                             version or self._latest(model))

    def _pinned(self, model: str, version: int | None, label: str | None) -> int | None:
        """The version a request without one is sent to: the newest AVAILABLE, asked first.

        TF Serving's REST answers do not say which version answered (gRPC's do), so the
        client pins the request to the version it reports: asked after the call, a version
        loaded in between would be reported for an answer it did not give. None when a
        label is given (the server resolves it) or no version is AVAILABLE (the server's
        own error then says why).
        """
        if version is not None or label is not None:
            return version
        return self._latest(model) or None

    def _latest(self, model: str) -> int:
        """The newest AVAILABLE version: what answered a request without one (REST says none)."""
        available = [s["version"] for s in self.status(model) if s["state"] == "AVAILABLE"]
        return max(available, default=0)


class _HTTPSConnection(http.client.HTTPSConnection):
    """HTTPS whose certificate check may name another host (`tls_server_name`)."""

    def __init__(self, *args, server_name: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._server_name = server_name

    def connect(self) -> None:
        if not self._server_name:
            return super().connect()
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)


def _json_value(value):
    """Nested lists for JSON; text as JSON strings, bytes as `{"b64": ...}` (api_rest.md)."""
    array = as_array(value)
    if array.dtype.kind in "OS":
        b64 = np.frompyfunc(
            lambda b: b if isinstance(b, str) else {"b64": base64.b64encode(b)
                                                    .decode("ascii")}, 1, 1)
        return b64(array).tolist()
    if array.dtype.kind == "U":
        return array.tolist()
    return array.tolist()


def _from_json(value, spec) -> np.ndarray:
    """A JSON output as numpy, in the signature's dtype; `{"b64"}` and text as bytes."""
    if spec is not None and spec.dtype is not None and spec.dtype.kind == "O":
        flat = np.asarray(value, dtype=object)
        decode = np.frompyfunc(lambda v: base64.b64decode(v["b64"]) if isinstance(v, dict)
                               else v.encode(), 1, 1)
        return decode(flat).astype(object) if flat.size else flat
    dtype = spec.dtype if spec is not None and spec.dtype is not None else None
    return np.asarray(value, dtype=dtype)


def _feature_json(value):
    if isinstance(value, (bytes, bytearray)):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.ndarray):
        return value.ravel().tolist()
    if isinstance(value, (list, tuple)):
        return [_feature_json(v) for v in value]
    return value


def _example_json(example) -> dict:
    """A tf.Example as TF Serving's REST JSON: feature name -> list of values."""
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "float_list":
            out[name] = list(feature.float_list.value)
        elif kind == "int64_list":
            out[name] = list(feature.int64_list.value)
        elif kind == "bytes_list":
            out[name] = [_feature_json(v) for v in feature.bytes_list.value]
    return out


def _examples_payload(signature: str, examples, context) -> dict:
    payload = {"signature_name": signature,
               "examples": [_example_json(e) for e in examples_of(examples)]}
    if context is not None:
        payload["context"] = _example_json(examples_of([context])[0])
    return payload
