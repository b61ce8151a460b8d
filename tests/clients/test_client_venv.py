"""The client, installed alone in a fresh venv, against a real `ampflow serve` on loopback.

One venv for the session (`client_venv`): `pip install clients/python` from the registry's
grpcio/protobuf/numpy, and `pip list` shows no tensorflow. A script runs every call there
(gRPC and REST, plain and mutual TLS) and prints JSON; this process makes the same calls with
tensorflow-serving-api's stubs and `tf.make_ndarray`, and the answers must be equal.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest
from client_helpers import CLIENT_ROOT
from ports import free_port

pytestmark = pytest.mark.serving

MODEL = "ampflow"


@pytest.fixture(scope="session")
def client_venv(tmp_path_factory) -> Path:
    """A fresh venv with only ampflow-client (built from a copy of clients/python)."""
    root = tmp_path_factory.mktemp("client-venv")
    source = root / "src-copy"
    shutil.copytree(CLIENT_ROOT, source, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info"))
    # this venv's pip installs into the fresh venv (`pip --python`): the same resolver and
    # build, without seeding pip there (ensurepip, ~3 s of CPU); --no-compile leaves the
    # .pyc files to the imports that need them (compiling all of numpy's took ~2 s)
    venv.EnvBuilder(with_pip=False).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", "--no-compile", str(source)], check=True)
    listed = subprocess.run([*pip, "list", "--format=json"], check=True,
                            capture_output=True, text=True).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "ampflow-client" in names
    assert not {n for n in names if n.startswith(("tensorflow", "keras", "ampflow"))
                and n != "ampflow-client"}, names
    return python


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A throwaway CA, a server certificate for localhost and a client certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def cert(cn, key, issuer_cn, issuer_key, ca, sans=()):
        now = datetime.datetime.now(datetime.UTC)
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    out = tmp_path_factory.mktemp("pki")
    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in "abc")
    ca = cert("test CA", ca_key, "test CA", ca_key, True)
    sans = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    files = {}
    for name, obj in (("ca", ca), ("server", cert("localhost", server_key, "test CA", ca_key,
                                                   False, sans)),
                      ("client", cert("client", client_key, "test CA", ca_key, False))):
        files[name] = out / f"{name}.pem"
        files[name].write_bytes(obj.public_bytes(serialization.Encoding.PEM))
    for name, key in (("server_key", server_key), ("client_key", client_key)):
        files[name] = out / f"{name}.pem"
        files[name].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return files


@pytest.fixture(scope="module")
def servers(tmp_path_factory, pki):
    """Two `ampflow serve` servers of the contract model: plain, and mutual TLS; both REST."""
    from ampflow.serving.config import ModelConfig, ServerConfig, TlsConfig
    from ampflow.serving.server import start_local_server
    from ampflow.serving.testing import write_model_version

    base = tmp_path_factory.mktemp("client-model") / MODEL
    write_model_version(base, 1, model_name=MODEL)
    running = {}
    for name, tls in (("plain", None),
                      ("mtls", TlsConfig(pki["server"], pki["server_key"], pki["ca"]))):
        running[name] = start_local_server(ServerConfig(
            models=(ModelConfig(MODEL, base, version_labels={"stable": 1}),), host="127.0.0.1",
            port=0, tls=tls,
            rest_api_port=free_port(), grace_s=1.0, file_system_poll_wait_seconds=0))
    yield running
    for server in running.values():
        server.stop(0.5)


IMAGES = np.random.default_rng(7).uniform(0, 255, (3, 8, 8, 1)).astype(np.float32)

# Runs in the client venv: every call, answers as JSON (arrays as nested lists + dtype).
_CALLS = r'''
import json, logging, sys
import numpy as np
from google.protobuf import json_format
from ampflow_client import Client, RestClient, ServingError

args = json.loads(sys.argv[1])
images = np.asarray(args["images"], dtype=np.float32)
tls = args.get("tls") or {}
out = {}

def err(fn):
    try:
        fn()
    except ServingError as e:
        return [e.code.name, e.message]
    return None

def arrays(result):
    return {k: [v.dtype.str, v.tolist()] for k, v in result.outputs.items()}

with Client(args["grpc"], **tls) as c:
    out["health"] = c.health()
    out["status"] = c.status("ampflow")
    out["metadata"] = {k: json_format.MessageToDict(v) for k, v in c.metadata("ampflow").items()}
    out["predict"] = arrays(c.predict("ampflow", {"images": images}))
    out["predict_single"] = arrays(c.predict("ampflow", images.astype(np.float64), version=1))
    out["predict_label"] = arrays(c.predict("ampflow", {"images": images}, version_label="stable"))
    out["err_label"] = err(lambda: c.predict("ampflow", {"images": images},
                                             version_label="nope"))
    out["classify"] = c.classify("ampflow", [{"image": i.ravel()} for i in images],
                                 signature="classify").classes
    out["err_model"] = err(lambda: c.predict("nope", {"images": images}))
    out["err_dtype"] = err(lambda: c.predict("ampflow", {"images": images.astype(np.int32)}))
    out["err_regress"] = err(lambda: c.regress("ampflow", [{"image": [1.0]}]))
    out["err_version"] = err(lambda: c.status("ampflow", 99))
with RestClient(args["rest"], **tls) as r:
    out["rest_status"] = r.status("ampflow")
    out["rest_metadata"] = {k: json_format.MessageToDict(v)
                            for k, v in r.metadata("ampflow").items()}
    out["rest_predict"] = arrays(r.predict("ampflow", {"images": images}))
    out["rest_predict_label"] = arrays(r.predict("ampflow", {"images": images},
                                                 version_label="stable"))
    out["rest_classify"] = r.classify("ampflow", [{"image": i.ravel()} for i in images],
                                      signature="classify").classes
    out["rest_err_model"] = err(lambda: r.predict("nope", {"images": images}))
    out["rest_err_dtype"] = err(lambda: r.predict("ampflow",
                                                  {"images": [["not a number"]]}))
print(json.dumps(out))
'''

_RETRIES = r'''
import json, logging, sys, time
from ampflow_client import Client, ServingError
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("ampflow_client").addHandler(Keep())
logging.getLogger("ampflow_client").setLevel(logging.INFO)
with Client(sys.argv[1], retries=2, backoff_s=0.01, timeout_s=2) as c:
    try:
        c.status("ampflow")
    except ServingError as e:
        code = e.code.name
with Client(sys.argv[2], retries=2, backoff_s=0.01, timeout_s=2) as c:
    try:
        c.status("nope")
    except ServingError as e:
        code2 = e.code.name
print(json.dumps({"code": code, "code2": code2, "log": records}))
'''


def _run_in_venv(python: Path, script: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _reference(address: str, tls: dict | None) -> dict:
    """The same calls through tensorflow-serving-api's stubs (the reference answers)."""
    import grpc
    import tensorflow as tf
    from google.protobuf import json_format
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        predict_pb2,
        prediction_service_pb2_grpc,
    )
    from tensorflow_serving.apis import model_service_pb2_grpc as model_grpc

    if tls:
        creds = grpc.ssl_channel_credentials(Path(tls["tls_ca"]).read_bytes(),
                                             Path(tls["tls_key"]).read_bytes(),
                                             Path(tls["tls_cert"]).read_bytes())
        channel = grpc.secure_channel(address, creds, options=[
            ("grpc.ssl_target_name_override", "localhost")])
    else:
        channel = grpc.insecure_channel(address)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    out = {}
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = MODEL
    status = model_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=10)
    out["status"] = [(s.version, s.state) for s in status.model_version_status]
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = MODEL
    request.metadata_field.append("signature_def")
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    stub.GetModelMetadata(request, timeout=10).metadata["signature_def"].Unpack(sig_map)
    out["metadata"] = {k: json_format.MessageToDict(v) for k, v in sig_map.signature_def.items()}
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = "serving_default"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(IMAGES))
    response = stub.Predict(request, timeout=10)
    out["predict"] = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = "classify"
    for image in IMAGES:
        example = request.input.example_list.examples.add()
        example.features.feature["image"].float_list.value.extend(image.ravel().tolist())
    response = stub.Classify(request, timeout=10)
    out["classify"] = [[[c.label, c.score] for c in row.classes]
                       for row in response.result.classifications]
    for key, model, images in (("err_model", "nope", IMAGES),
                               ("err_dtype", MODEL, IMAGES.astype(np.int32))):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
        try:
            stub.Predict(request, timeout=10)
        except grpc.RpcError as e:
            out[key] = [e.code().name, e.details()]
    channel.close()
    return out


