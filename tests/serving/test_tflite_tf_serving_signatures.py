"""TFLite models without SignatureDefs, served as TF Serving serves them (issue 49).

TF Serving's own `saved_model_half_plus_two_tflite` and `..._with_sigdef` test models, built as
its export script builds them (a TF1 session converted by the real `TFLiteConverter`,
tests/serving/tf_serving_models.py): the first has no SignatureDef at all, and TF Serving
builds `serving_default` from its tensor names; the second carries one in its
`signature_defs_metadata`, naming its tensors with TF's `:0` suffix. Both answer upstream's
`testPredictOnTfLite` request (`x` = [2.0] of shape [1]) with y = [3.0] over gRPC and REST.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import free_port, running_server
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tf_serving_models import half_plus_two_tflite, matmul_tflite, with_signature_defs_metadata
from v2_test_helpers import http

from ampflow.errors import ModelLoadError
from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.model_format import PREDICT_METHOD
from ampflow.serving.models.tflite import TFLiteServable

pytestmark = [pytest.mark.serving, pytest.mark.timeout(180)]

VERSION = 123  # the version dir of TF Serving's test models (00000123)
BARE, WITH_SIGDEF, MATMUL = "half_plus_two_tflite", "half_plus_two_tflite_with_sigdef", "matmul"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """<root>/<name>/00000123/model.tflite for the three models."""
    root = tmp_path_factory.mktemp("tflite-no-signatures")
    for name, data in ((BARE, half_plus_two_tflite()),
                       (WITH_SIGDEF, half_plus_two_tflite(with_signature_def=True)),
                       (MATMUL, matmul_tflite())):
        folder = root / name / f"{VERSION:08d}"
        folder.mkdir(parents=True)
        (folder / "model.tflite").write_bytes(data)
    return root


def _load(store, name: str) -> TFLiteServable:
    return TFLiteServable(name, VERSION, store / name / f"{VERSION:08d}")


def test_tflite_without_signatures_gets_serving_default_from_its_tensor_names(store):
    servable = _load(store, BARE)
    assert set(servable.signature_defs) == {"serving_default"}
    sig = servable.signature_defs["serving_default"]
    assert sig.method_name == PREDICT_METHOD
    assert {k: v.name for k, v in sig.inputs.items()} == {"x": "x"}
    assert {k: v.name for k, v in sig.outputs.items()} == {"y": "y"}
    assert [d.size for d in sig.inputs["x"].tensor_shape.dim] == [1, 1]
    assert sig.inputs["x"].dtype == tf.float32.as_datatype_enum


@pytest.mark.parametrize("name", [BARE, WITH_SIGDEF])
def test_tflite_without_signatures_runs_any_shape_its_graph_takes(store, name):
    servable = _load(store, name)
    for x, expected in (([2.0], [3.0]), ([[2.0], [4.0]], [[3.0], [4.0]]), ([[1.0]], [[2.5]])):
        out = servable.run("serving_default", {"x": np.array(x, np.float32)})
        np.testing.assert_array_equal(out["y"], np.array(expected, np.float32))


def test_signature_defs_metadata_keys_its_own_names_resolved_to_the_tensors(store):
    sig = _load(store, WITH_SIGDEF).signature_defs["serving_default"]
    assert sig.method_name == PREDICT_METHOD
    # stored as "tflite_input:0" and "y:0"; resolved to the legacy TFLite names, as TF Serving
    assert {k: v.name for k, v in sig.inputs.items()} == {"x": "tflite_input"}
    assert {k: v.name for k, v in sig.outputs.items()} == {"y": "y"}


def test_signature_defs_metadata_naming_an_unknown_tensor_is_refused_at_load(store, tmp_path):
    from tensorflow.core.protobuf import meta_graph_pb2

    sig = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
    sig.inputs["x"].name = "no_such_tensor:0"
    sig.outputs["y"].name = "y:0"
    data = (store / BARE / f"{VERSION:08d}" / "model.tflite").read_bytes()
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.tflite").write_bytes(
        with_signature_defs_metadata(data, {"serving_default": sig}))
    with pytest.raises(ModelLoadError, match="no_such_tensor:0"):
        TFLiteServable("bad", 1, tmp_path / "1")


def test_tflite_input_its_graph_cannot_take_is_a_value_error_and_the_model_still_runs(store):
    servable = _load(store, MATMUL)
    with pytest.raises(ValueError, match="cannot run on these inputs"):
        servable.run("serving_default", {"x": np.ones((1, 3), np.float32)})
    out = servable.run("serving_default", {"x": np.ones((1, 4), np.float32)})
    np.testing.assert_array_equal(out["y"], [[12.0, 16.0]])


@pytest.fixture(scope="module")
def server(store):
    config = ServerConfig(models=tuple(ModelConfig(name, store / name)
                                       for name in (BARE, WITH_SIGDEF, MATMUL)),
                          host="127.0.0.1", port=0, rest_api_port=free_port(), grace_s=1.0)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _upstream_predict_request(model: str):
    """TF Serving's VerifyPredictRequest: `x` = [2.0] of shape [1], output_filter `y`."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    request.inputs["x"].dtype = tf.float32.as_datatype_enum
    request.inputs["x"].float_val.append(2.0)
    request.inputs["x"].tensor_shape.dim.add().size = 1
    request.output_filter.append("y")
    return request


