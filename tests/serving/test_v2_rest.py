"""The V2 (Open Inference Protocol) REST API of `ampflow serve`, over real HTTP on loopback.

Every answer is compared with TF Serving's Predict on the same server (gRPC), every datatype
goes through a model that echoes it, and every refusal has the protocol's HTTP code and a
`{"error": ...}` body. The metrics tests cover the one call wrapper of #23.
"""

from __future__ import annotations

import json
import re
import struct
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import MODEL, free_port, install_version, predict_request, running_server
from tensorflow_serving.apis import prediction_service_pb2_grpc
from v2_test_helpers import ECHO_MODEL, echo_values, http, write_echo_model

from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.model_format import image_example
from ampflow.serving.testing import sample_images

pytestmark = [pytest.mark.serving, pytest.mark.timeout(120)]

LIMIT = 1024 * 1024
BATCH_CAP = 8192  # rows; 5000 rows of 8x8x1 float32 (1.28 MB) pass it and exceed LIMIT


@pytest.fixture(scope="module")
def server(model_store, tmp_path_factory):
    """`ampflow serve`: the contract model (versions 1, 2; label stable=1) and the echo model."""
    root = tmp_path_factory.mktemp("v2rest")
    for version in (1, 2):
        install_version(model_store, root / MODEL, version)
    write_echo_model(root / ECHO_MODEL)
    models = (ModelConfig(MODEL, root / MODEL, version_policy="all",
                          version_labels={"stable": 1}),
              ModelConfig(ECHO_MODEL, root / ECHO_MODEL))
    config = ServerConfig(models=models, host="127.0.0.1", port=0, rest_api_port=free_port(),
                          metrics_port=free_port(), max_message_bytes=LIMIT,
                          max_request_batch_size=BATCH_CAP, grace_s=1.0)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def base_url(server) -> str:
    return f"http://{server.rest_address}"


@pytest.fixture(scope="module")
def predict(server):
    """TF Serving's Predict over gRPC on the same server: {output: ndarray}."""
    channel = grpc.insecure_channel(server.address)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def _predict(images, **spec):
        response = stub.Predict(predict_request(MODEL, images, **spec), timeout=30)
        return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}

    yield _predict
    channel.close()


def _body(status_headers_body) -> dict:
    return json.loads(status_headers_body[2])


def _infer_json(images, **extra) -> dict:
    return {"inputs": [{"name": "images", "datatype": "FP32", "shape": list(images.shape),
                        "data": images.ravel().tolist()}], **extra}


# ---- health and metadata ---------------------------------------------------------------------

def test_v2_health_live_and_ready_answer_true(base_url):
    assert _body(http(base_url, "GET", "/v2/health/live")) == {"live": True}
    status, _, body = http(base_url, "GET", "/v2/health/ready")
    assert (status, json.loads(body)) == (200, {"ready": True})


def test_v2_server_metadata_names_the_binary_extension(base_url):
    meta = _body(http(base_url, "GET", "/v2"))
    assert meta["name"] == "ampflow" and meta["version"]
    assert "binary_tensor_data" in meta["extensions"]


