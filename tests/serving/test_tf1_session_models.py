"""A TF1 SavedModel whose SignatureDefs disagree with its graph, served as TF Serving serves it.

TF Serving's `saved_model_half_plus_three` (built here as TF 1.0 wrote it:
tf_serving_models.py) declares no output shapes, which `tf.saved_model.load` reads as scalars
against the graph's [-1, 1] and refuses; TF Serving's session loader never reads them. ampflow
serves such a version in a TF1 Session (serving/models/session.py): the graph decides shapes,
metadata shows the SignatureDefs as written, every other load failure keeps its error.
"""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import free_port, rest_json, running_server
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    inference_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from tf_serving_models import write_half_plus_three_tf1

from ampflow.errors import ModelLoadError
from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.core.inference import (
    Declared,
    InferenceCore,
    InferRequest,
    LazyInput,
    RequestLimits,
)
from ampflow.serving.model_format import serving_signature_defs
from ampflow.serving.models.registry import ModelRegistry
from ampflow.serving.models.servable import load_servable
from ampflow.serving.models.session import SessionServable, session_servable
from ampflow.serving.status import ServingStatusError

pytestmark = [pytest.mark.serving, pytest.mark.timeout(120)]

H3 = "half_plus_three"
REGRESS = "tensorflow/serving/regress"
VERSION = 123


def _example(x: float) -> bytes:
    feature = tf.train.Feature(float_list=tf.train.FloatList(value=[x]))
    return tf.train.Example(features=tf.train.Features(feature={"x": feature})) \
        .SerializeToString()


def _tf2_load_error(path) -> Exception:
    with pytest.raises(Exception) as refused:
        tf.saved_model.load(str(path), tags=["serve"])
    return refused.value


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The model's base path, version 123 as upstream's testdata."""
    root = tmp_path_factory.mktemp("tf1") / H3
    write_half_plus_three_tf1(root / f"{VERSION:08d}")
    return root


@pytest.fixture(scope="module")
def servable(base):
    return load_servable(H3, VERSION, base / f"{VERSION:08d}")


def test_tf1_model_whose_signature_disagrees_runs_in_a_session_with_tf_servings_answers(
        base, servable):
    """Refused at load before: tf.saved_model.load's ValueError ended the version."""
    _tf2_load_error(base / f"{VERSION:08d}")  # the model is the case: TF2's loader refuses it
    assert isinstance(servable, SessionServable)
    out = servable.run("serving_default", {"x": np.array([1, 2, 5], np.float32)})
    np.testing.assert_allclose(out["y"], [3.5, 4.0, 5.5])  # TF Serving's REST docs' answer
    out = servable.run("serving_default", {"x": np.array([[1], [2], [5]], np.float32)})
    assert out["y"].shape == (3, 1)
    out = servable.run(REGRESS, {"inputs": np.array([_example(1.0), _example(2.0)], object)})
    np.testing.assert_allclose(out["outputs"].ravel(), [3.5, 4.0])


def test_metadata_is_as_written_requests_are_checked_against_the_graph(base, servable):
    written = serving_signature_defs(base / f"{VERSION:08d}")
    assert servable.metadata_signature_defs == written
    assert written[REGRESS].inputs["inputs"].dtype == types_pb2.DT_FLOAT  # as upstream's file
    checked = servable.signature_defs[REGRESS].inputs["inputs"]
    assert checked.dtype == types_pb2.DT_STRING and checked.tensor_shape.unknown_rank
    dims = [d.size for d in servable.signature_defs["serving_default"].outputs["y"]
            .tensor_shape.dim]
    assert dims == [-1, 1]


def test_concurrent_session_runs_each_get_their_own_answer(servable):
    answers, errors = {}, []

    def call(i: int) -> None:
        try:
            for _ in range(20):
                x = np.array([i, i + 1], np.float32)
                answers[i] = servable.run("serving_default", {"x": x})["y"]
                np.testing.assert_allclose(answers[i], 0.5 * x + 3)
        except Exception as e:  # collected: a thread's assertion would be lost
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(answers) == 4


def test_server_side_batching_merges_session_runs_without_changing_answers(servable):
    """Merged along the first dimension and split back: `x` of [2] per request, as sent."""
    from ampflow.serving.config import BatchingConfig
    from ampflow.serving.core.batching import Batcher

    merged = []
    batcher = Batcher(BatchingConfig(max_batch_size=64, batch_timeout_ms=50.0),
                      observe=lambda requests, rows: merged.append(requests))
    answers, errors = {}, []

    def call(i: int) -> None:
        try:
            x = np.array([i, i + 0.5], np.float32)
            answers[i] = batcher.run(servable, "serving_default", {"x": x}, 60.0)["y"]
            np.testing.assert_allclose(answers[i], 0.5 * x + 3)
        except Exception as e:  # collected: a thread's assertion would be lost
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        batcher.close()
    assert not errors and len(answers) == 6 and sum(merged) == 6


def _core(servable, **limits) -> tuple[InferenceCore, InferRequest]:
    return InferenceCore(ModelRegistry(()), limits=RequestLimits(**limits)), \
        InferRequest(H3, servable=servable)


def test_limits_run_before_any_tensor_is_built(servable):
    core, request = _core(servable, max_bytes=8)
    built = []
    request.inputs = [LazyInput("x", Declared(types_pb2.DT_FLOAT, (3,), 12),
                                lambda: built.append(1) or np.zeros(3, np.float32))]
    with pytest.raises(ServingStatusError) as refused:
        core.infer(request)
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not built


