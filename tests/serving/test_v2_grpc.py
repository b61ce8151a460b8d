"""`inference.GRPCInferenceService` (KServe V2) on the gRPC port of `ampflow serve`.

Real gRPC over loopback with the vendored protocol's messages: readiness, metadata, ModelInfer
with raw and typed contents equal to TF Serving's Predict on the same port, every datatype
through an echo model, and the protocol's status codes for every refusal.
"""

from __future__ import annotations

import struct

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serving_helpers import MODEL, install_version, predict_request, running_server
from tensorflow_serving.apis import prediction_service_pb2_grpc
from v2_test_helpers import ECHO_MODEL, echo_values, v2_stub, write_echo_model

from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.protocols import grpc_predict_v2_pb2 as pb
from ampflow.serving.testing import sample_images

pytestmark = [pytest.mark.serving, pytest.mark.timeout(120)]

LIMIT = 1024 * 1024
TYPED_ECHO = "echo_typed"  # the echo model without FP16, which has no typed contents field
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
            "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
            "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
            "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


@pytest.fixture(scope="module")
def server(model_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("v2grpc")
    for version in (1, 2):
        install_version(model_store, root / MODEL, version)
    write_echo_model(root / ECHO_MODEL)
    write_echo_model(root / TYPED_ECHO, skip=("FP16",))
    models = (ModelConfig(MODEL, root / MODEL, version_policy="all",
                          version_labels={"stable": 1}),
              ModelConfig(ECHO_MODEL, root / ECHO_MODEL),
              ModelConfig(TYPED_ECHO, root / TYPED_ECHO))
    config = ServerConfig(models=models, host="127.0.0.1", port=0, max_message_bytes=LIMIT,
                          max_request_batch_size=8192, grace_s=1.0)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as chan:
        yield chan


@pytest.fixture(scope="module")
def call(channel):
    """call(method, request) -> response, with a deadline."""
    stubs = {}

    def _call(method: str, request):
        stub = stubs.setdefault(method, v2_stub(channel, method))
        return stub(request, timeout=30)

    return _call


def _predict(channel, images, **spec) -> dict[str, np.ndarray]:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response = stub.Predict(predict_request(MODEL, images, **spec), timeout=30)
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def _raw_request(images: np.ndarray, **fields) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL, **fields)
    request.inputs.add(name="images", datatype="FP32", shape=list(images.shape))
    request.raw_input_contents.append(images.astype("<f4").tobytes())
    return request


def _outputs(response) -> dict[str, np.ndarray]:
    """Raw outputs decoded by their declared datatype and shape."""
    dtypes = {"FP32": "<f4", "INT64": "<i8"}
    assert len(response.raw_output_contents) == len(response.outputs)
    return {o.name: np.frombuffer(raw, dtypes[o.datatype]).reshape(list(o.shape))
            for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)}


# ---- health and metadata ---------------------------------------------------------------------

def test_v2_grpc_server_live_ready_and_metadata(call):
    assert call("ServerLive", pb.ServerLiveRequest()).live
    assert call("ServerReady", pb.ServerReadyRequest()).ready
    meta = call("ServerMetadata", pb.ServerMetadataRequest())
    assert meta.name == "ampflow" and "binary_tensor_data" in meta.extensions


@pytest.mark.parametrize(("name", "version", "ready"), [
    (MODEL, "", True), (MODEL, "1", True), (MODEL, "stable", True), (MODEL, "7", False),
    ("nope", "", False),
])
def test_v2_grpc_model_ready_is_false_for_anything_unknown(call, name, version, ready):
    assert call("ModelReady", pb.ModelReadyRequest(name=name, version=version)).ready is ready


