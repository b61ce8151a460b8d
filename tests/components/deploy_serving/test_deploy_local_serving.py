"""`deploy --target local` under a running `ampflow serve`: hot-loaded, nothing dropped.

A real server process on loopback and a client thread that never stops sending Predict while
version 2 is deployed next to version 1: every request must succeed, the answers must move from
version 1 to version 2, and the server process must be the same one throughout.
"""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from deploy_helpers import MODEL_NAME

from ampflow.components.deploy_serving import DeployConfig, run_deploy

pytestmark = [pytest.mark.serving]


class _Traffic(threading.Thread):
    """Predict on the latest version in a loop; record each answer's version or error."""

    def __init__(self, address: str, images: np.ndarray) -> None:
        super().__init__(daemon=True)
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        self.channel = grpc.insecure_channel(address)
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.request = predict_pb2.PredictRequest()
        self.request.model_spec.name = MODEL_NAME
        self.request.model_spec.signature_name = "serving_default"
        self.request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
        self.stop = threading.Event()
        self.versions: list[int] = []
        self.errors: list[str] = []
        self.last: dict[int, np.ndarray] = {}

    def run(self) -> None:
        import tensorflow as tf

        while not self.stop.is_set():
            try:
                response = self.stub.Predict(self.request, timeout=10)
                version = response.model_spec.version.value
                self.versions.append(version)
                self.last[version] = tf.make_ndarray(response.outputs["probabilities"])
            except grpc.RpcError as e:
                self.errors.append(f"{e.code().name}: {e.details()}")
            time.sleep(0.02)
        self.channel.close()

    def wait_for(self, version: int, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.versions.count(version) >= count:
                return True
            time.sleep(0.1)
        return False


def _expected(saved_model_dir, images):
    import tensorflow as tf

    serve = tf.saved_model.load(str(saved_model_dir)).signatures["serving_default"]
    return serve(images=tf.constant(images))["probabilities"].numpy()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_deploy_local_hot_loads_new_version_without_restart_or_failed_request(
    served_store, export_base
):
    store, address, proc = served_store
    from ampflow.artifacts.canary_examples import load_canary_examples
    from ampflow.components.deploy_serving import canary, model_store

    spec = model_store.check_saved_model(export_base / MODEL_NAME / "1")
    examples = load_canary_examples(export_base / MODEL_NAME / "1")
    assert canary.check_version_served(address, MODEL_NAME, 1, spec, examples, timeout_s=120,
                                       atol=1e-5) == 1
    images = np.random.default_rng(0).uniform(0, 255, (4, 8, 8, 1)).astype(np.float32)
    traffic = _Traffic(address, images)
    traffic.start()
    try:
        assert traffic.wait_for(1, count=5, timeout_s=30), traffic.errors[-3:]
        result = run_deploy(
            DeployConfig(
                saved_model_dir=export_base / MODEL_NAME / "2",
                model_store=str(store),
                server_address=address,
                canary_timeout_s=60,
            )
        )
        assert result.served_version == 2 and result.endpoint == address
        assert traffic.wait_for(2, count=10, timeout_s=30), "version 2 never answered"
    finally:
        traffic.stop.set()
        traffic.join(timeout=15)
    assert traffic.errors == []  # not one failed request across the switch
    first_v2 = traffic.versions.index(2)
    assert set(traffic.versions[:first_v2]) == {1} and set(traffic.versions[first_v2:]) == {2}
    assert proc.poll() is None  # the same server process throughout: no restart
    np.testing.assert_allclose(
        traffic.last[2], _expected(export_base / MODEL_NAME / "2", images), rtol=1e-5, atol=1e-6
    )
