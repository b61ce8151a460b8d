"""TFLite versions behind the same API: the converter's variants served by `ampflow serve`.

The contract model is converted by the project's own converter (float32, and full_int8 with
int8 input/output) into version dirs holding one `.tflite` file each; Predict over gRPC, the v1
REST API and V2 answer what the converter's own runner (`TFLiteRunner`, which the converter's
accuracy checks use) answers on the same images, the int8 model's quantization taken from its
own parameters; metadata shows the SavedModel's float contract.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import MODEL, free_port, predict_request, running_server
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    prediction_service_pb2_grpc,
)
from v2_test_helpers import http

from ampflow.errors import ConfigError
from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.model_format import image_example
from ampflow.serving.testing import sample_images

pytestmark = [pytest.mark.serving, pytest.mark.timeout(300)]

VARIANTS = {1: ("float32", False), 2: ("full_int8", True)}  # version: (variant, int8 I/O)


@pytest.fixture(scope="module")
def tflite_store(model_store, tmp_path_factory):
    """<root>/tflite/<v>/<variant>.tflite for each of VARIANTS, from the contract model v1."""
    from ampflow.components.convert_tflite import convert_variant

    root = tmp_path_factory.mktemp("tflite-serving")
    representative = sample_images(64, seed=0)
    for version, (variant, int8_io) in VARIANTS.items():
        data = convert_variant(model_store / "1", variant, int8_io=int8_io,
                               representative=representative if variant == "full_int8"
                               else None)
        folder = root / "tflite" / str(version)
        folder.mkdir(parents=True)
        (folder / f"{variant}.tflite").write_bytes(data)
    return root


@pytest.fixture(scope="module")
def server(tflite_store):
    config = ServerConfig(models=(ModelConfig(MODEL, tflite_store / "tflite",
                                              version_policy="all"),),
                          host="127.0.0.1", port=0, rest_api_port=free_port(), grace_s=1.0)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _runner(tflite_store, version: int):
    from ampflow.components.convert_tflite.checks import TFLiteRunner

    variant = VARIANTS[version][0]
    return TFLiteRunner(tflite_store / "tflite" / str(version) / f"{variant}.tflite",
                        runtime="litert")


def _predict(stub, images, version: int) -> dict[str, np.ndarray]:
    response = stub.Predict(predict_request(MODEL, images, version=version), timeout=30)
    assert response.model_spec.version.value == version
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


@pytest.mark.parametrize("version", sorted(VARIANTS))
def test_tflite_predict_equals_the_converters_own_runner(stub, tflite_store, version):
    images = sample_images(5, seed=7)
    served = _predict(stub, images, version)
    expected = _runner(tflite_store, version).predict(images, batch_size=5)
    np.testing.assert_array_equal(served["probabilities"], expected["probabilities"])
    np.testing.assert_array_equal(served["class_ids"], expected["class_ids"])


def test_float32_tflite_version_matches_the_savedmodel(stub, model_store):
    images = sample_images(4, seed=3)
    reference = tf.saved_model.load(str(model_store / "1")).signatures["serving_default"]
    expected = reference(images=tf.constant(images))["probabilities"].numpy()
    np.testing.assert_allclose(_predict(stub, images, 1)["probabilities"], expected,
                               rtol=1e-5, atol=1e-6)


def test_int8_tflite_metadata_shows_the_float_contract(stub):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = MODEL
    request.model_spec.version.value = 2
    response = stub.GetModelMetadata(request, timeout=30)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(sig_map)
    sig = sig_map.signature_def["serving_default"]
    images = sig.inputs["images"]
    assert images.dtype == tf.float32.as_datatype_enum  # int8 in the flatbuffer
    assert [d.size for d in images.tensor_shape.dim] == [-1, 8, 8, 1]
    assert sig.outputs["probabilities"].dtype == tf.float32.as_datatype_enum
    assert sig.outputs["class_ids"].dtype == tf.int64.as_datatype_enum


@pytest.mark.parametrize("version", sorted(VARIANTS))
def test_tflite_rest_and_v2_answer_what_grpc_predict_answers(server, stub, version):
    images = sample_images(2, seed=8)
    expected = _predict(stub, images, version)
    base = f"http://{server.rest_address}"
    status, _, body = http(base, "POST", f"/v1/models/{MODEL}/versions/{version}:predict",
                           {"instances": images.tolist()})
    assert status == 200, body
    rows = json.loads(body)["predictions"]
    np.testing.assert_array_equal(np.array([r["probabilities"] for r in rows], np.float32),
                                  expected["probabilities"])
    status, _, body = http(base, "POST", f"/v2/models/{MODEL}/versions/{version}/infer", {
        "inputs": [{"name": "images", "datatype": "FP32", "shape": [2, 8, 8, 1],
                    "data": images.ravel().tolist()}]})
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    np.testing.assert_array_equal(np.array(outputs["probabilities"], np.float32).reshape(2, 10),
                                  expected["probabilities"])
    assert outputs["class_ids"] == expected["class_ids"].tolist()
    status, _, body = http(base, "GET", f"/v2/models/{MODEL}/versions/{version}")
    meta = json.loads(body)
    assert (meta["platform"], meta["inputs"]) == ("tflite", [
        {"name": "images", "datatype": "FP32", "shape": [-1, 8, 8, 1]}])


def test_tflite_versions_report_available_and_classify_is_a_missing_signature(stub, server):
    from tensorflow_serving.apis import model_service_pb2_grpc

    with grpc.insecure_channel(server.address) as channel:
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": MODEL}), timeout=30)
    assert [(s.version, s.state) for s in status.model_version_status] == [(2, 30), (1, 30)]
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = "classify"
    request.input.example_list.examples.add().CopyFrom(image_example(sample_images(1)[0]))
    with pytest.raises(grpc.RpcError) as error:
        stub.Classify(request, timeout=30)
    # TF Serving's classifier: INVALID_ARGUMENT (its Predict: FAILED_PRECONDITION)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "No signature was found with the name: classify" in error.value.details()
    from ampflow.serving.client import PredictionClient

    with PredictionClient(server.address) as client:  # no classify: no names, ids are printed
        assert client.class_names(MODEL, 1) is None


@pytest.mark.parametrize(("store", "model_format"), [("tflite", "saved_model"),
                                                     ("savedmodel", "tflite")])
def test_a_forced_format_that_does_not_match_the_dir_fails_the_version_load(
        tflite_store, model_store, tmp_path, store, model_format):
    from ampflow.serving.models.registry import ModelRegistry

    base = tflite_store / "tflite" if store == "tflite" else model_store
    registry = ModelRegistry((ModelConfig(MODEL, base, version_policy="specific", versions=(1,),
                                          model_format=model_format),), settle_s=0.0)
    registry.poll_once()
    ((version, status),) = registry.status(MODEL, None)
    assert version == 1 and status.state == 50 and status.error  # END, with why


def test_model_format_is_validated_by_the_config_and_the_cli(tmp_path, capsys):
    from ampflow.cli import main

    with pytest.raises(ConfigError, match="model_format must be one of"):
        ModelConfig(MODEL, tmp_path, model_format="onnx")
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model-base-path", str(tmp_path), "--model-format", "onnx"])
    assert exit_.value.code == 2
    assert "--model-format" in capsys.readouterr().err


def test_the_real_tf_serving_binary_is_not_chosen_for_tflite_versions(tmp_path):
    from ampflow.serving.tf_serving_binary import cannot_honour

    def reasons(model_format):
        config = ServerConfig(models=(ModelConfig(MODEL, tmp_path, model_format=model_format),),
                              host="0.0.0.0", allow_reload_config=True)
        return [r for r in cannot_honour(config) if ".tflite" in r]

    assert reasons("tflite") and not reasons("auto")


def test_a_tflite_version_beside_a_served_savedmodel_loads_at_the_next_poll(
        model_store, tflite_store, tmp_path):
    """The completeness rule compares a new dir with the served version of its own format.

    Before, a .tflite dir next to a served SavedModel 'lacked' assets/, variables/... and
    waited INCOMPLETE_GRACE_S (60 s) before it was loaded.
    """
    import os
    import shutil

    from ampflow.serving.models.registry import ModelRegistry

    base = tmp_path / MODEL
    shutil.copytree(model_store / "1", base / "1")
    registry = ModelRegistry((ModelConfig(MODEL, base, version_policy="all"),), settle_s=0.01)
    registry.poll_once()
    shutil.copytree(tflite_store / "tflite" / "2", base / "2")
    old = 1_000_000_000
    for path in (base / "2", *(base / "2").iterdir()):
        os.utime(path, (old, old))  # written long ago: settled at first sight
    registry.poll_once()
    registry.poll_once()
    assert registry.resolve(MODEL, 2, None).version == 2
    shutil.copytree(tflite_store / "tflite" / "2", base / "3")  # full_int8 beside float32...
    shutil.copytree(tflite_store / "tflite" / "1", base / "4")  # ...and the other way round
    for version in (3, 4):
        for path in (base / str(version), *(base / str(version)).iterdir()):
            os.utime(path, (old, old))
        registry.poll_once()
        registry.poll_once()
        assert registry.resolve(MODEL, version, None).version == version


def test_a_version_dir_with_two_tflite_files_fails_its_load_with_one_line(tflite_store,
                                                                         tmp_path):
    import shutil

    from ampflow.serving.models.registry import ModelRegistry

    base = tmp_path / MODEL
    (base / "1").mkdir(parents=True)
    for name in ("a.tflite", "b.tflite"):
        shutil.copy(tflite_store / "tflite" / "1" / "float32.tflite", base / "1" / name)
    registry = ModelRegistry((ModelConfig(MODEL, base),), settle_s=0.0)
    registry.poll_once()
    ((_version, status),) = registry.status(MODEL, None)
    assert status.state == 50
    assert "must hold one .tflite file" in status.error and "a.tflite" in status.error