def _check(got: dict, ref: dict) -> None:
    assert got["health"] == "SERVING"
    assert [(r["version"], r["state"], r["error_code"]) for r in got["status"]] == [
        (v, "AVAILABLE", "OK") for v, s in ref["status"] if s == 30]
    assert got["metadata"] == ref["metadata"]
    assert set(got["metadata"]) >= {"serving_default", "classify"}
    for key in ("predict", "predict_single", "predict_label"):
        assert set(got[key]) == set(ref["predict"])
        for name, (dtype, values) in got[key].items():
            expected = ref["predict"][name]
            assert np.dtype(dtype) == expected.dtype
            np.testing.assert_array_equal(np.asarray(values, dtype=expected.dtype), expected)
    assert got["classify"] == ref["classify"]
    assert got["err_model"] == ref["err_model"] and got["err_model"][0] == "NOT_FOUND"
    assert got["err_dtype"] == ref["err_dtype"] and got["err_dtype"][0] == "INVALID_ARGUMENT"
    assert got["err_regress"][0] == "INVALID_ARGUMENT"  # serving_default is no regression
    assert got["err_version"][0] == "NOT_FOUND"
    # REST: the same answers (JSON carries float32 as its shortest exact decimal)
    assert got["rest_status"] == got["status"]
    assert got["rest_metadata"] == got["metadata"]
    for key in ("rest_predict", "rest_predict_label"):
        for name, (dtype, values) in got[key].items():
            expected = ref["predict"][name]
            assert np.dtype(dtype) == expected.dtype
            np.testing.assert_array_equal(np.asarray(values, dtype=expected.dtype), expected)
    assert got["err_label"][0] in ("NOT_FOUND", "INVALID_ARGUMENT")
    assert [[lab for lab, _ in row] for row in got["rest_classify"]] == [
        [lab for lab, _ in row] for row in ref["classify"]]
    np.testing.assert_array_equal(
        np.float32([[s for _, s in row] for row in got["rest_classify"]]),
        np.float32([[s for _, s in row] for row in ref["classify"]]))
    assert got["rest_err_model"][0] == "NOT_FOUND"
    assert got["rest_err_dtype"][0] == "INVALID_ARGUMENT"


