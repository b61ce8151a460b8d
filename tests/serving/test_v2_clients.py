"""Clients nobody here wrote, unmodified, against `ampflow serve`'s V2 APIs.

tritonclient[http,grpc] and the kserve SDK cannot join the project's venv: pip's dry run there
would downgrade ml_dtypes (0.7.0 -> 0.5.4, tritonclient) and pandas and psutil (kserve) under
TensorFlow 2.21. So they go into a fresh venv built once per session (as
tests/clients/test_client_venv.py does for ampflow-client); AMPFLOW_V2_CLIENTS_PYTHON may name
the python of such a venv to reuse. tritonclient and kserve both register the `inference.*`
messages in protobuf's default pool and cannot be imported in one process, so each SDK runs in
its own process (tests/serving/v2_clients_script.py). Their answers must equal TF Serving's
Predict on the same server and images, and their error cases the protocol's codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import MODEL, free_port, install_version, predict_request, running_server
from tensorflow_serving.apis import prediction_service_pb2_grpc

from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.testing import sample_images

pytestmark = [pytest.mark.serving, pytest.mark.timeout(900)]

CLIENTS = ("tritonclient[http,grpc]==2.73.0", "kserve==0.21.0")
SCRIPT = Path(__file__).with_name("v2_clients_script.py")
LIMIT = 1024 * 1024


@pytest.fixture(scope="session")
def clients_python(tmp_path_factory) -> Path:
    """The python of a venv holding only the two SDKs (and what they need)."""
    reuse = os.environ.get("AMPFLOW_V2_CLIENTS_PYTHON")
    if reuse:
        return Path(reuse)
    # uv, not pip: the venv only hosts the SDKs (how they are installed is not under test),
    # and pip took ~45 s of CPU resolving kserve's dependencies, uv ~4 s
    root = tmp_path_factory.mktemp("v2-clients-venv")
    uv = [sys.executable, "-m", "uv", "--quiet"]
    subprocess.run([*uv, "venv", "--python", sys.executable, root / "venv"], check=True)
    python = root / "venv" / "bin" / "python"
    subprocess.run([*uv, "pip", "install", "--python", python, *CLIENTS], check=True)
    listed = json.loads(subprocess.run([*uv, "pip", "list", "--python", python,
                                        "--format=json"],
                                       check=True, capture_output=True, text=True).stdout)
    names = {p["name"].lower() for p in listed}
    assert {"tritonclient", "kserve"} <= names
    assert not {n for n in names if n.startswith(("tensorflow", "ampflow"))}, names
    return python


@pytest.fixture(scope="module")
def server(model_store, tmp_path_factory):
    base = tmp_path_factory.mktemp("v2clients") / MODEL
    for version in (1, 2):
        install_version(model_store, base, version)
    config = ServerConfig(models=(ModelConfig(MODEL, base, version_policy="all"),),
                          host="127.0.0.1", port=0, rest_api_port=free_port(),
                          max_message_bytes=LIMIT, max_request_batch_size=8192, grace_s=1.0)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[np.ndarray, Path]:
    array = sample_images(3, seed=21)
    path = tmp_path_factory.mktemp("v2clients-images") / "images.npy"
    np.save(path, array)
    return array, path


@pytest.fixture(scope="module")
def expected(server, images) -> dict[str, dict[str, np.ndarray]]:
    """TF Serving's Predict on the same server: the latest version ("2") and version 1."""
    with grpc.insecure_channel(server.address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answers = {}
        for key, spec in (("2", {}), ("1", {"version": 1})):
            response = stub.Predict(predict_request(MODEL, images[0], **spec), timeout=30)
            answers[key] = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    return answers


def _run(clients_python, server, images, sdk: str) -> dict:
    done = subprocess.run([clients_python, str(SCRIPT), server.address, server.rest_address,
                           MODEL, str(images[1]), sdk], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def triton(clients_python, server, images) -> dict:
    return _run(clients_python, server, images, "triton")


@pytest.fixture(scope="module")
def kserve_run(clients_python, server, images) -> dict:
    """The kserve SDK's one process: its clients' answers and its own `inference` descriptor
    (one kserve import, ~6 s of CPU, serves both)."""
    return _run(clients_python, server, images, "kserve")


@pytest.fixture(scope="module")
def kserve(kserve_run) -> dict:
    return kserve_run["kserve"]


def _same(got: dict, want: dict[str, np.ndarray], names=("probabilities", "class_ids")) -> None:
    for name in names:
        np.testing.assert_array_equal(np.array(got[name], want[name].dtype), want[name])


# ---- tritonclient ------------------------------------------------------------------------------

@pytest.mark.slow
def test_tritonclient_http_answers_equal_tf_serving_predict(triton, expected):
    http = triton["triton_http"]
    assert (http["live"], http["ready"], http["model_ready"], http["unknown_ready"]) == \
        (True, True, True, False)
    _same(http["binary"], expected["2"])  # the client's default: binary tensor data both ways
    assert http["binary_id"] == "t-http"
    _same(http["json"], expected["2"], ("probabilities",))
    assert http["json"]["outputs"] == ["probabilities"]
    np.testing.assert_array_equal(np.array(http["v1"], np.float32),
                                  expected["1"]["probabilities"])
    assert http["metadata"]["inputs"] == [
        {"name": "images", "datatype": "FP32", "shape": [-1, 8, 8, 1]}]


@pytest.mark.slow
def test_tritonclient_grpc_answers_equal_tf_serving_predict(triton, expected):
    grpc_answers = triton["triton_grpc"]
    assert (grpc_answers["live"], grpc_answers["ready"], grpc_answers["model_ready"],
            grpc_answers["unknown_ready"]) == (True, True, True, False)
    _same(grpc_answers["raw"], expected["2"])
    assert grpc_answers["raw_id"] == "t-grpc"
    np.testing.assert_array_equal(np.array(grpc_answers["v1"], np.float32),
                                  expected["1"]["probabilities"])
    assert grpc_answers["metadata"]["versions"] == ["2", "1"]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "http_status", "grpc_status", "message"), [
    ("unknown_model", "404", "StatusCode.NOT_FOUND", "Servable not found"),
    ("unknown_version", "404", "StatusCode.NOT_FOUND", "Available versions: [1, 2]"),
    ("wrong_datatype", "400", "StatusCode.INVALID_ARGUMENT", "must be FP32. Received: FP64"),
    ("wrong_shape", "400", "StatusCode.INVALID_ARGUMENT", "must have shape [-1, 8, 8, 1]"),
    ("oversize", "429", "StatusCode.RESOURCE_EXHAUSTED", ""),
])
def test_tritonclient_error_cases_get_the_protocol_codes(triton, case, http_status,
                                                         grpc_status, message):
    http_error = triton["triton_http"]["errors"][case]
    grpc_error = triton["triton_grpc"]["errors"][case]
    assert http_error["status"] == http_status, http_error
    assert grpc_error["status"] == grpc_status, grpc_error
    assert message in http_error["message"] and message in grpc_error["message"]


