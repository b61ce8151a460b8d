"""Hostile requests (issue 14 items 1, 5, 7, 9): every limit is checked before anything is
allocated, answers carry TF Serving's codes, echoes of client input are short, and messages
never show a server path. Each case runs against one in-process server and is followed by a
good request, so "the server survived" is checked every time."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import MODEL, install_version, local_only, running_server
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.model_format import image_example
from ampflow.serving.testing import raw_tensor_proto, sample_images

pytestmark = [pytest.mark.serving, local_only, pytest.mark.timeout(120)]

LIMIT = 1024 * 1024  # the server's max message (and decoded tensor) bytes
BATCH_CAP = 16  # the server's max rows per request


@pytest.fixture(scope="module")
def server(model_store, tmp_path_factory):
    base = tmp_path_factory.mktemp("limits") / MODEL
    install_version(model_store, base, 1)
    install_version(model_store, base, 7, source=1)  # a complete copy whose pb is corrupt
    (base / "7" / "saved_model.pb").write_bytes(b"\x00corrupt")
    (base.parent / "empty").mkdir()  # a configured model with no version yet
    config = ServerConfig(models=(ModelConfig(MODEL, base, version_policy="all"),
                                  ModelConfig("empty", base.parent / "empty")),
                          host="127.0.0.1", port=0, max_message_bytes=LIMIT,
                          max_request_batch_size=BATCH_CAP, grace_s=1.0,
                          wait_for_base_path=True)  # (the empty one is served when filled)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address, options=[
            ("grpc.max_send_message_length", 4 * LIMIT)]) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _request(dims, dtype=types_pb2.DT_FLOAT, signature="serving_default", key="images",
             **values) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.model_spec.version.value = 1
    request.model_spec.signature_name = signature
    request.inputs[key].CopyFrom(raw_tensor_proto(dims, dtype, **values))
    return request


def _call(fn, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(request, timeout=30)
    return info.value


def _assert_alive(stub) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(sample_images(1)))
    assert stub.Predict(request, timeout=10).model_spec.version.value == 1


# ---- item 1: declared size checked before any allocation ----------------------------------------

def test_52_byte_request_declaring_4m_images_is_rejected_not_expanded(stub):
    request = _request((4_000_000, 8, 8, 1), float_val=[1.0])
    assert request.ByteSize() < 80
    error = _call(stub.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "batch size 4000000" in error.details() and f"at most {BATCH_CAP}" in error.details()
    _assert_alive(stub)


def test_declared_bytes_over_the_limit_with_short_value_list_is_resource_exhausted(stub):
    # Within the batch cap of a tensor whose signature has no fixed inner dims would need a
    # different model; here: a scalar-per-row string input of the classify signature, declared
    # huge with one value, and a float tensor declared past the byte limit via tensor_content.
    error = _call(stub.Predict, _request((3_000_000,), types_pb2.DT_STRING, "classify",
                                         "inputs", string_val=[b"x"]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "batch size 3000000" in error.details()
    error = _call(stub.Predict, _request((10, 8, 8, 1), tensor_content=b"\x00" * 4))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensor parsing error" in error.details()
    _assert_alive(stub)


def test_decoded_size_over_limit_is_resource_exhausted_before_decoding():
    from ampflow.serving.protocols import tensors
    from ampflow.serving.status import ServingStatusError

    proto = raw_tensor_proto((600, 1000), float_val=[1.0])
    with pytest.raises(ServingStatusError) as info:
        tensors.to_ndarray("x", proto, max_bytes=LIMIT)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2400000 bytes" in info.value.message and f"{LIMIT}" in info.value.message
    strings = raw_tensor_proto((10 ** 7,), types_pb2.DT_STRING, string_val=[b"x"])
    with pytest.raises(ServingStatusError) as info:
        tensors.to_ndarray("s", strings, max_bytes=LIMIT)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_overflowing_dimensions_are_invalid_argument_not_internal():
    from ampflow.serving.protocols import tensors
    from ampflow.serving.status import ServingStatusError

    # (2**62 + 1) * 4 wraps to 4 in int64 arithmetic: the old code filled 4 values, then
    # failed to reshape them (INTERNAL with a traceback).
    for dims in ((2 ** 62 + 1, 4), (2 ** 62, 2 ** 62, 8), (2 ** 61, 64), (-1, 3)):
        proto = raw_tensor_proto(dims, float_val=[1.0])
        with pytest.raises(ServingStatusError) as info:
            tensors.to_ndarray("x", proto, max_bytes=LIMIT)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT, dims


def test_overflowing_dimensions_over_grpc_are_invalid_argument(stub):
    for dims in ((2 ** 62 + 1, 8, 8, 1), (2 ** 62, 8, 8, 1)):
        error = _call(stub.Predict, _request(dims, float_val=[1.0]))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    error = _call(stub.Predict, _request((2 ** 62, 2 ** 62, 2 ** 62, 2 ** 62), float_val=[1.0]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    _assert_alive(stub)


# ---- item 5: the limits run before any tensor is built; a batch cap --------------------------
# (the graph decides shapes, as in TF Serving: a huge declared shape meets the rows and bytes
# limits first, whatever its rank)

@pytest.mark.parametrize(("dims", "code", "text"), [
    ((50_000_000, 1), grpc.StatusCode.INVALID_ARGUMENT, "has batch size 50000000"),
    ((1, 50_000_000), grpc.StatusCode.RESOURCE_EXHAUSTED, f"more than {LIMIT} bytes"),
])
def test_huge_declared_shape_of_another_rank_is_refused_by_the_limits_unbuilt(stub, dims,
                                                                             code, text):
    import tracemalloc

    request = _request(dims, float_val=[1.0])  # 200 MB if expanded
    tracemalloc.start()  # numpy reports its buffers to tracemalloc; the server is in-process
    try:
        error = _call(stub.Predict, request)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2 ** 20, f"{peak / 2 ** 20:.0f} MiB allocated to reject the request"
    assert error.code() == code, error.details()
    assert text in error.details()
    _assert_alive(stub)


def test_request_batch_over_the_cap_is_invalid_argument_and_never_runs(stub):
    images = sample_images(BATCH_CAP + 1)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
    error = _call(stub.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"batch size {BATCH_CAP + 1}" in error.details()
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(images[:BATCH_CAP]))
    assert stub.Predict(request, timeout=10).outputs["class_ids"].tensor_shape.dim[0].size == \
        BATCH_CAP


def test_classify_example_count_and_merged_context_size_are_limited(stub):
    too_many = classification_pb2.ClassificationRequest()
    too_many.model_spec.name = MODEL
    too_many.model_spec.signature_name = "classify"
    too_many.input.example_list.examples.extend(
        [image_example(sample_images(1)[0])] * (BATCH_CAP + 1))
    error = _call(stub.Classify, too_many)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{BATCH_CAP + 1} examples" in error.details()
    # 200 KB of context merged into each of 16 examples would be 3.2 MB > the 1 MB limit.
    amplified = classification_pb2.ClassificationRequest()
    amplified.model_spec.name = MODEL
    amplified.model_spec.signature_name = "classify"
    ctx = amplified.input.example_list_with_context.context
    ctx.features.feature["padding"].float_list.value.extend([0.5] * 50_000)
    for _ in range(BATCH_CAP):
        amplified.input.example_list_with_context.examples.add()
    error = _call(stub.Classify, amplified)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert "context" in error.details()
    _assert_alive(stub)


# ---- item 7: echoes of client input are truncated ------------------------------------------------

def test_2001_input_names_get_the_real_error_not_resource_exhausted(stub):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    for i in range(2001):
        request.inputs[f"input_name_{i:05d}_" + "x" * 40].dtype = types_pb2.DT_FLOAT
    error = _call(stub.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "input size does not match signature" in error.details()
    assert len(error.details()) <= 2048
    _assert_alive(stub)


def test_100kb_model_name_gets_not_found_with_a_short_message(stub):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m" * 100_000
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(sample_images(1)))
    error = _call(stub.Predict, request)
    assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()[:200]
    assert len(error.details()) <= 2048
    _assert_alive(stub)


# ---- item 9: TF Serving's codes and names; no paths in messages ----------------------------------

def test_empty_model_name_is_invalid_argument(stub):
    request = _request((1, 8, 8, 1), tensor_content=sample_images(1).tobytes())
    request.model_spec.name = ""
    error = _call(stub.Predict, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ModelSpec has no name specified" in error.details()


def test_model_status_reports_load_error_codes_descending_without_paths(server, channel):
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = MODEL
    response = stub.GetModelStatus(request, timeout=10)
    rows = [(s.version, s.state, s.status.error_code) for s in response.model_version_status]
    # TF Serving lists versions newest first; a pb that does not parse is DATA_LOSS.
    assert rows == [(7, 50, grpc.StatusCode.DATA_LOSS.value[0]), (1, 30, 0)]
    message = response.model_version_status[0].status.error_message
    assert message and str(server.config.models[0].base_path) not in message
    assert "/tmp" not in message


def test_no_error_message_reveals_a_server_path(server, stub):
    base = str(server.config.models[0].base_path)
    errors = [_call(stub.Predict, _request((1, 8, 8, 1), tensor_content=b"", signature="nope"))]
    missing = predict_pb2.PredictRequest()
    missing.model_spec.name = MODEL
    missing.model_spec.version.value = 7
    errors.append(_call(stub.Predict, missing))
    missing.model_spec.name = "empty"
    missing.model_spec.ClearField("version")
    errors.append(_call(stub.Predict, missing))
    assert errors[-1].code() == grpc.StatusCode.NOT_FOUND  # as TF Serving: not UNAVAILABLE
    for error in errors:
        assert base not in error.details() and "/tmp" not in error.details(), error.details()


def test_metrics_labels_collapse_unknown_models_and_versions(model_store, tmp_path, start_server):
    import urllib.request

    from serving_helpers import free_port

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    port = free_port()
    server = start_server(base, metrics_port=port)
    with grpc.insecure_channel(server.address) as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        for i in range(5):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = f"attacker_model_{i}"
            request.model_spec.version.value = 1000 + i
            _call(stub.Predict, request)
            request.model_spec.name = MODEL
            _call(stub.Predict, request)
            request.model_spec.version_label = f"label_{i}"
            _call(stub.Predict, request)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    # Label values only: a sample's value (a latency of 0.0010036 s) may hold any digits.
    label_values = _metric_label_values(body)
    sent = {f"attacker_model_{i}" for i in range(5)} | {f"label_{i}" for i in range(5)}
    sent |= {str(1000 + i) for i in range(5)}
    assert label_values.isdisjoint(sent), sorted(label_values & sent)
    assert {"<unknown>", MODEL} <= label_values
    assert ('ampflow_serving_errors_total{code="NOT_FOUND",method="Predict",model="<unknown>",'
            'version=""} 5.0') in body
    assert ('ampflow_serving_errors_total{code="NOT_FOUND",method="Predict",model="ampflow",'
            'version="<unknown>"} 5.0') in body


def _metric_label_values(body: str) -> set[str]:
    """Every label value in a Prometheus text exposition, parsed rather than searched."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        for value in sample.labels.values()
    }


def test_non_numeric_array_stays_valid():
    # guard for the helpers above: a plain good request decodes exactly
    from ampflow.serving.protocols import tensors

    images = sample_images(2)
    array = tensors.to_ndarray("images", tf.make_tensor_proto(images), max_bytes=LIMIT)
    np.testing.assert_array_equal(array, images)


# ---- item 2: undeserializable requests: one status, one summary log line, grpcio's leak avoided --

def test_undecodable_requests_get_internal_and_one_summary_log_line(server, channel, caplog):
    # grpcio's own failed-parse path logs a traceback per request and leaks its call state
    # (~19 KB each, measured with benchmarks/serving/garbage_requests.py); we never take it.
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    health = channel.unary_unary("/grpc.health.v1.Health/Check")
    caplog.clear()
    for i in range(300):
        error = _call(raw if i % 2 else health, b"\x0a\xc8\x01" + bytes([i % 256, 1, 2]))
        assert error.code() == grpc.StatusCode.INTERNAL
        assert "Invalid protobuf byte sequence" in error.details()
    lines = [r for r in caplog.records if "could not be parsed" in r.getMessage()]
    assert len(lines) <= 2, [r.getMessage() for r in lines]
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in caplog.text