@pytest.mark.slow
def test_client_alone_answers_as_tensorflow_serving_api(client_venv, servers):
    server = servers["plain"]
    args = {"grpc": server.address, "rest": server.rest_address, "images": IMAGES.tolist()}
    got = _run_in_venv(client_venv, _CALLS, json.dumps(args))
    _check(got, _reference(server.address, None))


@pytest.mark.slow
def test_client_alone_with_mutual_tls_answers_as_tensorflow_serving_api(client_venv, servers,
                                                                        pki):
    server = servers["mtls"]
    tls = {"tls_ca": str(pki["ca"]), "tls_cert": str(pki["client"]),
           "tls_key": str(pki["client_key"]), "tls_server_name": "localhost"}
    args = {"grpc": server.address, "rest": server.rest_address, "images": IMAGES.tolist(),
            "tls": tls}
    got = _run_in_venv(client_venv, _CALLS, json.dumps(args))
    _check(got, _reference(server.address, tls))


@pytest.mark.slow
def test_client_retries_unavailable_only(client_venv, servers):
    closed = f"127.0.0.1:{free_port()}"
    got = _run_in_venv(client_venv, _RETRIES, closed, servers["plain"].address)
    assert got["code"] == "UNAVAILABLE"
    assert [m.split(", attempt ")[1].split(",")[0] for m in got["log"]] == ["1/3", "2/3"]
    assert got["code2"] == "NOT_FOUND"  # answered at once, not retried (no third line)