def test_v2_grpc_model_metadata_has_v2_datatypes_and_served_versions(call):
    meta = call("ModelMetadata", pb.ModelMetadataRequest(name=MODEL))
    assert (meta.name, list(meta.versions), meta.platform) == (MODEL, ["2", "1"],
                                                               "tensorflow_savedmodel")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("images", "FP32", [-1, 8, 8, 1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("class_ids", "INT64", [-1]), ("probabilities", "FP32", [-1, 10])]


def test_v2_service_has_its_own_grpc_health_status(channel):
    health = health_pb2_grpc.HealthStub(channel)
    answer = health.Check(health_pb2.HealthCheckRequest(
        service="inference.GRPCInferenceService"), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


# ---- inference ----------------------------------------------------------------------------------

def test_v2_grpc_infer_raw_equals_tf_serving_predict_and_echoes_the_id(call, channel):
    images = sample_images(3, seed=11)
    response = call("ModelInfer", _raw_request(images, id="abc-1"))
    assert (response.model_name, response.model_version, response.id) == (MODEL, "2", "abc-1")
    got, expected = _outputs(response), _predict(channel, images)
    assert list(got) == ["class_ids", "probabilities"]
    np.testing.assert_array_equal(got["probabilities"], expected["probabilities"])
    np.testing.assert_array_equal(got["class_ids"], expected["class_ids"])


def test_v2_grpc_infer_typed_contents_version_label_and_output_selection(call, channel):
    images = sample_images(2, seed=3)
    request = pb.ModelInferRequest(model_name=MODEL, model_version="stable")
    tensor = request.inputs.add(name="images", datatype="FP32", shape=[2, 8, 8, 1])
    tensor.contents.fp32_contents.extend(images.ravel().tolist())
    request.outputs.add(name="probabilities")
    response = call("ModelInfer", request)
    assert response.model_version == "1"
    assert [o.name for o in response.outputs] == ["probabilities"]
    np.testing.assert_array_equal(_outputs(response)["probabilities"],
                                  _predict(channel, images, version=1)["probabilities"])


def _echo_request(model: str, values: dict, encoding: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    for name, array in values.items():
        datatype = "BYTES" if array.dtype == object else name.upper()
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if encoding == "raw":
            request.raw_input_contents.append(
                b"".join(struct.pack("<I", len(v)) + v for v in array.ravel())
                if array.dtype == object else array.tobytes())
        elif datatype in CONTENTS:  # FP16 has no typed field: left empty
            getattr(tensor.contents, CONTENTS[datatype]).extend(array.ravel().tolist())
    return request


@pytest.mark.parametrize(("model", "encoding"), [(ECHO_MODEL, "raw"), (TYPED_ECHO, "typed")])
def test_v2_grpc_every_datatype_round_trips_through_the_echo_model(call, model, encoding):
    values = echo_values(skip=("FP16",) if model == TYPED_ECHO else ())
    response = call("ModelInfer", _echo_request(model, values, encoding))
    by_name = dict(zip([o.name for o in response.outputs], zip(
        response.outputs, response.raw_output_contents, strict=True), strict=True))
    assert set(by_name) == {f"{name}_out" for name in values}
    for name, array in values.items():
        out, raw = by_name[f"{name}_out"]
        assert list(out.shape) == [2, 2]
        if array.dtype == object:
            assert out.datatype == "BYTES"
            items, offset = [], 0
            while offset < len(raw):
                (size,) = struct.unpack_from("<I", raw, offset)
                items.append(raw[offset + 4:offset + 4 + size])
                offset += 4 + size
            assert items == list(array.ravel())
        else:
            assert out.datatype == name.upper()
            np.testing.assert_array_equal(np.frombuffer(raw, array.dtype).reshape(2, 2), array)


def test_v2_grpc_fp16_has_no_typed_contents(call):
    request = _echo_request(ECHO_MODEL, echo_values(), "typed")  # fp16 has no field: empty
    with pytest.raises(grpc.RpcError) as error:
        call("ModelInfer", request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "FP16 values travel only in raw_input_contents" in error.value.details()


@pytest.mark.parametrize(("name", "bad"), [("int8", 300), ("uint8", 256), ("int16", -40000)])
def test_v2_grpc_typed_integers_out_of_range_are_invalid(call, name, bad):
    values = echo_values(skip=("FP16",))
    request = _echo_request(TYPED_ECHO, values, "typed")
    tensor = next(t for t in request.inputs if t.name == name)
    field = getattr(tensor.contents, CONTENTS[name.upper()])
    field[0] = bad
    with pytest.raises(grpc.RpcError) as error:
        call("ModelInfer", request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"does not fit {name.upper()}" in error.value.details()


# ---- refusals ----------------------------------------------------------------------------------

def _images(**overrides) -> pb.ModelInferRequest:
    fields = {"model_name": MODEL, "model_version": ""}
    fields.update({k: v for k, v in overrides.items() if k in fields})
    request = pb.ModelInferRequest(**fields)
    tensor = request.inputs.add(name=overrides.get("name", "images"),
                                datatype=overrides.get("datatype", "FP32"),
                                shape=overrides.get("shape", [1, 8, 8, 1]))
    raw = overrides.get("raw", np.zeros(64, "<f4").tobytes())
    if raw is not None:
        request.raw_input_contents.append(raw)
    for field, values in overrides.get("contents", {}).items():
        getattr(tensor.contents, field).extend(values)
    return request


@pytest.mark.parametrize(("request_fields", "code", "message"), [
    ({"model_name": "nope"}, grpc.StatusCode.NOT_FOUND, "Servable not found"),
    ({"model_version": "7"}, grpc.StatusCode.NOT_FOUND, "Available versions"),
    ({"model_version": "beta"}, grpc.StatusCode.NOT_FOUND, "has no version beta"),
    ({"model_name": ""}, grpc.StatusCode.INVALID_ARGUMENT, "model name is required"),
    ({"datatype": "INT32"}, grpc.StatusCode.INVALID_ARGUMENT, "must be FP32. Received: INT32"),
    ({"datatype": "BF16"}, grpc.StatusCode.INVALID_ARGUMENT, "unknown datatype BF16"),
    ({"shape": [1, 8, 8]}, grpc.StatusCode.INVALID_ARGUMENT, "must have shape"),
    ({"shape": [1, 8, 8, -1]}, grpc.StatusCode.INVALID_ARGUMENT, "negative"),
    ({"name": "pixels"}, grpc.StatusCode.INVALID_ARGUMENT, "expects inputs"),
    ({"raw": b"\0" * 255}, grpc.StatusCode.INVALID_ARGUMENT, "needs 256 bytes"),
    ({"raw": None, "contents": {"fp32_contents": [0.0] * 63}}, grpc.StatusCode.INVALID_ARGUMENT,
     "needs 64 values"),
    ({"raw": None, "contents": {"int_contents": [0] * 64}}, grpc.StatusCode.INVALID_ARGUMENT,
     "carries its values in fp32_contents"),
    ({"contents": {"fp32_contents": [0.0] * 64}}, grpc.StatusCode.INVALID_ARGUMENT,
     "both contents and raw_input_contents"),
    # 5000 rows of 8x8x1 float32 = 1.28 MB declared > 1 MiB: refused from the shape, before
    # the 256 raw bytes sent are compared with it (that would be INVALID_ARGUMENT)
    ({"shape": [5000, 8, 8, 1]}, grpc.StatusCode.RESOURCE_EXHAUSTED, "--max-message-bytes"),
])
def test_v2_grpc_infer_refusals_have_protocol_codes(call, request_fields, code, message):
    with pytest.raises(grpc.RpcError) as error:
        call("ModelInfer", _images(**request_fields))
    assert error.value.code() == code
    assert message in error.value.details()


def test_v2_grpc_raw_contents_must_cover_every_input(call):
    request = _images()
    request.raw_input_contents.append(b"")
    with pytest.raises(grpc.RpcError) as error:
        call("ModelInfer", request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "one entry per input" in error.value.details()


def test_v2_grpc_unknown_output_and_classification_are_invalid(call):
    for params in ({}, {"classification": pb.InferParameter(int64_param=3)}):
        request = _images()
        output = request.outputs.add(name="logits" if not params else "probabilities")
        for key, value in params.items():
            output.parameters[key].CopyFrom(value)
        with pytest.raises(grpc.RpcError) as error:
            call("ModelInfer", request)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_v2_grpc_undecodable_bytes_are_answered_internal(channel):
    method = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                 request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as error:
        method(b"\xff\xff\xff", timeout=10)
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert "Invalid protobuf byte sequence" in error.value.details()


def test_v2_messages_live_in_a_private_descriptor_pool():
    from google.protobuf import descriptor_pool

    assert pb.DESCRIPTOR.pool is not descriptor_pool.Default()
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("inference.ModelInferRequest")


def test_v2_grpc_infer_goes_through_server_side_batching(model_store, tmp_path, start_server):
    from concurrent.futures import ThreadPoolExecutor

    from ampflow.serving.config import BatchingConfig

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    import re
    import urllib.request

    from serving_helpers import free_port

    port = free_port()
    running = start_server(base, metrics_port=port,
                           batching=BatchingConfig(max_batch_size=16, batch_timeout_ms=200))

    def batched_requests() -> float:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        match = re.search(rb"^ampflow_serving_batch_requests_sum (\S+)$", body, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    before = batched_requests()  # the warm-up records ran through the batcher too
    inputs = [sample_images(1 + i % 3, seed=i) for i in range(8)]
    with grpc.insecure_channel(running.address) as chan:
        infer = v2_stub(chan, "ModelInfer")
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda x: infer(_raw_request(x), timeout=30), inputs))
        assert batched_requests() - before == 8  # every V2 call went through the batcher
        for images, answer in zip(inputs, answers, strict=True):
            expected = _predict(chan, images)
            # a merged batch may round differently from a run of its own rows (oneDNN)
            np.testing.assert_allclose(_outputs(answer)["probabilities"],
                                       expected["probabilities"], rtol=1e-5, atol=1e-7)
