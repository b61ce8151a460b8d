"""The converter's TFLite variants of a real export, served: accuracy equal to the converter's.

The session's trained digits model (small_cnn, mixed_float16) is exported, converted to float32
and full_int8 (int8 input/output) by `run_convert`, which measures each variant's accuracy on
the test split; the SavedModel and both .tflite files are then served as versions 1-3 of one
model (`--model-format auto` tells them apart) and the whole test split is sent through gRPC
Predict and V2 ModelInfer. The served accuracy of each TFLite version must equal what the
converter measured, exactly: the same interpreter on the same images.
"""

from __future__ import annotations

import shutil

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc
from v2_test_helpers import v2_stub

from ampflow.serving.config import ModelConfig, ServerConfig

pytestmark = [pytest.mark.serving, pytest.mark.slow, pytest.mark.timeout(900)]

SERVED = {2: "float32", 3: "full_int8"}  # version: variant (version 1 is the SavedModel)


@pytest.fixture(scope="module")
def served(digits_export, prepared_digits, tmp_path_factory):
    """(server, convert result, test images, test labels)."""
    from ampflow.components.convert_tflite import ConvertConfig, run_convert
    from ampflow.data import load_arrays
    from ampflow.serving.server import start_local_server

    root = tmp_path_factory.mktemp("tflite-accuracy")
    result = run_convert(ConvertConfig(
        saved_model_dir=digits_export.version_dir, data_dir=prepared_digits,
        output_dir=root / "converted", variants=tuple(SERVED.values()), int8_io=True,
        latency_runs=3, warmup_runs=1))
    base = root / "served"
    shutil.copytree(digits_export.version_dir, base / "1")
    for version, variant in SERVED.items():
        (base / str(version)).mkdir(parents=True)
        shutil.copy(result.variants[variant].tflite_path, base / str(version))
    images, labels = load_arrays(prepared_digits, "test")
    config = ServerConfig(models=(ModelConfig(digits_export.model_name, base,
                                              version_policy="all"),),
                          host="127.0.0.1", port=0, grace_s=1.0)
    server = start_local_server(config)
    try:
        yield server, result, images.astype(np.float32), labels
    finally:
        server.stop(0.5)


def _predict_accuracy(server, model: str, version: int, images, labels) -> float:
    with grpc.insecure_channel(server.address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        ids = []
        for start in range(0, len(images), 64):
            response = stub.Predict(predict_request(model, images[start:start + 64],
                                                    version=version), timeout=60)
            ids.append(tf.make_ndarray(response.outputs["class_ids"]))
    return float(np.mean(np.concatenate(ids) == labels))


def _v2_accuracy(server, model: str, version: int, images, labels) -> float:
    from ampflow.serving.protocols import grpc_predict_v2_pb2 as pb

    with grpc.insecure_channel(server.address) as channel:
        infer = v2_stub(channel, "ModelInfer")
        ids = []
        for start in range(0, len(images), 64):
            batch = images[start:start + 64]
            request = pb.ModelInferRequest(model_name=model, model_version=str(version))
            request.inputs.add(name="images", datatype="FP32", shape=list(batch.shape))
            request.raw_input_contents.append(batch.astype("<f4").tobytes())
            request.outputs.add(name="class_ids")
            ids.append(np.frombuffer(infer(request, timeout=60).raw_output_contents[0], "<i8"))
    return float(np.mean(np.concatenate(ids) == labels))


@pytest.mark.parametrize("version", sorted(SERVED))
def test_served_tflite_accuracy_equals_what_the_converter_measured(served, digits_export,
                                                                   version):
    server, result, images, labels = served
    measured = result.variants[SERVED[version]].metrics["accuracy"]
    model = digits_export.model_name
    assert _predict_accuracy(server, model, version, images, labels) == pytest.approx(
        measured, abs=0)
    assert _v2_accuracy(server, model, version, images, labels) == pytest.approx(measured,
                                                                                  abs=0)


def test_the_savedmodel_version_beside_them_answers_the_converters_reference(served,
                                                                           digits_export):
    server, result, images, labels = served
    accuracy = _predict_accuracy(server, digits_export.model_name, 1, images, labels)
    assert accuracy == pytest.approx(result.reference["accuracy"], abs=0)
