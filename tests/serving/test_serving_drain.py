"""The drain: calls that arrive while a server stops are refused retryably, in-flight ones finish.

grpcio's shutdown cancels a call that reached gRPC's core just before it (CANCELLED, which no
retry policy retries), so the server first refuses new calls itself: UNAVAILABLE with a retry
pushback over gRPC, 503 with Retry-After and `Connection: close` over REST (transport/drain.py).
The SIGTERM path of a real `ampflow serve` is tested in test_serving_server.py.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from serving_helpers import MODEL, free_port, install_version, local_only, predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

from ampflow.serving.config import BatchingConfig
from ampflow.serving.testing import sample_images
from ampflow.serving.transport.drain import MESSAGE

pytestmark = [pytest.mark.serving, local_only, pytest.mark.timeout(120)]

REFUSE_S = 2.0  # the stop's refusal: the window the two refused calls below must fall in


def _rest_predict(port: int) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", f"/v1/models/{MODEL}:predict",
                     json.dumps({"instances": sample_images(1).tolist()}),
                     {"content-type": "application/json"})
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read().decode()
    finally:
        conn.close()


def test_calls_arriving_while_the_server_drains_are_unavailable_and_in_flight_ones_finish(
        model_store, tmp_path, start_server):
    # A 1.5 s batch timeout holds one Predict in flight into the stop's REFUSE_S of refusal,
    # long enough for the two refused calls on a loaded host.
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, rest_api_port=free_port(), enable_warmup=False,
                          batching=BatchingConfig(max_batch_size=64, batch_timeout_ms=1500))
    channel = grpc.insecure_channel(server.address)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_request(MODEL, sample_images(1))
    try:
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(stub.Predict, request, timeout=30)
            # in flight once the batcher holds it (its queue exists: warm-up is off), not
            # after a sleep: a loaded host may not have delivered it yet, and the stop
            # would refuse it
            while not server._batcher._queues:
                assert not in_flight.done(), in_flight.exception()
                time.sleep(0.01)
            stopper = threading.Thread(target=server.stop,
                                       kwargs={"grace": 5, "refuse_s": REFUSE_S})
            stopper.start()
            while not server._drain.draining:
                time.sleep(0.01)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Predict(request, timeout=10)
            status, headers, body = _rest_predict(server.rest_port)
            answer = in_flight.result(timeout=30)
            stopper.join(30)
    finally:
        channel.close()
    assert answer.model_spec.version.value == 1  # the in-flight call completed
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    assert refused.value.details() == MESSAGE
    pushback = dict(refused.value.trailing_metadata() or ())
    assert int(pushback["grpc-retry-pushback-ms"]) > REFUSE_S * 1000  # after the stop
    assert (status, json.loads(body)) == (503, {"error": MESSAGE})
    assert int(headers["retry-after"]) >= 1
    assert headers["connection"] == "close"
