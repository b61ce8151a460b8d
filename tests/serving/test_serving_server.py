"""The server process: TLS, SIGTERM drain, batching, metrics, health, reflection, retries."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from serving_helpers import MODEL, free_port, install_version, local_only, predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

from ampflow.serving.client import PredictionClient, RpcError
from ampflow.serving.config import BatchingConfig, TlsConfig
from ampflow.serving.testing import sample_images
from ampflow.serving.transport.drain import MESSAGE

pytestmark = [pytest.mark.serving, local_only, pytest.mark.timeout(120)]


@pytest.fixture
def served_base(model_store, tmp_path) -> Path:
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    return base


# ---- TLS ---------------------------------------------------------------------------------------

def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject_cn, key, issuer_cn, issuer_key, *, ca: bool, sans=()):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A throwaway CA, a server cert for localhost/127.0.0.1 and a client cert."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    out = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _cert("ampflow test CA", ca_key, "ampflow test CA", ca_key, ca=True)
    server_key, client_key = _key(), _key()
    sans = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    server = _cert("localhost", server_key, "ampflow test CA", ca_key, ca=False, sans=sans)
    client = _cert("client", client_key, "ampflow test CA", ca_key, ca=False)
    files = {}
    for name, obj in (("ca", ca), ("server", server), ("client", client)):
        files[name] = out / f"{name}.pem"
        files[name].write_bytes(obj.public_bytes(serialization.Encoding.PEM))
    for name, key in (("server_key", server_key), ("client_key", client_key)):
        files[name] = out / f"{name}.pem"
        files[name].write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return files


def test_tls_client_without_ca_refused_with_ca_succeeds(pki, served_base, start_server,
                                                        client_for):
    server = start_server(served_base, tls=TlsConfig(pki["server"], pki["server_key"]))
    plain = client_for(server.address, retries=0, timeout_s=5)
    with pytest.raises(RpcError) as info:
        plain.status(MODEL)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    wrong_ca = client_for(server.address, retries=0, timeout_s=5, tls_ca=pki["client"])
    with pytest.raises(RpcError):
        wrong_ca.status(MODEL)
    good = client_for(server.address, tls_ca=pki["ca"], tls_server_name="localhost")
    assert good.predict(MODEL, sample_images(1)).version == 1


def test_garbage_tls_certificate_is_a_config_error_naming_the_files(pki, served_base, tmp_path):
    from ampflow.errors import ConfigError
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server

    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    for cert, key in ((garbage, pki["server_key"]), (pki["server"], pki["client_key"])):
        config = ServerConfig(models=(ModelConfig(MODEL, served_base),), port=0,
                              tls=TlsConfig(cert, key))
        with pytest.raises(ConfigError, match="PEM certificate and its matching PEM private key"):
            start_local_server(config)


def test_mutual_tls_requires_client_certificate(pki, served_base, start_server, client_for):
    tls = TlsConfig(pki["server"], pki["server_key"], client_ca_file=pki["ca"])
    server = start_server(served_base, tls=tls)
    no_cert = client_for(server.address, retries=0, timeout_s=5, tls_ca=pki["ca"],
                         tls_server_name="localhost")
    with pytest.raises(RpcError) as info:
        no_cert.status(MODEL)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    with_cert = client_for(server.address, tls_ca=pki["ca"], tls_cert=pki["client"],
                           tls_key=pki["client_key"], tls_server_name="localhost")
    assert with_cert.status(MODEL)[0]["state"] == "AVAILABLE"


# ---- SIGTERM drains in-flight requests (a real `ampflow serve` subprocess) ----------------------

@pytest.mark.slow
def test_sigterm_with_in_flight_requests_completes_them_and_refuses_new_ones_retryably(
        served_base):
    # A long batch timeout keeps requests in flight (queued for their batch) when SIGTERM lands:
    # 5 s, so that the 1 s the test gives the four requests to reach the server (warm channel,
    # but a loaded machine) ends well before their batch would run, and the server has 4 s
    # more to take the SIGTERM and refuse a call while they wait (with 2.5 s, a stall of
    # 1.5 s anywhere on a loaded host left no call to refuse). Calls made after SIGTERM, while
    # those finish, are answered UNAVAILABLE (gRPC) / 503 (REST) with a retry hint, never
    # CANCELLED (grpcio's shutdown cancels calls it holds; transport/drain.py). Warm-up stays
    # on (each replay waits out the 5 s batch timeout alone): without it, one run of 15 at load
    # 12 gave a code outside the allowed set, so the in-flight calls run on a warmed model.
    rest_port = free_port()
    cmd = [sys.executable, "-m", "ampflow.serving.cli", "serve",
           "--model-base-path", str(served_base), "--model-name", MODEL, "--port", "0",
           "--rest-api-port", str(rest_port), "--max-batch-size", "64",
           "--batch-timeout-ms", "5000", "--grace-s", "10", "--server", "local"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        address = _read_address(proc, timeout_s=60)
        with PredictionClient(address, timeout_s=20) as client:
            client.wait_until_available(MODEL, timeout=30)
            client.input_specs(MODEL)  # metadata cached before the requests start
            with ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(client.predict, MODEL, sample_images(1, seed=i))
                           for i in range(4)]
                time.sleep(1.0)
                assert not any(f.done() for f in futures), "requests finished before SIGTERM"
                proc.terminate()
                grpc_codes, rest_codes = _calls_until_done(address, rest_port, futures)
                versions = [f.result(timeout=30).version for f in futures]
        assert versions == [1, 1, 1, 1]
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()
    allowed = {"OK", "UNAVAILABLE", "UNAVAILABLE draining"}  # the message: what else, how many
    assert set(grpc_codes) <= allowed, Counter(grpc_codes)
    assert "UNAVAILABLE draining" in grpc_codes, grpc_codes
    assert "503 retry" in rest_codes, rest_codes


def _calls_until_done(address: str, rest_port: int, futures) -> tuple[list, list]:
    """Once health says NOT_SERVING, Predict over gRPC and REST in turn until `futures` are
    done: what each call got.

    gRPC: the code, "UNAVAILABLE draining" when the server refused it with its retry
    pushback; REST: the status, "503 retry" with Retry-After, or the connection error.
    """
    request = predict_request(MODEL, sample_images(1))
    body = json.dumps({"instances": sample_images(1).tolist()})
    grpc_codes, rest_codes = [], []
    with grpc.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        while health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == serving:
            time.sleep(0.005)  # SIGTERM not handled yet (a call now would join the batch)
        while not all(f.done() for f in futures):
            try:
                stub.Predict(request, timeout=5)
                grpc_codes.append("OK")
            except grpc.RpcError as e:
                hinted = e.details() == MESSAGE and "grpc-retry-pushback-ms" in dict(
                    e.trailing_metadata() or ())
                grpc_codes.append(e.code().name + (" draining" if hinted else ""))
            rest_codes.append(_rest_call(rest_port, body))
            time.sleep(0.01)
    return grpc_codes, rest_codes


def _rest_call(port: int, body: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", f"/v1/models/{MODEL}:predict", body,
                     {"content-type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        retry = reply.status == 503 and reply.getheader("retry-after") is not None
        return "503 retry" if retry else str(reply.status)
    except OSError as e:
        return type(e).__name__
    finally:
        conn.close()


def _read_address(proc: subprocess.Popen, timeout_s: float) -> str:
    """Read `listening on HOST:PORT` from the server's output (bounded in time)."""
    found: list[str] = []

    def reader():
        for line in proc.stdout:
            match = re.search(r"listening on (\S+:\d+)", line)
            if match and line.startswith("ampflow serve"):
                found.append(match.group(1))
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not found:
        raise AssertionError(f"server did not report its address in {timeout_s}s")
    return found[0]


