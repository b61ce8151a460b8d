"""TF Serving's REST API (`--rest-api-port`), over the same `InferenceCore` as gRPC.

The behaviour follows TF Serving's `http_rest_api_handler.cc`, `http_rest_api_util.cc`,
`http_server.cc` and `util/json_tensor.cc` (read, not copied):
- `POST /v1/models/{name}[/versions/{n}|/labels/{l}]:(predict|classify|regress)`;
  `GET /v1/models/{name}[/versions/{n}|/labels/{l}][/metadata]` (status or metadata);
- predict takes `instances` (row format: a list, of objects when there are several inputs)
  or `inputs` (columnar: a value, or an object keyed by input name), with dtypes and shapes
  from the signature; answers `predictions` / `outputs`; `{"b64": ...}` carries bytes both
  ways (outputs whose name ends in `_bytes`); `NaN`/`Infinity` are accepted and written;
- classify and regress take `examples` (+ optional `context`) and answer `results`;
- every error is `{"error": "..."}` with TF Serving's HTTP code for the gRPC code.
A predict's JSON becomes declared inputs of `InferenceCore.infer` (json_tensor.py: the shape
and types read from the JSON, the arrays built only after the core's checks) and the core's
arrays become JSON; the other calls go through `TFServingProtocol` as gRPC's do. REST and gRPC
thus run the same validation and limits and give the same answers. HTTP is transport/http.py's;
this is one `RestDoor` on its port (protocols/rest.py), V2's /v2 the other.
"""

from __future__ import annotations

import logging
import re
import urllib.parse

from google.protobuf import json_format
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    regression_pb2,
)

from ampflow.serving.core.inference import CallRecord, InferRequest, Observer
from ampflow.serving.model_format import DEFAULT_SIGNATURE, parse_version_name
from ampflow.serving.protocols import json_tensor
from ampflow.serving.protocols.rest import RestDoor
from ampflow.serving.protocols.tf_serving import TFServingProtocol, answered_version, record_spec
from ampflow.serving.status import clip
from ampflow.serving.status import invalid_argument as _invalid
from ampflow.serving.transport.http import REST_TIMEOUT_S, Reply, json_reply

log = logging.getLogger(__name__)

_PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)",
    re.IGNORECASE)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?",
    re.IGNORECASE)


# ---- the request handler (a RestDoor: method, path, body -> status, JSON) --------------------

