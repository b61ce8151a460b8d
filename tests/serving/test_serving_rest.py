"""TF Serving's REST API: the same answers as gRPC on the same requests, TF Serving's JSON and
HTTP codes, bounded bodies. Runs against an in-process `ampflow serve` (gRPC + REST), or against
AMPFLOW_SERVING_TARGET (gRPC) + AMPFLOW_SERVING_REST_TARGET (REST) of one real TF Serving
serving the test model (see conftest.py); messages are compared only on our server."""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format
from serving_helpers import (
    EXTERNAL_TARGET,
    MODEL,
    free_port,
    install_version,
    local_only,
    predict_request,
)
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.model_format import image_example
from ampflow.serving.testing import sample_images
from ampflow.serving.transport.http import HTTP_STATUS, drain_bytes

pytestmark = [pytest.mark.serving, pytest.mark.timeout(120)]

LIMIT = 1024 * 1024
BATCH_CAP = 64
REST_TARGET = os.environ.get("AMPFLOW_SERVING_REST_TARGET")


@pytest.fixture(scope="module")
def target(model_store, tmp_path_factory):
    """(gRPC address, REST base URL, local?)."""
    if EXTERNAL_TARGET:
        if not REST_TARGET:
            pytest.skip("set AMPFLOW_SERVING_REST_TARGET=host:8501 with AMPFLOW_SERVING_TARGET")
        yield EXTERNAL_TARGET, f"http://{REST_TARGET}", False
        return
    from ampflow.serving.server import start_local_server

    base = tmp_path_factory.mktemp("rest") / MODEL
    install_version(model_store, base, 1)
    config = ServerConfig(models=(ModelConfig(MODEL, base),), host="127.0.0.1", port=0,
                          rest_api_port=free_port(), max_message_bytes=LIMIT,
                          max_request_batch_size=BATCH_CAP, grace_s=1.0)
    server = start_local_server(config)
    try:
        yield server.address, f"http://{server.rest_address}", True
    finally:
        server.stop(0.5)


