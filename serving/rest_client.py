"""TF Serving's REST API client (real or `ampflow serve --rest-api-port`), stdlib HTTP only.

The calls of `PredictionClient` that `ampflow predict` needs, with the same results; TF
Serving's `{"error": ...}` answers become `RpcError`s whose code is the gRPC code of the HTTP
status.
"""

from __future__ import annotations

import base64

import grpc
import numpy as np
from tensorflow_serving.apis import get_model_metadata_pb2

from ampflow.errors import ConfigError
from ampflow.serving.client import (
    ClassifyResult,
    PredictResult,
    RpcError,
    SignatureLookups,
    as_array,
)
from ampflow.serving.model_format import CLASSIFY_SIGNATURE, DEFAULT_SIGNATURE, IMAGE_FEATURE


class RestClient(SignatureLookups):
    """TF Serving's REST API client (real or `ampflow serve --rest-api-port`), stdlib HTTP only.

    It has the calls of `PredictionClient` that `ampflow predict` needs.

    Errors are `RpcError`s whose code is the gRPC code of TF Serving's HTTP status.
    """

    def __init__(self, address: str, *, timeout_s: float = 10.0, tls_ca=None, tls_cert=None,
                 tls_key=None, tls_server_name: str | None = None) -> None:
        import ssl

        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0. Received: timeout_s={timeout_s}")
        if tls_server_name:
            raise ConfigError("the REST client checks the certificate against the host it "
                              "connects to: give that name as --host. Received: "
                              f"tls_server_name={tls_server_name!r}")
        self.timeout_s = timeout_s
        self._context = None
        scheme = "http"
        if tls_ca or tls_cert:
            scheme = "https"
            self._context = ssl.create_default_context(cafile=tls_ca)
            if tls_cert:
                self._context.load_cert_chain(tls_cert, tls_key)
        self.base = f"{scheme}://{address}"

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to close (one connection per call)."""

    def call(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One HTTP call; JSON in and out; TF Serving's `{"error"}` becomes an RpcError."""
        import json
        import urllib.error
        import urllib.request

        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s,
                                        context=self._context) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                message = json.loads(body).get("error", "")
            except ValueError:
                message = body.decode("utf-8", "replace")[:500]
            raise RpcError(f"{method} {path}", _GRPC_OF_HTTP.get(e.code, grpc.StatusCode.UNKNOWN),
                           message) from e
        except (urllib.error.URLError, OSError) as e:
            raise RpcError(f"{method} {path}", grpc.StatusCode.UNAVAILABLE, str(e)) from e

    @staticmethod
    def model_path(model: str, version: int | None = None, label: str | None = None) -> str:
        """`/v1/models/{name}[/versions/{n}|/labels/{l}]` with the name quoted."""
        from urllib.parse import quote

        path = f"/v1/models/{quote(model, safe='')}"
        if version is not None:
            path += f"/versions/{int(version)}"
        elif label:
            path += f"/labels/{quote(label, safe='')}"
        return path

    def status(self, model: str, version: int | None = None) -> list[dict]:
        """GET status, as `PredictionClient.status` returns it."""
        answer = self.call("GET", self.model_path(model, version))
        return [{"version": int(s["version"]), "state": s["state"],
                 "error_code": _code_number(s["status"]["error_code"]),
                 "error_message": s["status"]["error_message"]}
                for s in answer.get("model_version_status", [])]

    def metadata(self, model: str, version: int | None = None) -> dict:
        """GET metadata: signature name -> SignatureDef proto."""
        from google.protobuf import json_format

        answer = self.call("GET", self.model_path(model, version) + "/metadata")
        sig_map = json_format.ParseDict(answer["metadata"]["signature_def"],
                                        get_model_metadata_pb2.SignatureDefMap())
        return dict(sig_map.signature_def)

    def predict(self, model: str, images, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, *, version_label: str | None = None
                ) -> PredictResult:
        """POST :predict in columnar form (`inputs`); outputs as numpy arrays.

        Bytes (a list of `bytes`, e.g. encoded images) go as TF Serving's `{"b64": ...}`.
        """
        inputs = images if isinstance(images, dict) else {
            next(iter(self.input_specs(model, version, signature))): images}
        payload = {"signature_name": signature,
                   "inputs": {k: _json_value(v) for k, v in inputs.items()}}
        answer = self.call("POST", self.model_path(model, version, version_label) + ":predict",
                           payload)
        outputs = answer["outputs"]
        if not isinstance(outputs, dict):  # one output: TF Serving drops its name
            sig = self.signature(model, version, signature)
            outputs = {next(iter(sig.outputs)): outputs}
        return PredictResult({k: np.asarray(v) for k, v in outputs.items()},
                             version or self._latest(model), signature)

    def _latest(self, model: str) -> int:
        """The newest AVAILABLE version: what answered a request without one, most likely.

        REST answers do not name their version.
        """
        available = [s["version"] for s in self.status(model) if s["state"] == "AVAILABLE"]
        return max(available, default=0)

    def classify(self, model: str, images, version: int | None = None,
                 signature: str = CLASSIFY_SIGNATURE, *, version_label: str | None = None
                 ) -> ClassifyResult:
        """POST :classify with images as `image` float features."""
        examples = [{IMAGE_FEATURE: np.asarray(i, dtype=np.float32).ravel().astype(float).tolist()}
                    for i in images]
        answer = self.call("POST", self.model_path(model, version, version_label) + ":classify",
                           {"signature_name": signature, "examples": examples})
        classes = [[(label, float(score)) for label, score in row] for row in answer["results"]]
        return ClassifyResult(classes, version or self._latest(model))


def _json_value(value):
    """Nested lists for JSON; bytes as `{"b64": ...}` (TF Serving's api_rest.md)."""
    array = as_array(value)
    if array.dtype.kind in "OS":
        b64 = np.frompyfunc(lambda b: {"b64": base64.b64encode(b).decode("ascii")}, 1, 1)
        return b64(array).tolist()
    return array.tolist()


_GRPC_OF_HTTP = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                 403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
                 409: grpc.StatusCode.ABORTED, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
                 499: grpc.StatusCode.CANCELLED, 500: grpc.StatusCode.INTERNAL,
                 501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE,
                 504: grpc.StatusCode.DEADLINE_EXCEEDED}


def _code_number(name) -> int:
    if isinstance(name, int):
        return name
    return next((c.value[0] for c in grpc.StatusCode if c.name == name), 2)