class TFServingRestHandler(RestDoor):
    """Turns one HTTP request into an InferenceCore call and its answer into JSON."""

    def __init__(self, api: TFServingProtocol, observe: Observer | None = None,
                 timeout_s: float | None = REST_TIMEOUT_S) -> None:
        super().__init__(api.core, observe, timeout_s)
        self.api = api

    def answers(self, path: str) -> bool:  # noqa: ARG002 - the door's shape
        """Every path the other doors leave: TF Serving answers an unknown one with its 400."""
        return True

    def route(self, method: str, path: str, headers: dict[str, str], body: bytes,
              record: CallRecord) -> Reply:  # noqa: ARG002 - /v1 reads no header
        """One /v1 request: 200 and its JSON, or the error envelope (RestDoor.handle)."""
        return json_reply(200, self._dispatch(method, path, body, record))

    def _dispatch(self, method: str, path: str, body: bytes, record: CallRecord):
        """Route one request; `record` learns the API, the request and the version that ran."""
        malformed = _invalid(f"Malformed request: {method} {clip(path, 200)}")
        if method == "POST":
            match = _PREDICT_PATH.fullmatch(path)
            if not match:
                raise malformed
            spec = _model_spec(*match.groups()[:3])
            verb = match.group(4).lower()
            if verb == "predict":
                record.method = "Predict"
                return self._predict(spec, body, record)
            if verb == "classify":
                record.method = "Classify"
                return self._classify(spec, body, record)
            record.method = "Regress"
            return self._regress(spec, body, record)
        if method == "GET":
            match = _STATUS_PATH.fullmatch(path)
            if not match:
                raise malformed
            name = match.group(1)
            if not name:
                raise _invalid("Missing model name in request.")
            spec = _model_spec(*match.groups()[:3])
            if match.group(4):
                record.method = "GetModelMetadata"
                return self._metadata(spec, record)
            record.method = "GetModelStatus"
            return self._status(spec, record)
        raise malformed

    # ---- APIs -------------------------------------------------------------------------------

    def _predict(self, spec, body: bytes, record: CallRecord):
        record_spec(record, spec)
        doc = json_tensor.parse_object(body)
        sig_name = json_tensor.signature_name(doc) or DEFAULT_SIGNATURE
        servable = self.core.resolve(*_spec_parts(spec))
        if sig_name not in servable.signature_defs or not servable.can_run(sig_name):
            raise _invalid(f'Serving signature name: "{clip(sig_name)}" not found in '
                           "signature def")
        infos = dict(servable.signature_defs[sig_name].inputs)
        inputs, row_format = json_tensor.json_inputs(doc, infos)
        answer = self.core.infer(InferRequest(spec.name, signature=sig_name, inputs=inputs,
                                              servable=servable), self.timeout_s)
        record.answered = str(servable.version)
        return (json_tensor.row_json if row_format else json_tensor.columnar_json)(
            answer.outputs)

    def _classify(self, spec, body: bytes, record: CallRecord):
        response = self._examples_call(classification_pb2.ClassificationRequest(model_spec=spec),
                                       body, record, self.api.classify)
        results = [[[c.label, json_tensor.float32_json(c.score)] for c in row.classes]
                   for row in response.result.classifications]
        return {"results": results}

    def _regress(self, spec, body: bytes, record: CallRecord):
        """`:regress`: `examples` (+ `context`) as Classify's; `{"results": [value, ...]}`."""
        response = self._examples_call(regression_pb2.RegressionRequest(model_spec=spec),
                                       body, record, self.api.regress)
        return {"results": [json_tensor.float32_json(r.value)
                            for r in response.result.regressions]}

    def _examples_call(self, request, body: bytes, record: CallRecord, call):
        """`:classify`/`:regress`: the JSON's examples and signature into `request`, then `call`."""
        record_spec(record, request.model_spec)
        doc = json_tensor.parse_object(body)
        request.model_spec.signature_name = json_tensor.signature_name(doc)
        json_tensor.fill_examples(doc, request, self.core.limits.max_rows)
        response = call(request, self.timeout_s)
        record.answered = answered_version(response)
        return response

    def _status(self, spec, record: CallRecord):
        request = get_model_status_pb2.GetModelStatusRequest(model_spec=spec)
        record_spec(record, spec)
        response = self.api.status(request)
        return json_format.MessageToDict(
            response, always_print_fields_with_no_presence=True)

    def _metadata(self, spec, record: CallRecord):
        request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=spec, metadata_field=["signature_def"])
        record_spec(record, spec)
        response = self.api.metadata(request)
        record.answered = answered_version(response)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(sig_map)
        options = {"preserving_proto_field_name": True,
                   "always_print_fields_with_no_presence": True}
        return {"model_spec": json_format.MessageToDict(response.model_spec, **options),
                         "metadata": {"signature_def": json_format.MessageToDict(sig_map,
                                                                                 **options)}}


def _model_spec(name: str, version: str | None, label: str | None):
    spec = model_pb2.ModelSpec(name=urllib.parse.unquote(name or ""))
    if version is not None:
        number = parse_version_name(version)
        if number is None:
            raise _invalid(f"Failed to convert version: {clip(version)} to numeric.")
        spec.version.value = number
    if label is not None:
        spec.version_label = urllib.parse.unquote(label)
    return spec


def _spec_parts(spec) -> tuple[str, int | None, str | None]:
    choice = spec.WhichOneof("version_choice")
    return (spec.name, spec.version.value if choice == "version" else None,
            spec.version_label if choice == "version_label" else None)