@pytest.mark.slow
def test_cli_predict_in_the_client_venv_prints_top_k(client_venv, servers, tmp_path):
    np.save(tmp_path / "x.npy", IMAGES[:2])
    cli = client_venv.parent / "ampflow-client"
    host, port = servers["plain"].address.rsplit(":", 1)
    done = subprocess.run([str(cli), "predict", "--host", host, "--port", port, "--top-k", "2",
                           str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "model ampflow version 1 signature serving_default"
    # the class names the model ships (its classify signature answers labels.txt), not ids
    assert re.fullmatch(r"row 0: digit_(\d) \(\1\) [01]\.\d{4}, digit_(\d) \(\2\) [01]\.\d{4}",
                        lines[1]), lines
    assert lines[2].startswith("row 1: ") and len(lines) == 3
    picture = tmp_path / "x.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))  # starts like a PNG
    no_pillow = subprocess.run([str(cli), "predict", "--host", host, "--port", port,
                                str(picture)], capture_output=True, text=True, timeout=60)
    assert no_pillow.returncode == 1  # the contract model takes pixels: Pillow is optional
    assert "needs Pillow (pip install 'ampflow-client[images]')" in no_pillow.stderr
    missing = subprocess.run([str(cli), "status", "--host", host, "--port", port,
                              "--model-name", "nope"], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 1
    assert missing.stderr.startswith("ampflow-client: error: GetModelStatus failed with "
                                     "NOT_FOUND")
    assert "Traceback" not in missing.stderr


# A PredictionService in the client venv (grpcio alone) that answers UNAVAILABLE twice, then
# OK; and one that sleeps past the deadline.
_FLAKY = r'''
import json, logging, sys, time
from concurrent import futures
import grpc, numpy as np
from ampflow_client import Client, ServingError, make_tensor_proto
from ampflow_client._proto.tensorflow_serving.apis import predict_pb2

calls = {"n": 0, "slow": []}
def predict(request, context):
    calls["n"] += 1
    if request.model_spec.name == "slow":
        calls["slow"].append(context.time_remaining())  # the client's deadline, as sent
        time.sleep(1.0)
    elif calls["n"] <= 2:
        context.abort(grpc.StatusCode.UNAVAILABLE, "reloading")
    response = predict_pb2.PredictResponse()
    response.model_spec.version.value = 7
    response.outputs["y"].CopyFrom(make_tensor_proto(np.float32([1.5, 2.5])))
    return response

handler = grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", {
    "Predict": grpc.unary_unary_rpc_method_handler(
        predict, request_deserializer=predict_pb2.PredictRequest.FromString,
        response_serializer=predict_pb2.PredictResponse.SerializeToString)})
server = grpc.server(futures.ThreadPoolExecutor(4))
server.add_generic_rpc_handlers((handler,))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("ampflow_client").addHandler(Keep())
out = {}
with Client(f"127.0.0.1:{port}", retries=3, backoff_s=0.01, timeout_s=0.3) as c:
    result = c.predict("m", {"x": np.zeros(1, np.float32)})
    out["retried"] = [result.version, result.outputs["y"].tolist(), calls["n"], list(records)]
    records.clear()
    try:
        c.predict("slow", {"x": np.zeros(1, np.float32)})
    except ServingError as e:
        out["deadline"] = [e.code.name, list(records)]
server.stop(5).wait()  # handlers already running finish: each slow call that came is counted
out["slow_calls"] = calls["slow"]
print(json.dumps(out))
'''


@pytest.mark.slow
def test_client_retries_unavailable_then_succeeds_and_deadline_is_not_retried(client_venv):
    got = _run_in_venv(client_venv, _FLAKY)
    version, values, calls, log = got["retried"]
    assert (version, values, calls) == (7, [1.5, 2.5], 3)
    assert [m.split(", attempt ")[1].split(",")[0] for m in log] == ["1/4", "2/4"]
    code, log = got["deadline"]
    assert code == "DEADLINE_EXCEEDED" and log == []  # no "attempt i/N, retrying" line
    # counted by the server, not timed by the client (a loaded host stretches any time): at
    # most the one call (none where the deadline ran out before its handler started), sent
    # with the client's 0.3 s deadline (read on gRPC's cached clock: 0.30036 s seen)
    assert len(got["slow_calls"]) <= 1 and all(0 < s < 0.4 for s in got["slow_calls"]), got
