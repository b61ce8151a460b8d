"""The REST client's round trips against a real in-process `ampflow serve` (gRPC + REST).

TF Serving's REST answers do not name the version that answered, and a predict needs the
signature's specs to type its inputs and outputs. Before, every `RestClient.predict` asked for
the metadata twice and the status once beside the POST (2.7x a gRPC Predict in
benchmarks/results/serving.md), and reported the version it asked for *after* the call, so a
version loaded in between was reported for an answer it did not give.
"""

from __future__ import annotations

import numpy as np
import pytest
from ports import free_port

pytestmark = [pytest.mark.serving, pytest.mark.timeout(120)]

MODEL = "roundtrips"


@pytest.fixture(scope="module")
def rest_address(tmp_path_factory):
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server
    from ampflow.serving.testing import write_model_version

    base = tmp_path_factory.mktemp("store") / MODEL
    for version in (1, 2):  # the server's default policy serves the newest: 2
        write_model_version(base, version, model_name=MODEL)
    server = start_local_server(ServerConfig(
        models=(ModelConfig(MODEL, base),), host="127.0.0.1", port=0,
        rest_api_port=free_port(), grace_s=1.0))
    try:
        yield server.rest_address
    finally:
        server.stop(0.5)


def _counting_client(address, package: str = "ampflow_client"):
    """The real client of `package` (the TensorFlow-free one, or ampflow's own subclass)."""
    if package == "ampflow_client":
        from ampflow_client import RestClient
    else:
        from ampflow.serving.rest_client import RestClient

    class CountingClient(RestClient):
        """The real client; each HTTP call it makes is recorded as (method, path)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls: list[tuple[str, str]] = []

        def call(self, method, path, payload=None):
            self.calls.append((method, path))
            return super().call(method, path, payload)

    return CountingClient(address, timeout_s=30.0)


# ampflow's RestClient (ampflow predict --rest, the benchmark) overrode `signature` and so
# asked for the metadata on every predict, bypassing the cache of the client it extends
@pytest.mark.parametrize("package", ["ampflow_client", "ampflow.serving"])
def test_a_pinned_version_asks_for_its_metadata_once(rest_address, package):
    from ampflow.serving.testing import sample_images

    with _counting_client(rest_address, package) as client:
        first = client.predict(MODEL, sample_images(2, seed=1), version=2)
        client.calls.clear()
        again = client.predict(MODEL, sample_images(2, seed=1), version=2)
    assert client.calls == [("POST", f"/v1/models/{MODEL}/versions/2:predict")]
    assert first.version == again.version == 2
    np.testing.assert_array_equal(first.outputs["probabilities"], again.outputs["probabilities"])


def test_an_unpinned_predict_is_sent_to_the_version_it_reports(rest_address):
    from ampflow.serving.testing import sample_images

    with _counting_client(rest_address) as client:
        client.predict(MODEL, sample_images(1, seed=2))
        client.calls.clear()
        answer = client.predict(MODEL, sample_images(1, seed=2))
    # one status call finds the newest AVAILABLE version, then the request goes to exactly it
    assert client.calls == [("GET", f"/v1/models/{MODEL}"),
                            ("POST", f"/v1/models/{MODEL}/versions/2:predict")]
    assert answer.version == 2


def test_classify_without_a_version_reports_the_version_it_asked(rest_address):
    from ampflow.serving.testing import sample_images

    with _counting_client(rest_address) as client:
        result = client.classify(MODEL, [{"image": image.ravel()} for image in sample_images(1)],
                                  signature="classify")
    assert client.calls[-1] == ("POST", f"/v1/models/{MODEL}/versions/2:classify")
    assert result.version == 2


# Issue 38: predictions printed `2 (2)`; the names the model ships (assets/labels.txt) are
# answered by its classify signature, read once per pinned version
@pytest.mark.parametrize("package", ["ampflow_client", "ampflow.serving"])
def test_class_names_are_the_labels_the_model_ships_asked_once_per_version(rest_address,
                                                                           package):
    from ampflow.serving.testing import DEFAULT_LABELS

    with _counting_client(rest_address, package) as client:
        assert client.class_names(MODEL, 2) == list(DEFAULT_LABELS)
        client.calls.clear()
        assert client.class_names(MODEL, 2) == list(DEFAULT_LABELS)
    assert client.calls == []
