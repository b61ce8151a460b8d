"""Conformance: what a TF Serving user sees over real gRPC, checked against in-process inference.

Runs against the in-process server by default, or AMPFLOW_SERVING_TARGET (see conftest.py).
Messages are checked only against our server; status codes against any server.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import local_only, predict_request
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    get_model_status_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from ampflow.serving.client import RpcError
from ampflow.serving.model_format import image_example
from ampflow.serving.testing import sample_images

pytestmark = [pytest.mark.serving, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def stub(conformance_target):
    channel = grpc.insecure_channel(
        conformance_target.address,
        options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
    channel.close()


@pytest.fixture
def client(conformance_target, client_for):
    return client_for(conformance_target.address)


def _assert_good_request_works(stub, target) -> None:
    """After any bad request the server must still answer a good one."""
    response = stub.Predict(predict_request(target.model, sample_images(1)), timeout=10)
    assert response.outputs["probabilities"].tensor_shape.dim[0].size == 1


# ---- the four APIs return what the SavedModel computes in-process ----------------------------

def test_predict_loopback_matches_in_process(conformance_target, reference, stub):
    images = sample_images(5, seed=3)
    response = stub.Predict(predict_request(conformance_target.model, images), timeout=10)
    expected = reference.signatures["serving_default"](images=tf.constant(images))
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"
    assert sorted(response.outputs) == ["class_ids", "probabilities"]
    for key in ("probabilities", "class_ids"):
        np.testing.assert_allclose(tf.make_ndarray(response.outputs[key]),
                                   expected[key].numpy(), rtol=1e-6)
    # TF Serving's encodings: numeric outputs in tensor_content, with the signature's dtypes.
    assert response.outputs["probabilities"].dtype == types_pb2.DT_FLOAT
    assert response.outputs["class_ids"].dtype == types_pb2.DT_INT64
    assert response.outputs["probabilities"].tensor_content


def test_predict_output_filter_returns_only_named_outputs(conformance_target, stub):
    request = predict_request(conformance_target.model, sample_images(2), version=1)
    request.output_filter.append("class_ids")
    response = stub.Predict(request, timeout=10)
    assert list(response.outputs) == ["class_ids"]


def test_predict_client_reads_input_key_from_metadata(conformance_target, reference, client):
    images = sample_images(3, seed=4)
    result = client.predict(conformance_target.model, images.astype(np.float64))
    expected = reference.signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(result.outputs["probabilities"],
                               expected["probabilities"].numpy(), rtol=1e-6)
    assert result.version == 1


def test_classify_loopback_matches_in_process(conformance_target, reference, client):
    images = sample_images(3, seed=5)
    result = client.classify(conformance_target.model, [image_example(i) for i in images])
    serialized = tf.constant([image_example(i).SerializeToString() for i in images])
    expected = reference.signatures["classify"](inputs=serialized)
    labels = [[c.decode() for c in row] for row in expected["classes"].numpy()]
    assert [[label for label, _ in row] for row in result.classes] == labels
    np.testing.assert_allclose([[s for _, s in row] for row in result.classes],
                               expected["scores"].numpy(), rtol=1e-6)


def test_get_model_metadata_equals_saved_model_signature_defs(conformance_target, client):
    signatures = client.metadata(conformance_target.model)
    proto = saved_model_pb2.SavedModel.FromString(
        (conformance_target.base_path / "1" / "saved_model.pb").read_bytes())
    (meta_graph,) = [m for m in proto.meta_graphs if "serve" in m.meta_info_def.tags]
    assert signatures == dict(meta_graph.signature_def)
    assert signatures["classify"].method_name == "tensorflow/serving/classify"
    assert list(signatures["serving_default"].inputs) == ["images"]


def test_get_model_status_reports_version_available(conformance_target, client):
    (row,) = client.status(conformance_target.model)
    assert row == {"version": 1, "state": "AVAILABLE", "error_code": 0, "error_message": ""}


# ---- bad requests: TF Serving's status codes, clear messages, server keeps answering ---------

def _tensor(array) -> object:
    return tf.make_tensor_proto(array)


def _bad_cases(model: str):
    good = sample_images(2)
    cases = {}
    cases["empty_request"] = (predict_pb2.PredictRequest(), "INVALID_ARGUMENT", "Missing ModelSpec")
    cases["unknown_model"] = (predict_request("no_such_model", good), "NOT_FOUND",
                              "Servable not found")
    cases["unknown_version"] = (predict_request(model, good, version=999), "NOT_FOUND",
                                "Specific(")
    cases["unknown_label"] = (predict_request(model, good, version_label="nope"),
                              "INVALID_ARGUMENT", "Unrecognized servable version label")
    cases["missing_input"] = (predict_request(model, None), "INVALID_ARGUMENT",
                              "Missing but required: {images}")
    extra = predict_request(model, good)
    extra.inputs["extra"].CopyFrom(_tensor(good))
    cases["extra_input"] = (extra, "INVALID_ARGUMENT", "Sent extra: {extra}")
    cases["wrong_dtype"] = (predict_request(model, good.astype(np.int32)), "INVALID_ARGUMENT",
                            "must be DT_FLOAT. Received: DT_INT32")
    strings = predict_request(model, None)
    strings.inputs["images"].CopyFrom(_tensor(np.array([b"x", b"y"])))
    cases["string_dtype"] = (strings, "INVALID_ARGUMENT", "Received: DT_STRING")
    # the graph decides shapes, as in TF Serving: its Reshape to [-1, 64] refuses 32 values
    cases["wrong_inner_dims"] = (predict_request(model, np.zeros((2, 4, 4, 1), np.float32)),
                                 "INVALID_ARGUMENT", "requested shape requires a multiple of 64")
    short = predict_request(model, good)
    short.inputs["images"].tensor_shape.dim[0].size = 3
    cases["shape_disagrees_with_data"] = (short, "INVALID_ARGUMENT", "tensor parsing error")
    filtered = predict_request(model, good)
    filtered.output_filter.append("logits")
    cases["unknown_output_filter"] = (filtered, "INVALID_ARGUMENT",
                                      "output tensor alias not found in signature: logits")
    cases["unknown_signature"] = (predict_request(model, good, signature_name="nope"),
                                  "FAILED_PRECONDITION", 'signature key "nope" not found')
    return cases


@pytest.mark.parametrize("case", list(_bad_cases("m")))
def test_predict_bad_request_gets_tf_serving_code_and_server_survives(
        case, conformance_target, stub):
    request, code, text = _bad_cases(conformance_target.model)[case]
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=10)
    assert info.value.code().name == code, info.value.details()
    if conformance_target.local:
        assert text in info.value.details()
    _assert_good_request_works(stub, conformance_target)


@local_only
def test_predict_batch_zero_is_invalid_argument(conformance_target, stub):
    # ampflow's own rule (real TF Serving runs an empty batch); hence local only.
    request = predict_request(conformance_target.model, np.zeros((0, 8, 8, 1), np.float32))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "batch size >= 1. Received: batch size 0" in info.value.details()
    _assert_good_request_works(stub, conformance_target)


def test_predict_oversized_message_is_resource_exhausted(conformance_target, stub):
    limit = conformance_target.max_message_bytes
    if limit is None:
        pytest.skip("set AMPFLOW_SERVING_MAX_MESSAGE_BYTES to the target's configured limit")
    rows = limit // (8 * 8 * 4) + 16
    request = predict_request(conformance_target.model, np.ones((rows, 8, 8, 1), np.float32))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=20)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _assert_good_request_works(stub, conformance_target)


def test_predict_random_bytes_on_the_wire_is_rejected(conformance_target, stub):
    channel = grpc.insecure_channel(conformance_target.address)
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    garbage = b"\x0f" + np.random.default_rng(0).bytes(512)  # wire type 7 does not exist
    try:
        with pytest.raises(grpc.RpcError) as info:
            raw(garbage, timeout=10)
    finally:
        channel.close()
    assert info.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    _assert_good_request_works(stub, conformance_target)


def test_predict_non_finite_inputs_answered_like_in_process(conformance_target, reference, stub):
    """NaN/Inf are valid float32 data: answered (OK), not rejected.

    Documented behaviour: a row holding NaN, or +Inf and -Inf together, gets NaN
    probabilities (the softmax of NaN logits) and `class_ids` is whatever tf.argmax returns for
    NaN; other rows of the same batch are unaffected. The server adds nothing of its own.
    """
    images = sample_images(3, seed=6)
    images[0, 0, 0, 0] = np.nan
    images[1, 0, 0, 0], images[1, 1, 1, 0] = np.inf, -np.inf
    response = stub.Predict(predict_request(conformance_target.model, images), timeout=10)
    expected = reference.signatures["serving_default"](images=tf.constant(images))
    probabilities = tf.make_ndarray(response.outputs["probabilities"])
    np.testing.assert_allclose(probabilities, expected["probabilities"].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["class_ids"]),
                                  expected["class_ids"].numpy())
    assert np.isnan(probabilities[0]).all() and np.isnan(probabilities[1]).all()
    assert np.isfinite(probabilities[2]).all()


def test_get_model_status_unknown_model_is_not_found(conformance_target, client):
    with pytest.raises(RpcError) as info:
        client.status("no_such_model")
    assert info.value.code == grpc.StatusCode.NOT_FOUND


def test_get_model_status_without_model_spec_is_invalid_argument(conformance_target):
    from tensorflow_serving.apis import model_service_pb2_grpc

    with grpc.insecure_channel(conformance_target.address) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_classify_with_predict_signature_is_rejected(conformance_target, client):
    with pytest.raises(RpcError) as info:
        client.classify(conformance_target.model, sample_images(1), signature="serving_default")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    if conformance_target.local:
        assert "tensorflow/serving/classify" in info.value.details