# ---- batching, metrics, health, reflection, retries ---------------------------------------------

def _metric(body: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", body, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_batching_merges_concurrent_predicts_and_answers_equal_unbatched(
        served_base, start_server, client_for):
    # 12 requests of 1-3 rows (24 rows) fill one 24-row batch; the long timeout only matters
    # when a request is late (a busy machine), and then the batch runs with fewer requests.
    # no warm-up: its requests would each wait out the batch timeout (3 x 1 s, the CPU idle)
    port = free_port()
    server = start_server(served_base, metrics_port=port, enable_warmup=False,
                          batching=BatchingConfig(max_batch_size=24, batch_timeout_ms=1000))
    reference = tf.saved_model.load(str(served_base / "1")).signatures["serving_default"]
    inputs = [sample_images(1 + i % 3, seed=i) for i in range(12)]
    client = client_for(server.address)
    client.input_specs(MODEL)
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    before = urllib.request.urlopen(metrics_url, timeout=10).read().decode()  # counts before
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda x: client.predict(MODEL, x), inputs))
    for images, result in zip(inputs, results, strict=True):
        expected = reference(images=tf.constant(images))["probabilities"].numpy()
        np.testing.assert_allclose(result.outputs["probabilities"], expected, rtol=1e-5,
                                   atol=1e-7)
    after = urllib.request.urlopen(metrics_url, timeout=10).read().decode()

    def delta(name):
        return _metric(after, name) - _metric(before, name)

    runs = delta("ampflow_serving_batch_requests_count")
    requests = delta("ampflow_serving_batch_requests_sum")
    assert requests == 12  # every request went through the batcher
    assert runs < requests, f"{requests:.0f} requests ran as {runs:.0f} model runs: none merged"
    assert delta("ampflow_serving_batch_rows_sum") == 24


def test_metrics_endpoint_counts_requests_per_model_version_method(
        served_base, start_server, client_for):
    port = free_port()
    server = start_server(served_base, metrics_port=port)
    client = client_for(server.address)
    for _ in range(3):
        client.predict(MODEL, sample_images(1))
    with pytest.raises(RpcError):
        client.predict(MODEL, {"images": sample_images(1)}, version=42)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert ('ampflow_serving_requests_total{method="Predict",model="ampflow",version="1"} 3.0'
            in body)
    # version 42 does not exist: a client-chosen value never becomes a label of its own
    assert ('ampflow_serving_errors_total{code="NOT_FOUND",method="Predict",model="ampflow",'
            'version="<unknown>"} 1.0' in body)
    assert "ampflow_serving_latency_seconds_bucket" in body


def test_health_and_reflection_report_serving_services(served_base, start_server):
    server = start_server(served_base)
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        # ours, and the short names tensorflow_model_server registers (the k8s/ probes use them)
        for service in ("", "tensorflow.serving.PredictionService", "PredictionService",
                        "ModelService"):
            response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING, service
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        names = {s.name for s in answer.list_services_response.service}
    assert {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
            "grpc.health.v1.Health"} <= names


def test_client_retries_unavailable_with_attempt_log_then_raises(caplog):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with PredictionClient(address, timeout_s=2, retries=2, backoff_s=0.01) as client:
        with pytest.raises(RpcError) as info:
            client.status(MODEL)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert "attempt 1/3" in caplog.text and "attempt 2/3" in caplog.text