@pytest.mark.slow  # starts a server
@pytest.mark.parametrize("name", [BARE, WITH_SIGDEF])
def test_tflite_without_signatures_answers_upstreams_grpc_predict(stub, name):
    result = stub.Predict(_upstream_predict_request(name), timeout=30)
    assert result.outputs["y"].dtype == tf.float32.as_datatype_enum
    assert list(result.outputs["y"].float_val) == [3.0]
    assert result.model_spec.name == name
    assert result.model_spec.version.value == VERSION
    assert result.model_spec.signature_name == "serving_default"


@pytest.mark.slow  # starts a server
@pytest.mark.parametrize("name", [BARE, WITH_SIGDEF])
def test_tflite_without_signatures_answers_rest_predict_and_metadata(server, name):
    base = f"http://{server.rest_address}"
    status, _, body = http(base, "POST", f"/v1/models/{name}:predict",
                           {"instances": [[2.0]]})
    assert status == 200, body
    assert json.loads(body) == {"predictions": [[3.0]]}
    status, _, body = http(base, "GET", f"/v1/models/{name}/metadata")
    assert status == 200, body
    sig = json.loads(body)["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sorted(sig["inputs"]) == ["x"] and sorted(sig["outputs"]) == ["y"]


@pytest.mark.slow  # starts a server
def test_tflite_input_its_graph_cannot_take_is_invalid_argument_over_grpc(stub):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MATMUL
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones((1, 3), np.float32)))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot run on these inputs" in caught.value.details()
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones((1, 4), np.float32)))
    answer = stub.Predict(request, timeout=30).outputs["y"]
    np.testing.assert_array_equal(tf.make_ndarray(answer), [[12.0, 16.0]])


@pytest.mark.slow  # starts a server
def test_tflite_without_signatures_grpc_metadata_lists_serving_default(stub):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = BARE
    response = stub.GetModelMetadata(request, timeout=30)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(sig_map)
    assert list(sig_map.signature_def) == ["serving_default"]


def test_prefer_tflite_serves_the_tflite_file_of_a_version_that_holds_both(
        store, model_store, tmp_path):
    # TF Serving's --prefer_tflite_model: a version dir with saved_model.pb and model.tflite is
    # served by TFLite; without the flag (auto) by its SavedModel; a dir with no .tflite file
    # stays a SavedModel either way.
    from serving_helpers import install_version

    from ampflow.serving.models.servable import load_servable
    from ampflow.serving.models.tflite import detect_format

    both, saved_only = tmp_path / "both", tmp_path / "saved_only"
    install_version(model_store, both, 1)
    install_version(model_store, saved_only, 1)
    (both / "1" / "model.tflite").write_bytes((store / BARE / f"{VERSION:08d}" /
                                               "model.tflite").read_bytes())
    assert detect_format(both / "1") == "saved_model"
    assert detect_format(both / "1", prefer_tflite=True) == "tflite"
    assert detect_format(saved_only / "1", prefer_tflite=True) == "saved_model"
    servable = load_servable("m", 1, both / "1", "prefer_tflite")
    assert servable.model_format == "tflite"
    np.testing.assert_allclose(
        servable.run("serving_default", {"x": np.array([[1.0]], np.float32)})["y"], [[2.5]])