@pytest.fixture(scope="module")
def stub(target):
    with grpc.insecure_channel(target[0]) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def rest(target, method: str, path: str, payload=None, raw: bytes | None = None):
    """(HTTP status, parsed JSON) of one REST call."""
    data = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    request = urllib.request.Request(target[1] + path, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _grpc_predict(stub, images, **spec) -> dict[str, np.ndarray]:
    response = stub.Predict(predict_request(MODEL, images, **spec), timeout=10)
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


# ---- the same answers as gRPC ------------------------------------------------------------------

def test_predict_row_format_equals_grpc_exactly(target, stub):
    images = sample_images(3, seed=11)
    status, body = rest(target, "POST", f"/v1/models/{MODEL}:predict",
                        {"instances": images.tolist()})
    assert status == 200, body
    expected = _grpc_predict(stub, images)
    assert len(body["predictions"]) == 3
    for i, row in enumerate(body["predictions"]):
        assert set(row) == {"class_ids", "probabilities"}
        # float32 written as the shortest decimal that reads back to the same float32
        np.testing.assert_array_equal(np.float32(row["probabilities"]),
                                      expected["probabilities"][i])
        assert row["class_ids"] == expected["class_ids"][i]


def test_predict_columnar_format_and_version_path_equal_grpc(target, stub):
    images = sample_images(2, seed=12)
    status, body = rest(target, "POST", f"/v1/models/{MODEL}/versions/1:predict",
                        {"signature_name": "serving_default",
                         "inputs": {"images": images.tolist()}})
    assert status == 200, body
    expected = _grpc_predict(stub, images, version=1)
    np.testing.assert_array_equal(np.float32(body["outputs"]["probabilities"]),
                                  expected["probabilities"])
    np.testing.assert_array_equal(body["outputs"]["class_ids"], expected["class_ids"])
    status, objects = rest(target, "POST", f"/v1/models/{MODEL}:predict",
                           {"instances": [{"images": image.tolist()} for image in images]})
    assert status == 200
    assert [row["class_ids"] for row in objects["predictions"]] == \
        expected["class_ids"].tolist()


def test_classify_equals_grpc_classify(target, stub):
    images = sample_images(2, seed=13)
    examples = [{"image": image.ravel().tolist()} for image in images]
    status, body = rest(target, "POST", f"/v1/models/{MODEL}:classify",
                        {"signature_name": "classify", "examples": examples})
    assert status == 200, body
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = "classify"
    request.input.example_list.examples.extend(image_example(i) for i in images)
    response = stub.Classify(request, timeout=10)
    expected = [[[c.label, c.score] for c in row.classes]
                for row in response.result.classifications]
    assert [[label for label, _ in row] for row in body["results"]] == \
        [[label for label, _ in row] for row in expected]
    np.testing.assert_array_equal(np.float32([[s for _, s in row] for row in body["results"]]),
                                  np.float32([[s for _, s in row] for row in expected]))


def test_classify_context_is_merged_into_each_example(target, stub):
    images = sample_images(2, seed=14)
    status, merged = rest(target, "POST", f"/v1/models/{MODEL}:classify", {
        "signature_name": "classify", "context": {"image": images[0].ravel().tolist()},
        "examples": [{}, {}]})
    assert status == 200, merged
    assert merged["results"][0] == merged["results"][1]


def test_status_and_metadata_equal_grpc(target):
    status, body = rest(target, "GET", f"/v1/models/{MODEL}")
    assert status == 200
    assert body == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK",
                                                           "error_message": ""}}]}
    with grpc.insecure_channel(target[0]) as channel:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = MODEL
        grpc_status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            request, timeout=10)
        metadata_request = get_model_metadata_pb2.GetModelMetadataRequest()
        metadata_request.model_spec.name = MODEL
        metadata_request.metadata_field.append("signature_def")
        grpc_metadata = prediction_service_pb2_grpc.PredictionServiceStub(
            channel).GetModelMetadata(metadata_request, timeout=10)
    assert json_format.ParseDict(body, get_model_status_pb2.GetModelStatusResponse()) == \
        grpc_status
    status, body = rest(target, "GET", f"/v1/models/{MODEL}/versions/1/metadata")
    assert status == 200
    assert body["model_spec"]["name"] == MODEL and body["model_spec"]["version"] == "1"
    sig_map = json_format.ParseDict(body["metadata"]["signature_def"],
                                    get_model_metadata_pb2.SignatureDefMap())
    expected = get_model_metadata_pb2.SignatureDefMap()
    grpc_metadata.metadata["signature_def"].Unpack(expected)
    assert sig_map == expected


# ---- errors: TF Serving's HTTP code for the gRPC code, the same message ------------------------