@pytest.mark.slow
def test_tritonclient_http_sees_bad_json_as_400_with_the_error_text(triton):
    error = triton["triton_http"]["errors"]["bad_json"]
    assert error["status"] == "400" and "JSON parse error" in error["message"]


# ---- kserve ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_kserve_rest_and_grpc_clients_answer_equal_tf_serving_predict(kserve, expected):
    assert (kserve["rest_live"], kserve["rest_ready"], kserve["rest_model_ready"]) == \
        (True, True, True)
    assert (kserve["grpc_live"], kserve["grpc_model_ready"]) == (True, True)
    for key in ("rest_json", "rest_binary", "grpc"):
        _same(kserve[key], expected["2"])
        assert kserve[f"{key}_id"] == "k-1"


@pytest.mark.slow
@pytest.mark.parametrize(("case", "rest_status", "grpc_status"), [
    ("unknown_model", "404", "StatusCode.NOT_FOUND"),
    ("wrong_datatype", "400", "StatusCode.INVALID_ARGUMENT"),
    ("wrong_shape", "400", None),
])
def test_kserve_error_cases_get_the_protocol_codes(kserve, case, rest_status, grpc_status):
    assert kserve["rest_errors"][case]["status"] == rest_status
    if grpc_status:
        assert kserve["grpc_errors"][case]["status"] == grpc_status


# ---- the vendored proto is KServe's ------------------------------------------------------------

@pytest.mark.slow
def test_vendored_v2_messages_equal_the_kserve_sdks_own(kserve_run):
    """Every message and the six methods of our descriptor equal those of kserve's package
    (kserve_descriptor in v2_clients_script.py, read in the SDK's own process)."""
    import base64

    from google.protobuf import descriptor_pb2

    from ampflow.serving.protocols import grpc_predict_v2_pb2 as ours

    ours_file = descriptor_pb2.FileDescriptorProto()
    ours.DESCRIPTOR.CopyToProto(ours_file)
    theirs = descriptor_pb2.FileDescriptorProto.FromString(
        base64.b64decode(kserve_run["kserve_descriptor"]))
    assert ours_file.package == theirs.package == "inference"
    their_messages = {m.name: m for m in theirs.message_type}
    for message in ours_file.message_type:
        assert message == their_messages[message.name], message.name
    their_methods = {m.name: m for m in theirs.service[0].method}
    assert ours_file.service[0].name == theirs.service[0].name == "GRPCInferenceService"
    for method in ours_file.service[0].method:
        assert method == their_methods[method.name]
