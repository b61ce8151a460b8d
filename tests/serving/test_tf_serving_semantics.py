"""TF Serving's semantics on TF Serving's own test model (half_plus_two, built as its export
script builds it), served by an in-process `ampflow serve` over gRPC and REST on loopback.

Each test is a behaviour TF Serving has and ampflow lacked (issue 49): the graph decides input
shapes, an output JSON cannot carry is INVALID_ARGUMENT, ...
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import MODEL, free_port, install_version, rest_json, running_server
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tf_serving_models import write_complex_output, write_half_plus_two

from ampflow.serving.config import ModelConfig, ServerConfig

pytestmark = [pytest.mark.serving, pytest.mark.timeout(120)]

HPT = "half_plus_two"


@pytest.fixture(scope="module")
def models(tmp_path_factory, model_store):
    """{name: base path}: half_plus_two, the complex-output model, the contract conv net."""
    root = tmp_path_factory.mktemp("tf_serving_models")
    write_half_plus_two(root / HPT / "1")
    write_complex_output(root / "complex" / "1")
    install_version(model_store, root / MODEL, 1)
    return {HPT: root / HPT, "complex": root / "complex", MODEL: root / MODEL}


@pytest.fixture(scope="module")
def server(models):
    config = ServerConfig(models=tuple(ModelConfig(n, p) for n, p in models.items()),
                          host="127.0.0.1", port=0, rest_api_port=free_port(), grace_s=1.0,
                          max_request_batch_size=64)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def reference_images():
    from ampflow.serving.testing import sample_images

    return sample_images(2)


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def predict(stub, model: str, **inputs) -> dict[str, np.ndarray]:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    response = stub.Predict(request, timeout=10)
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


# ---- 1. the graph decides input shapes (predict_util.cc checks names and count only) --------

@pytest.mark.parametrize("x", [np.array([2.0, 3.0, 4.0], np.float32),  # [3] to [-1, 1]
                               np.array([1.0], np.float32),  # [1]
                               np.float32(2.0)])  # a scalar
def test_grpc_predict_runs_shapes_the_signature_does_not_declare(stub, x):
    y = predict(stub, HPT, x=x)["y"]
    np.testing.assert_allclose(y, 0.5 * x + 2.0)
    assert y.shape == np.shape(x)


def test_rest_instances_of_plain_numbers_run_as_in_tf_servings_docs(server):
    status, body = rest_json(server, f"/v1/models/{HPT}:predict", {"instances": [2.0, 3.0, 4.0]})
    assert (status, body) == (200, {"predictions": [3.0, 3.5, 4.0]})
    status, body = rest_json(server, f"/v1/models/{HPT}:predict", {"inputs": {"x": [1.0, 2.0]}})
    assert (status, body) == (200, {"outputs": [2.5, 3.0]})


def test_the_contract_model_runs_any_shape_its_reshape_takes(stub, reference_images):
    # its graph reshapes `images` to [-1, 64]: an image without its batch dimension runs
    # as one row, as it would on TF Serving
    one = predict(stub, MODEL, images=reference_images[0])["probabilities"]
    batched = predict(stub, MODEL, images=reference_images[:1])["probabilities"]
    np.testing.assert_array_equal(one, batched)


def test_a_shape_the_graph_cannot_take_is_invalid_argument_with_its_reason(server, stub):
    reason = "requested shape requires a multiple of 64"  # the graph's Reshape
    with pytest.raises(grpc.RpcError) as info:
        predict(stub, MODEL, images=np.zeros((1, 4, 4, 1), np.float32))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert reason in info.value.details()
    status, body = rest_json(server, f"/v1/models/{MODEL}:predict",
                        {"instances": np.zeros((1, 4, 4, 1)).tolist()})
    assert status == 400 and reason in body["error"], body
    good = predict(stub, MODEL, images=np.zeros((1, 8, 8, 1), np.float32))
    assert good["probabilities"].shape == (1, 10)


def test_dtype_and_rows_are_still_checked_before_the_graph_runs(stub):
    with pytest.raises(grpc.RpcError) as info:
        predict(stub, HPT, x=np.zeros((2, 1), np.int32))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be DT_FLOAT. Received: DT_INT32" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:  # [65] to [-1, 1]: 65 rows, over the cap
        predict(stub, HPT, x=np.zeros(65, np.float32))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 64 rows" in info.value.details()


# ---- 2. an output JSON cannot carry (json_tensor.cc: INVALID_ARGUMENT) ----------------------

@pytest.mark.parametrize("payload", [{"instances": [1.0, 2.0]}, {"inputs": [1.0, 2.0]}],
                         ids=["instances", "inputs"])
def test_rest_complex_output_is_400_invalid_argument_not_a_server_error(server, stub, payload):
    status, body = rest_json(server, "/v1/models/complex:predict", payload)
    assert status == 400, body
    assert "Failed to write JSON value for tensor type: complex64" in body["error"]
    z = predict(stub, "complex", x=np.array([1.0, 2.0], np.float32))["z"]  # gRPC carries it
    np.testing.assert_array_equal(z, np.array([1 + 1j, 2 + 2j], np.complex64))


# ---- 3. --enable_signature_method_name_check, off by default as in TF Serving ----------------

def _classify_request(model: str, signature: str, xs):
    from tensorflow_serving.apis import classification_pb2

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for x in xs:
        example = request.input.example_list.examples.add()
        example.features.feature["x"].float_list.value.append(x)
    return request


def test_tf2_classify_signature_classifies_without_the_method_name_check(server, stub):
    response = stub.Classify(_classify_request(HPT, "classify_x_to_y", [2.0, 4.0]), timeout=10)
    assert [[(c.label, c.score) for c in row.classes]
            for row in response.result.classifications] == [[("", 3.0)], [("", 4.0)]]
    status, body = rest_json(server, f"/v1/models/{HPT}:classify",
                        {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]})
    assert (status, body) == (200, {"results": [[["", 3.0]]]})


def test_the_method_name_check_when_asked_refuses_a_tf2_classify_signature(models,
                                                                          start_server):
    server = start_server(models=(ModelConfig(HPT, models[HPT]),),
                          enable_signature_method_name_check=True)
    with grpc.insecure_channel(server.address) as channel:
        checked = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            checked.Classify(_classify_request(HPT, "classify_x_to_y", [2.0]), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("Expected classification signature method_name to be tensorflow/serving/classify. "
            "Was: tensorflow/serving/predict") in info.value.details()


# ---- 4. Regress and MultiInference (regressor.cc, multi_inference.cc) -----------------------

def _examples_input(input_proto, xs) -> None:
    for x in xs:
        input_proto.example_list.examples.add().features.feature["x"].float_list.value.append(x)


def _regress_request(model: str, signature: str, xs):
    from tensorflow_serving.apis import regression_pb2

    request = regression_pb2.RegressionRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    _examples_input(request.input, xs)
    return request


@pytest.mark.parametrize(("signature", "expected"), [("regress_x_to_y", [3.0, 4.0]),
                                                     ("regress_x_to_y2", [4.0, 5.0])])
def test_regress_over_grpc_and_rest_answers_as_tf_serving(server, stub, signature, expected):
    response = stub.Regress(_regress_request(HPT, signature, [2.0, 4.0]), timeout=10)
    assert [r.value for r in response.result.regressions] == expected
    assert (response.model_spec.name, response.model_spec.signature_name,
            response.model_spec.version.value) == (HPT, signature, 1)
    status, body = rest_json(server, f"/v1/models/{HPT}:regress",
                        {"signature_name": signature, "examples": [{"x": 2.0}, {"x": 4.0}]})
    assert (status, body) == (200, {"results": expected})


@pytest.mark.parametrize(("signature", "text"), [
    ("", "No regression inputs found in SignatureDef"),  # serving_default: x -> y
    ("nope", "No signature was found with the name: nope"),
])
def test_regress_on_a_signature_that_is_no_regression_is_invalid_argument(server, stub,
                                                                         signature, text):
    with pytest.raises(grpc.RpcError) as info:
        stub.Regress(_regress_request(HPT, signature, [2.0]), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in info.value.details()
    status, body = rest_json(server, f"/v1/models/{HPT}:regress",
                        {"signature_name": signature, "examples": [{"x": 2.0}]})
    assert status == 400 and text in body["error"], body


def _multi_request(tasks, xs):
    from tensorflow_serving.apis import inference_pb2

    request = inference_pb2.MultiInferenceRequest()
    for model, signature, method in tasks:
        task = request.tasks.add()
        task.model_spec.name = model
        task.model_spec.signature_name = signature
        task.method_name = method
    _examples_input(request.input, xs)
    return request


CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"


def test_multi_inference_runs_classify_and_regress_tasks_on_the_same_examples(stub):
    response = stub.MultiInference(_multi_request(
        [(HPT, "classify_x_to_y", CLASSIFY), (HPT, "regress_x_to_y2", REGRESS)], [2.0, 4.0]),
        timeout=10)
    classified, regressed = response.results
    assert [[c.score for c in row.classes] for row in
            classified.classification_result.classifications] == [[3.0], [4.0]]
    assert [r.value for r in regressed.regression_result.regressions] == [4.0, 5.0]
    assert [(r.model_spec.name, r.model_spec.signature_name, r.model_spec.version.value)
            for r in response.results] == [(HPT, "classify_x_to_y", 1),
                                           (HPT, "regress_x_to_y2", 1)]


@pytest.mark.parametrize(("tasks", "code", "text"), [
    ([(HPT, "regress_x_to_y", REGRESS), ("complex", "regress_x_to_y", REGRESS)],
     grpc.StatusCode.INVALID_ARGUMENT, "must access the same model name"),
    ([(HPT, "regress_x_to_y", REGRESS), (HPT, "regress_x_to_y", CLASSIFY)],
     grpc.StatusCode.INVALID_ARGUMENT, "Duplicate evaluation of signature: regress_x_to_y"),
    ([("", "regress_x_to_y", REGRESS)], grpc.StatusCode.INVALID_ARGUMENT,
     "Found ModelSpec with an empty model name."),
    ([(HPT, "regress_x_to_y", "tensorflow/serving/predict")], grpc.StatusCode.UNIMPLEMENTED,
     "Unsupported signature method_name: tensorflow/serving/predict"),
    ([(HPT, "nope", REGRESS)], grpc.StatusCode.INVALID_ARGUMENT,
     "Requested signature not found in model graph: nope"),
], ids=["two_models", "duplicate", "no_model", "predict_method", "unknown_signature"])
def test_multi_inference_refuses_as_tf_serving(stub, tasks, code, text):
    with pytest.raises(grpc.RpcError) as info:
        stub.MultiInference(_multi_request(tasks, [2.0]), timeout=10)
    assert info.value.code() == code
    assert text in info.value.details()


def test_classify_on_a_predict_signature_is_invalid_argument_naming_the_one_that_classifies(
        stub):
    with pytest.raises(grpc.RpcError) as info:  # serving_default: x -> y, no examples
        stub.Classify(_classify_request(HPT, "", [2.0]), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Not a classification signature (tensorflow/serving/classify" in info.value.details()
    assert '"signature_name": "classify_x_to_y"' in info.value.details()


# ---- 6. start-up: TF Serving does not start without its models (server_core.cc) ------------

@pytest.fixture
def broken_base(models, tmp_path):
    """A model whose one version is half_plus_two with a corrupt saved_model.pb."""
    import shutil

    base = tmp_path / "broken"
    shutil.copytree(models[HPT] / "1", base / "1")
    (base / "1" / "saved_model.pb").write_bytes(b"\x00corrupt")
    return base


def test_a_model_that_fails_to_load_at_start_stops_the_server_with_tf_servings_line(
        broken_base, models):
    from ampflow.errors import ServingError
    from ampflow.serving.server import start_local_server

    config = ServerConfig(models=(ModelConfig(HPT, models[HPT]), ModelConfig("broken",
                                                                             broken_base)),
                          host="127.0.0.1", port=0, file_system_poll_wait_seconds=0)
    with pytest.raises(ServingError) as info:
        start_local_server(config).stop(0)  # (stopped at once should it start)
    # TF Serving: "{" + "{" + ServableId::DebugString() ("{name: ... version: 1}") + error
    assert str(info.value).startswith("1 model(s) did not become available: "
                                      "{{{name: broken version: 1} due to error: ")


def test_serve_exits_non_zero_when_a_model_fails_to_load_at_start(broken_base, capsys):
    from ampflow.serving.cli import main as serving_main

    code = serving_main(["serve", "--server", "local", "--port", "0", "--model-base-path",
                         str(broken_base), "--model-name", "broken",
                         "--file-system-poll-wait-seconds", "0"])
    assert code == 1
    assert "1 model(s) did not become available" in capsys.readouterr().err


def test_a_version_label_on_a_version_not_served_stops_the_start(models):
    from ampflow.errors import ServingError
    from ampflow.serving.server import start_local_server

    config = ServerConfig(models=(ModelConfig(HPT, models[HPT], version_labels={"stable": 2}),),
                          host="127.0.0.1", port=0, file_system_poll_wait_seconds=0)
    with pytest.raises(ServingError, match="Request to assign label 'stable' to version 2 of "
                                           "model half_plus_two, which is not currently "
                                           "available for inference"):
        start_local_server(config).stop(0)


def test_classify_on_an_unknown_signature_is_invalid_argument_as_tf_servings_classifier(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.Classify(_classify_request(HPT, "nope", [2.0]), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # Predict's is
    assert "No signature was found with the name: nope" in info.value.details()  # FAILED_PRE...