def _bad_cases():
    good = sample_images(1).tolist()
    return {
        # name: (method, path, payload, gRPC code the same request gets, message part)
        "unknown_model": ("POST", "/v1/models/nope:predict", {"instances": good},
                          grpc.StatusCode.NOT_FOUND, "Servable not found for request"),
        "unknown_version": ("POST", f"/v1/models/{MODEL}/versions/9:predict",
                            {"instances": good}, grpc.StatusCode.NOT_FOUND, "Specific("),
        "unknown_label": ("POST", f"/v1/models/{MODEL}/labels/nope:predict",
                          {"instances": good}, grpc.StatusCode.INVALID_ARGUMENT,
                          "Unrecognized servable version label"),
        "wrong_inner_dims": ("POST", f"/v1/models/{MODEL}:predict",
                             {"instances": np.zeros((1, 4, 4, 1)).tolist()},
                             grpc.StatusCode.INVALID_ARGUMENT,
                             "requested shape requires a multiple of 64"),
        "over_batch_cap": ("POST", f"/v1/models/{MODEL}:predict",
                           {"instances": np.zeros((BATCH_CAP + 1, 8, 8, 1)).tolist()},
                           grpc.StatusCode.INVALID_ARGUMENT, f"at most {BATCH_CAP} rows"),
        "bool_for_float": ("POST", f"/v1/models/{MODEL}:predict",
                           {"instances": [[[[True]] * 8] * 8]}, grpc.StatusCode.INVALID_ARGUMENT,
                           "is not of expected type: float"),
        "b64_for_float": ("POST", f"/v1/models/{MODEL}:predict",
                          {"instances": [{"b64": "iVBORw0K"}]}, grpc.StatusCode.INVALID_ARGUMENT,
                          'an encoded image goes to the "image_bytes" signature'),
        "string_for_float": ("POST", f"/v1/models/{MODEL}:predict",
                             {"instances": [[[["1.5"]] * 8] * 8]},
                             grpc.StatusCode.INVALID_ARGUMENT, "is not of expected type"),
        "ragged": ("POST", f"/v1/models/{MODEL}:predict",
                   {"instances": [good[0], good[0][:3]]}, grpc.StatusCode.INVALID_ARGUMENT,
                   "Encountered list at unexpected size"),
        "both_keys": ("POST", f"/v1/models/{MODEL}:predict",
                      {"instances": good, "inputs": good}, grpc.StatusCode.INVALID_ARGUMENT,
                      "expecting only one of 'inputs' or 'instances'"),
        "no_keys": ("POST", f"/v1/models/{MODEL}:predict", {"x": 1},
                    grpc.StatusCode.INVALID_ARGUMENT, "Missing 'inputs' or 'instances' key"),
        "not_an_object": ("POST", f"/v1/models/{MODEL}:predict", [1, 2],
                          grpc.StatusCode.INVALID_ARGUMENT, "Is not object"),
        "signature_not_string": ("POST", f"/v1/models/{MODEL}:predict",
                                 {"signature_name": 3, "instances": good},
                                 grpc.StatusCode.INVALID_ARGUMENT, "must be a string value"),
        "unknown_signature": ("POST", f"/v1/models/{MODEL}:predict",
                              {"signature_name": "nope", "instances": good},
                              grpc.StatusCode.INVALID_ARGUMENT, '"nope" not found'),
        "bad_b64": ("POST", f"/v1/models/{MODEL}:predict",
                    {"signature_name": "classify", "instances": [{"b64": "!!"}]},
                    grpc.StatusCode.INVALID_ARGUMENT, "Unable to base64 decode"),
        "classify_no_examples": ("POST", f"/v1/models/{MODEL}:classify",
                                 {"signature_name": "classify"},
                                 grpc.StatusCode.INVALID_ARGUMENT, "'examples' is expected"),
        "classify_bad_feature": ("POST", f"/v1/models/{MODEL}:classify",
                                 {"signature_name": "classify", "examples": [{"image": [None]}]},
                                 grpc.StatusCode.INVALID_ARGUMENT, "unexpected JSON type"),
        "regress_not_a_regression": ("POST", f"/v1/models/{MODEL}:regress", {"examples": [{}]},
                                     grpc.StatusCode.INVALID_ARGUMENT,
                                     "Expected one output Tensor."),
        "status_no_name": ("GET", "/v1/models", None, grpc.StatusCode.INVALID_ARGUMENT,
                           "Missing model name"),
        "status_unknown_model": ("GET", "/v1/models/nope", None, grpc.StatusCode.NOT_FOUND,
                                 "Could not find any versions of model nope"),
        "malformed_path": ("POST", f"/v1/models/{MODEL}:explode", {},
                           grpc.StatusCode.INVALID_ARGUMENT, "Malformed request"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_rest_bad_request_gets_tf_serving_http_code_and_error_json(case, target, stub):
    method, path, payload, code, text = _bad_cases()[case]
    status, body = rest(target, method, path, payload)
    assert status == HTTP_STATUS[code], body
    assert set(body) == {"error"}
    if target[2]:
        assert text in body["error"]
    _grpc_predict(stub, sample_images(1))  # the server still answers


def test_rest_and_grpc_give_the_same_message_for_the_same_bad_request(target, stub):
    if not target[2]:
        pytest.skip("messages are compared on our server only")
    images = np.zeros((1, 4, 4, 1), np.float32)
    with pytest.raises(grpc.RpcError) as info:
        _grpc_predict(stub, images)
    status, body = rest(target, "POST", f"/v1/models/{MODEL}:predict",
                        {"instances": images.tolist()})
    assert status == HTTP_STATUS[info.value.code()]
    assert body["error"] == info.value.details()


@local_only
def test_rest_body_over_the_limit_is_429_before_parsing(target, stub):
    status, body = rest(target, "POST", f"/v1/models/{MODEL}:predict",
                        raw=b"[" * (LIMIT + 10))
    assert status == 429 and "larger than" in body["error"]
    status, body = rest(target, "POST", f"/v1/models/{MODEL}:predict", raw=b"[" * 100_000)
    assert status == 400 and "JSON Parse error" in body["error"]
    status, body = rest(target, "POST", f"/v1/models/{MODEL}:predict", raw=b"")
    assert status == 400 and "document is empty" in body["error"]
    _grpc_predict(stub, sample_images(1))


def _raw_http(url: str, head: bytes, body: bytes = b"", pause_s: float = 0.0) -> bytes:
    """Send `head`, wait `pause_s`, send `body`, then read the answer until the server closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        time.sleep(pause_s)
        sock.sendall(body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _post_head(length: int) -> bytes:
    return (f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


@local_only
def test_rest_over_limit_body_written_after_the_headers_still_gets_the_429(target, stub):
    """The body arrives after the server could have answered (a client that writes the
    headers, then the body, then reads): it must read the 429, not a connection reset (the
    server used to answer and close at once, and CI saw urllib get ECONNRESET)."""
    body = b"[" * (LIMIT + 10)
    answer = _raw_http(target[1], _post_head(len(body)), body, pause_s=0.3)
    assert answer.startswith(b"HTTP/1.1 429 "), answer[:200]
    assert b"request body larger than" in answer
    _grpc_predict(stub, sample_images(1))


@local_only
def test_rest_body_declared_past_the_drain_bound_is_answered_without_reading_it(target):
    """A client that declares a huge body gets its 429 at once: nothing of it is read."""
    answer = _raw_http(target[1], _post_head(LIMIT + drain_bytes(LIMIT) + 1))
    assert answer.startswith(b"HTTP/1.1 429 "), answer[:200]


def test_rest_non_finite_values_round_trip(target, stub):
    images = sample_images(1, seed=15)
    images[0, 0, 0, 0] = np.nan
    raw = json.dumps({"instances": images.tolist()}).encode()  # Python writes NaN, as TF Serving
    status, body = rest(target, "POST", f"/v1/models/{MODEL}:predict", raw=raw)
    assert status == 200
    assert np.isnan(body["predictions"][0]["probabilities"]).all()


@pytest.mark.serving
@local_only
def test_cli_predict_over_rest_matches_grpc(model_store, tmp_path, start_server, capsys):
    from ampflow.serving.cli import main as serving_main

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, rest_api_port=free_port())
    npy = tmp_path / "digit.npy"
    np.save(npy, sample_images(1, seed=9)[0])
    assert serving_main(["predict", "--port", str(server.port), str(npy)]) == 0
    grpc_out = capsys.readouterr().out
    # the class names the model ships (assets/labels.txt, answered by classify), not ids
    assert re.search(r"digit\.npy: digit_\d \(\d\) [01]\.\d{4}, digit_\d", grpc_out), grpc_out
    rest_port = server.rest_address.rsplit(":", 1)[1]
    assert serving_main(["predict", "--protocol", "rest", "--port", rest_port, str(npy)]) == 0
    assert capsys.readouterr().out == grpc_out
    assert serving_main(["model-status", "--protocol", "rest", "--port", rest_port]) == 0
    assert "version 1: AVAILABLE" in capsys.readouterr().out


@pytest.mark.serving
@local_only
def test_rest_request_past_rest_api_timeout_in_ms_gets_504_deadline_exceeded(
        model_store, tmp_path, start_server):
    # TF Serving runs a REST request under RunOptions.timeout_in_ms (--rest_api_timeout_in_ms)
    # and answers DEADLINE_EXCEEDED as 504 (http_server.cc). A batch that waits 5 s for more
    # requests makes this one slow; both REST APIs answer at the 300 ms deadline.
    from ampflow.serving.config import BatchingConfig

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, rest_api_port=free_port(), rest_api_timeout_in_ms=300,
                          enable_warmup=False,  # (its requests would wait for batches too)
                          batching=BatchingConfig(max_batch_size=64, batch_timeout_ms=5000))
    url = f"http://{server.rest_address}"
    images = sample_images(1).tolist()
    v2_body = {"inputs": [{"name": "images", "shape": [1, *np.shape(images)[1:]],
                           "datatype": "FP32", "data": np.ravel(images).tolist()}]}
    for path, payload in ((f"/v1/models/{MODEL}:predict", {"instances": images}),
                          (f"/v2/models/{MODEL}/infer", v2_body)):
        request = urllib.request.Request(url + path, json.dumps(payload).encode(),
                                         {"content-type": "application/json"})
        started = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=30)
        took = time.monotonic() - started
        assert answer.value.code == HTTP_STATUS[grpc.StatusCode.DEADLINE_EXCEEDED] == 504
        assert "Deadline exceeded" in json.loads(answer.value.read())["error"]
        assert took < 4.0, took  # at the deadline, not when the batch runs


@local_only
def test_starting_the_rest_api_leaves_the_process_logging_alone(model_store, tmp_path,
                                                               start_server):
    # uvicorn's default log config closed every logging handler of the process that started a
    # REST API (found as pytest's own capture stream closed under a test that served REST).
    import logging

    class Recording(logging.Handler):
        closed = False

        def emit(self, record):
            pass

        def close(self):
            self.closed = True
            super().close()

    handler = Recording()
    logging.getLogger().addHandler(handler)
    try:
        base = tmp_path / MODEL
        install_version(model_store, base, 1)
        start_server(base, rest_api_port=free_port())
        assert not handler.closed
        assert logging.getLogger("uvicorn").handlers == []  # its lines go to the process's
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.mark.serving
@local_only
def test_cli_predict_and_metadata_never_import_tensorflow(model_store, tmp_path, start_server):
    # A query reads the signature's method and specs from the client's own protos: converting
    # them to TensorFlow's cost every `ampflow predict` a TensorFlow import (about 3 CPU-s).
    import subprocess
    import sys

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, rest_api_port=free_port())
    npy = tmp_path / "digit.npy"
    np.save(npy, sample_images(1, seed=9)[0])
    rest_port = server.rest_address.rsplit(":", 1)[1]
    commands = [(["predict", "--port", str(server.port), str(npy)], 0),
                (["predict", "--protocol", "rest", "--port", rest_port, str(npy)], 0),
                (["predict", "--port", str(server.port), "--signature", "classify", str(npy)], 0),
                (["model-metadata", "--port", str(server.port)], 0),
                # a signature the model lacks: one line naming the ones it has, either API
                (["predict", "--port", str(server.port), "--signature", "nope", str(npy)], 1),
                (["predict", "--protocol", "rest", "--port", rest_port, "--signature", "nope",
                  str(npy)], 1)]
    code = ("import sys; from ampflow.cli import main\n"
            f"for argv, expected in {commands!r}:\n"
            "    assert main(argv) == expected, argv\n"
            "print('tensorflow imported:', 'tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    missing = [line for line in done.stderr.splitlines() if "'nope' not found" in line]
    assert len(missing) == 2 and all(line.startswith("ampflow predict: error: ")
                                     and "Available: " in line for line in missing), done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.count("model ampflow version 1 signature") == 3, done.stdout
    assert '"method_name": "tensorflow/serving/classify"' in done.stdout.replace(
        '"methodName"', '"method_name"')
    assert done.stdout.rstrip().endswith("tensorflow imported: False"), done.stdout