def test_a_feed_the_graph_cannot_take_is_invalid_argument_with_the_graphs_reason(servable):
    core, request = _core(servable)
    request.signature = REGRESS
    request.inputs = [LazyInput("inputs", Declared(types_pb2.DT_STRING, (1,), 4, 4),
                                lambda: np.array([b"junk"], object))]
    with pytest.raises(ServingStatusError) as refused:
        core.infer(request)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "Feature: x (data type: float) is required" in refused.value.message


def _unfed_placeholder_model(path) -> None:
    """A TF1 graph whose signature leaves a placeholder unfed: TF2 refuses, shapes agree."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as sess:
        p = v1.placeholder(tf.float32, [None], name="p")
        q = v1.placeholder(tf.float32, [None], name="q")
        out = tf.add(p, q, name="out")
        info = v1.saved_model.utils.build_tensor_info
        sig = v1.saved_model.signature_def_utils.build_signature_def(
            {"p": info(p)}, {"out": info(out)}, "tensorflow/serving/predict")
        builder = v1.saved_model.builder.SavedModelBuilder(str(path))
        builder.add_meta_graph_and_variables(sess, ["serve"],
                                             signature_def_map={"serving_default": sig})
        builder.save()


def test_other_tf1_load_errors_keep_their_message(base, tmp_path):
    unfed = tmp_path / "unfed" / "1"
    _unfed_placeholder_model(unfed)
    no_variables = tmp_path / "no_variables" / "1"
    shutil.copytree(base / f"{VERSION:08d}", no_variables)
    shutil.rmtree(no_variables / "variables")
    for path in (unfed, no_variables):  # no disagreement; a Session cannot load it either
        expected = _tf2_load_error(path)
        with pytest.raises(type(expected)) as refused:
            load_servable("m", 1, path)
        # (TensorFlow's text goes on with the Python stack, which differs by call site)
        assert str(refused.value).splitlines()[:1] == str(expected).splitlines()[:1]


def test_a_compute_precision_other_than_float32_is_refused_in_one_line(base):
    error = _tf2_load_error(base / f"{VERSION:08d}")
    with pytest.raises(ModelLoadError, match="serve it with the default float32"):
        session_servable(H3, VERSION, base / f"{VERSION:08d}", "bfloat16", error)


# ---- over the wire: gRPC and REST, TF Serving's answers ------------------------------------

@pytest.fixture(scope="module")
def server(base):
    config = ServerConfig(models=(ModelConfig(H3, base),), host="127.0.0.1", port=0,
                          rest_api_port=free_port(), grace_s=1.0)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def test_grpc_predict_regress_multi_inference_and_metadata_as_tf_serving(stub, base):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = H3
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1, 2, 5], np.float32)))
    answer = tf.make_ndarray(stub.Predict(request, timeout=30).outputs["y"])
    np.testing.assert_allclose(answer, [3.5, 4.0, 5.5])

    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = H3, REGRESS
    for x in (1.0, 2.0):
        regress.input.example_list.examples.add().ParseFromString(_example(x))
    values = [r.value for r in stub.Regress(regress, timeout=30).result.regressions]
    np.testing.assert_allclose(values, [3.5, 4.0])
    multi = inference_pb2.MultiInferenceRequest(input=regress.input)
    task = multi.tasks.add(method_name=REGRESS)
    task.model_spec.name, task.model_spec.signature_name = H3, REGRESS
    (result,) = stub.MultiInference(multi, timeout=30).results
    np.testing.assert_allclose([r.value for r in result.regression_result.regressions],
                               [3.5, 4.0])
    classify = classification_pb2.ClassificationRequest(model_spec=regress.model_spec,
                                                        input=regress.input)
    with pytest.raises(grpc.RpcError) as refused:  # no classes or scores: not a classifier
        stub.Classify(classify, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    meta = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    meta.model_spec.name = H3
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    stub.GetModelMetadata(meta, timeout=30).metadata["signature_def"].Unpack(sig_map)
    assert dict(sig_map.signature_def) == serving_signature_defs(base / f"{VERSION:08d}")


def test_rest_predict_and_regress_as_tf_servings_api_docs(server):
    """The two calls of TF Serving's REST API docs on half_plus_three, with their answers."""
    status, body = rest_json(server, f"/v1/models/{H3}:predict", {"instances": [1.0, 2.0, 5.0]})
    assert status == 200
    np.testing.assert_allclose(body["predictions"], [3.5, 4.0, 5.5])
    status, body = rest_json(server, f"/v1/models/{H3}:regress",
                         {"signature_name": REGRESS, "examples": [{"x": 1.0}, {"x": 2.0}]})
    assert status == 200
    np.testing.assert_allclose(body["results"], [3.5, 4.0])
    status, body = rest_json(server, f"/v1/models/{H3}:regress",
                         {"signature_name": REGRESS, "examples": [{"z": 1.0}]})
    assert status == 400 and "is required" in body["error"]


def test_v2_rest_metadata_shows_and_infer_checks_the_graphs_shapes(server):
    """KServe V2 checks shapes: against the graph's [-1, 1], not the TensorInfo's scalar."""
    url = f"/v2/models/{H3}"
    with urllib.request.urlopen(f"http://{server.rest_address}{url}", timeout=30) as response:
        meta = json.loads(response.read())
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]
    x = {"name": "x", "datatype": "FP32", "shape": [3, 1], "data": [1.0, 2.0, 5.0]}
    status, body = rest_json(server, f"{url}/infer", {"inputs": [x]})
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"][0]["data"], [3.5, 4.0, 5.5])
    status, body = rest_json(server, f"{url}/infer", {"inputs": [{**x, "shape": [3]}]})
    assert status == 400 and "shape" in body["error"]