def test_v2_model_metadata_lists_signature_tensors_with_v2_datatypes(base_url):
    status, _, body = http(base_url, "GET", f"/v2/models/{MODEL}")
    assert status == 200
    assert json.loads(body) == {
        "name": MODEL, "versions": ["2", "1"], "platform": "tensorflow_savedmodel",
        "inputs": [{"name": "images", "datatype": "FP32", "shape": [-1, 8, 8, 1]}],
        "outputs": [{"name": "class_ids", "datatype": "INT64", "shape": [-1]},
                    {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]}
    assert _body(http(base_url, "GET", f"/v2/models/{MODEL}/versions/1"))["versions"] == ["1"]


@pytest.mark.parametrize(("path", "expected"), [
    (f"/v2/models/{MODEL}/ready", 200),
    (f"/v2/models/{MODEL}/versions/1/ready", 200),
    (f"/v2/models/{MODEL}/versions/stable/ready", 200),
    (f"/v2/models/{MODEL}/versions/7/ready", 400),
    ("/v2/models/nope/ready", 404),
])
def test_v2_model_ready_codes(base_url, path, expected):
    status, _, body = http(base_url, "GET", path)
    assert status == expected
    assert ("ready" if expected == 200 else "error") in json.loads(body)


# ---- inference ----------------------------------------------------------------------------------

def test_v2_infer_json_equals_tf_serving_predict(base_url, predict):
    images = sample_images(3, seed=5)
    status, headers, body = http(base_url, "POST", f"/v2/models/{MODEL}/infer",
                                 _infer_json(images, id="req-7"))
    assert status == 200, body
    answer = json.loads(body)
    assert headers["content-type"] == "application/json"
    assert (answer["model_name"], answer["model_version"], answer["id"]) == (MODEL, "2", "req-7")
    expected = predict(images)
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert list(outputs) == ["class_ids", "probabilities"]
    assert outputs["probabilities"]["datatype"] == "FP32"
    assert outputs["probabilities"]["shape"] == [3, 10]
    np.testing.assert_array_equal(
        np.array(outputs["probabilities"]["data"], np.float32).reshape(3, 10),
        expected["probabilities"])
    assert outputs["class_ids"]["data"] == expected["class_ids"].tolist()


def test_v2_infer_version_label_and_nested_data_select_that_version(base_url, predict):
    images = sample_images(2, seed=1)
    payload = {"inputs": [{"name": "images", "datatype": "FP32", "shape": [2, 8, 8, 1],
                           "data": images.tolist()}],  # nested lists are row-major too
               "outputs": [{"name": "probabilities"}]}
    for version in ("1", "stable"):
        answer = _body(http(base_url, "POST", f"/v2/models/{MODEL}/versions/{version}/infer",
                            payload))
        assert answer["model_version"] == "1"
        assert [o["name"] for o in answer["outputs"]] == ["probabilities"]
        np.testing.assert_array_equal(
            np.array(answer["outputs"][0]["data"], np.float32).reshape(2, 10),
            predict(images, version=1)["probabilities"])


def _binary_request(images: np.ndarray, outputs=None, parameters=None) -> tuple[bytes, dict]:
    head = {"inputs": [{"name": "images", "datatype": "FP32", "shape": list(images.shape),
                        "parameters": {"binary_data_size": images.nbytes}}]}
    if outputs is not None:
        head["outputs"] = outputs
    if parameters is not None:
        head["parameters"] = parameters
    text = json.dumps(head).encode()
    return text + images.astype("<f4").tobytes(), {
        "Inference-Header-Content-Length": str(len(text)),
        "Content-Type": "application/octet-stream"}


def _binary_outputs(headers, body) -> tuple[dict, dict[str, bytes]]:
    length = int(headers["inference-header-content-length"])
    answer, tail, offset, raw = json.loads(body[:length]), body[length:], 0, {}
    for output in answer["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            raw[output["name"]] = tail[offset:offset + size]
            offset += size
    assert offset == len(tail)
    return answer, raw


def test_v2_infer_binary_extension_in_and_out_equals_predict(base_url, predict):
    images = sample_images(4, seed=9)
    body, headers = _binary_request(images, outputs=[
        {"name": "probabilities", "parameters": {"binary_data": True}},
        {"name": "class_ids", "parameters": {"binary_data": False}}])
    status, reply_headers, reply = http(base_url, "POST", f"/v2/models/{MODEL}/infer",
                                        raw=body, headers=headers)
    assert status == 200, reply
    answer, raw = _binary_outputs(reply_headers, reply)
    expected = predict(images)
    np.testing.assert_array_equal(
        np.frombuffer(raw["probabilities"], "<f4").reshape(4, 10), expected["probabilities"])
    class_ids = next(o for o in answer["outputs"] if o["name"] == "class_ids")
    assert class_ids["data"] == expected["class_ids"].tolist()


def test_v2_infer_binary_data_output_parameter_makes_every_output_binary(base_url, predict):
    images = sample_images(1, seed=2)
    body, headers = _binary_request(images, parameters={"binary_data_output": True})
    status, reply_headers, reply = http(base_url, "POST", f"/v2/models/{MODEL}/infer",
                                        raw=body, headers=headers)
    assert status == 200
    _answer, raw = _binary_outputs(reply_headers, reply)
    assert set(raw) == {"class_ids", "probabilities"}
    assert np.frombuffer(raw["class_ids"], "<i8").tolist() == \
        predict(images)["class_ids"].tolist()


@pytest.mark.parametrize("binary", [False, True])
def test_v2_every_datatype_round_trips_through_the_echo_model(base_url, binary):
    values = echo_values()
    inputs, tail = [], b""
    for name, array in values.items():
        datatype = "BYTES" if array.dtype == object else name.upper()
        entry = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            raw = (b"".join(struct.pack("<I", len(v)) + v for v in array.ravel())
                   if array.dtype == object else array.tobytes())
            entry["parameters"] = {"binary_data_size": len(raw)}
            tail += raw
        else:
            entry["data"] = ([v.decode() for v in array.ravel()] if array.dtype == object
                             else array.ravel().tolist())
        inputs.append(entry)
    head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": binary}}).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))} if binary else {}
    status, reply_headers, reply = http(base_url, "POST", f"/v2/models/{ECHO_MODEL}/infer",
                                        raw=head + tail, headers=headers)
    assert status == 200, reply
    if binary:
        answer, raw = _binary_outputs(reply_headers, reply)
    else:
        answer, raw = json.loads(reply), {}
    by_name = {o["name"]: o for o in answer["outputs"]}
    for name, array in values.items():
        out = by_name[f"{name}_out"]
        assert out["datatype"] == ("BYTES" if array.dtype == object else name.upper())
        assert out["shape"] == [2, 2]
        if array.dtype == object:
            got = ([v.encode() for v in out["data"]] if not binary
                   else _split_bytes(raw[f"{name}_out"]))
            assert got == list(array.ravel())
        elif binary:
            np.testing.assert_array_equal(
                np.frombuffer(raw[f"{name}_out"], array.dtype.newbyteorder("<")).reshape(2, 2),
                array)
        else:
            np.testing.assert_array_equal(np.array(out["data"], array.dtype).reshape(2, 2),
                                          array)


def _split_bytes(raw: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(raw):
        (size,) = struct.unpack_from("<I", raw, offset)
        items.append(raw[offset + 4:offset + 4 + size])
        offset += 4 + size
    return items


def test_v2_signature_parameter_runs_classify_with_bytes_in_and_out(base_url):
    images = sample_images(2, seed=4)
    examples = [image_example(image).SerializeToString() for image in images]
    head = json.dumps({"parameters": {"signature_name": "classify"},
                       "inputs": [{"name": "inputs", "datatype": "BYTES", "shape": [2],
                                   "parameters": {"binary_data_size": sum(
                                       4 + len(e) for e in examples)}}],
                       "outputs": [{"name": "classes", "parameters": {"binary_data": False}},
                                   {"name": "scores", "parameters": {"binary_data": False}}]})
    tail = b"".join(struct.pack("<I", len(e)) + e for e in examples)
    status, _, reply = http(base_url, "POST", f"/v2/models/{MODEL}/infer",
                            raw=head.encode() + tail,
                            headers={"Inference-Header-Content-Length": str(len(head))})
    assert status == 200, reply
    classes = json.loads(reply)["outputs"][0]
    assert (classes["name"], classes["datatype"], classes["shape"]) == ("classes", "BYTES",
                                                                         [2, 10])
    assert classes["data"][:2] == ["digit_0", "digit_1"]


# ---- refusals ----------------------------------------------------------------------------------

def _images_input(**overrides) -> dict:
    entry = {"name": "images", "datatype": "FP32", "shape": [1, 8, 8, 1], "data": [0.0] * 64}
    entry.update(overrides)
    return {"inputs": [entry]}


@pytest.mark.parametrize(("path", "payload", "status", "message"), [
    ("/v2/models/nope/infer", _images_input(), 404, "Servable not found"),
    (f"/v2/models/{MODEL}/versions/7/infer", _images_input(), 404, "Available versions"),
    (f"/v2/models/{MODEL}/versions/beta/infer", _images_input(), 404, "has no version beta"),
    (f"/v2/models/{MODEL}/infer", _images_input(datatype="FP64"), 400,
     "must be FP32. Received: FP64"),
    (f"/v2/models/{MODEL}/infer", _images_input(datatype="FP99"), 400, "unknown datatype FP99"),
    (f"/v2/models/{MODEL}/infer", _images_input(shape=[1, 8, 8]), 400, "must have shape"),
    (f"/v2/models/{MODEL}/infer", _images_input(shape=[1, 8, 8, "1"]), 400, "list of integers"),
    (f"/v2/models/{MODEL}/infer", _images_input(data=[0.0] * 63), 400, "needs 64 values"),
    (f"/v2/models/{MODEL}/infer", _images_input(data=[True] * 64), 400, "not a FP32 value"),
    (f"/v2/models/{MODEL}/infer", _images_input(name="pixels"), 400, "expects inputs"),
    (f"/v2/models/{MODEL}/infer", {**_images_input(), "outputs": [{"name": "logits"}]}, 400,
     "output tensor alias not found"),
    (f"/v2/models/{MODEL}/infer", {"inputs": []}, 400, "non-empty list"),
    (f"/v2/models/{MODEL}/infer", [1, 2], 400, "must be a JSON object"),
    (f"/v2/models/{MODEL}/infer", _images_input(shape=[9000, 8, 8, 1]), 400,
     "takes at most 8192 rows"),
    ("/v2/models/nope/versions/1/infer/extra", _images_input(), 404, "no V2 endpoint"),
])
def test_v2_infer_refusals_have_protocol_codes_and_error_bodies(base_url, path, payload,
                                                                status, message):
    code, headers, body = http(base_url, "POST", path, payload)
    assert code == status, body
    assert headers["content-type"] == "application/json"
    error = json.loads(body)
    assert list(error) == ["error"] and message in error["error"], error


def test_v2_declared_size_over_the_byte_limit_is_refused_before_building(base_url):
    # 5000 x 8 x 8 x 1 float32 = 1.28 MB declared > the 1 MiB limit: RESOURCE_EXHAUSTED (429)
    # from the shape alone; had the one value sent been decoded or counted first, it would be
    # a 400 ("needs 320000 values").
    status, _, body = http(base_url, "POST", f"/v2/models/{MODEL}/infer",
                           _images_input(shape=[5000, 8, 8, 1], data=[0.0]))
    assert status == 429, body
    assert "--max-message-bytes" in json.loads(body)["error"]


def test_v2_bad_json_and_bad_binary_framing_are_400(base_url):
    path = f"/v2/models/{MODEL}/infer"
    status, _, body = http(base_url, "POST", path, raw=b"{not json")
    assert status == 400 and "JSON parse error" in json.loads(body)["error"]
    images = sample_images(1)
    raw, headers = _binary_request(images)
    for broken, why in ((raw[:-4], "does not fit"), (raw + b"xx", "bytes of binary data after")):
        status, _, body = http(base_url, "POST", path, raw=broken, headers=headers)
        assert status == 400 and why in json.loads(body)["error"], body
    status, _, body = http(base_url, "POST", path, raw=raw,
                           headers={**headers, "Inference-Header-Content-Length": "99999999"})
    assert status == 400 and "Inference-Header-Content-Length" in json.loads(body)["error"]


def test_v2_body_over_the_limit_is_429_before_parsing(base_url):
    status, _, body = http(base_url, "POST", f"/v2/models/{MODEL}/infer",
                           raw=b"[" + b"0," * (LIMIT // 2) + b"0]")
    assert status == 429
    assert "--max-message-bytes" in json.loads(body)["error"]


def test_v2_wrong_method_is_refused_with_an_error_body(base_url):
    status, _, body = http(base_url, "GET", f"/v2/models/{MODEL}/infer")
    assert status == 501 and "use POST" in json.loads(body)["error"]


# ---- metrics: one call wrapper for every transport (#23) --------------------------------------

def _metrics(server) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


def _count(body: str, metric: str, **labels) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{metric}{{{re.escape(wanted)}}} (\S+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_rest_predict_of_the_latest_version_is_labelled_by_the_version_that_answered(
        server, base_url, predict):
    """Before #23's fix REST labelled a latest-version call version="" and gRPC version="2"."""
    before = _metrics(server)
    images = sample_images(1).tolist()
    status, _, _ = http(base_url, "POST", f"/v1/models/{MODEL}:predict", {"instances": images})
    assert status == 200
    predict(sample_images(1))
    after = _metrics(server)
    labels = {"method": "Predict", "model": MODEL, "version": "2"}
    assert _count(after, "ampflow_serving_requests_total", **labels) - \
        _count(before, "ampflow_serving_requests_total", **labels) == 2


def test_rest_errors_are_counted_like_grpc_errors(server, base_url):
    """Before #23's fix a REST call that failed was not counted at all."""
    labels = {"code": "NOT_FOUND", "method": "Predict", "model": MODEL, "version": "<unknown>"}
    before = _count(_metrics(server), "ampflow_serving_errors_total", **labels)
    status, _, _ = http(base_url, "POST", f"/v1/models/{MODEL}/versions/42:predict",
                        {"instances": sample_images(1).tolist()})
    assert status == 404
    assert _count(_metrics(server), "ampflow_serving_errors_total", **labels) - before == 1


def test_v2_infer_is_counted_as_model_infer_with_the_answering_version(server, base_url):
    labels = {"method": "ModelInfer", "model": MODEL, "version": "1"}
    before = _count(_metrics(server), "ampflow_serving_requests_total", **labels)
    http(base_url, "POST", f"/v2/models/{MODEL}/versions/stable/infer",
         _infer_json(sample_images(1)))
    assert _count(_metrics(server), "ampflow_serving_requests_total", **labels) - before == 1


# ---- one port, two doors: which protocol answers which path ---------------------------------

@pytest.mark.parametrize(("path", "status", "error"), [
    ("/v2", 200, None), ("/v2/", 200, None),
    ("/v2/unknown", 404, "no V2 endpoint /v2/unknown"),
    ("/v2x", 400, "Malformed request: GET /v2x"),  # not under /v2: TF Serving's
    (f"/v1/models/{MODEL}/versions/1?verbose=1", 200, None),
    ("/nothing", 400, "Malformed request: GET /nothing"),
])
def test_each_path_is_answered_by_its_protocols_door(base_url, path, status, error):
    got, headers, body = http(base_url, "GET", path)
    assert (got, headers["content-type"]) == (status, "application/json")
    doc = json.loads(body)
    if error is not None:
        assert doc == {"error": error}
    elif path.startswith("/v2"):
        assert doc["name"] == "ampflow"
    else:
        assert doc["model_version_status"][0]["version"] == "1"


def test_both_rest_protocols_answer_through_one_door_shape():
    # one way a REST request is counted and an error enveloped, for /v1 and /v2 alike
    from ampflow.serving.protocols.rest import RestDoor
    from ampflow.serving.protocols.tf_serving_rest import TFServingRestHandler
    from ampflow.serving.protocols.v2_rest import V2RestHandler

    assert issubclass(TFServingRestHandler, RestDoor) and issubclass(V2RestHandler, RestDoor)
    assert TFServingRestHandler.handle is V2RestHandler.handle is RestDoor.handle
