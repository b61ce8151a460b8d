"""Fixtures of the serving tests: a real tiny SavedModel and real servers on loopback.

The model follows docs/ARTIFACTS.md (see `ampflow.serving.testing`: TF2 saves every signature
as `tensorflow/serving/predict`, so the fixture rewrites the `classify` SignatureDef's
method_name to `tensorflow/serving/classify` in saved_model.pb after saving).

Conformance target: by default the tests start `ampflow serve`'s server in-process on a free
127.0.0.1 port. Set AMPFLOW_SERVING_TARGET=host:port to run the same conformance tests against
another server (e.g. a real tensorflow_model_server); then also set
AMPFLOW_SERVING_MODEL_DIR to the base path it serves (write it with
`python -m ampflow.serving.testing --base-path DIR`, version 1 only), and optionally
AMPFLOW_SERVING_MODEL (default `ampflow`) and AMPFLOW_SERVING_MAX_MESSAGE_BYTES (the
server's configured limit, for the RESOURCE_EXHAUSTED test).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from serving_helpers import (  # noqa: E402
    EXTERNAL_TARGET,
    LOCAL_MAX_MESSAGE_BYTES,
    MODEL,
    Target,
    install_version,
)

from ampflow.serving.config import BatchingConfig, ModelConfig, ServerConfig  # noqa: E402


@pytest.fixture(scope="session")
def model_store(tmp_path_factory) -> Path:
    """Versions 1 and 2 of the contract model, written once; tests copy them into place."""
    from ampflow.serving.testing import write_model_version

    store = tmp_path_factory.mktemp("model_store")
    for version in (1, 2):
        write_model_version(store, version, model_name=MODEL)
    return store


@pytest.fixture
def start_server():
    """Factory: start an in-process server on a free loopback port; all stopped at teardown."""
    from ampflow.serving.server import start_local_server

    running = []

    def _start(base: Path | None = None, *, models=None, **overrides):
        models = models or (ModelConfig(MODEL, base),)
        overrides.setdefault("file_system_poll_wait_seconds", 0.2)
        overrides.setdefault("grace_s", 2.0)
        config = ServerConfig(models=tuple(models), host="127.0.0.1", port=0, **overrides)
        server = start_local_server(config)
        running.append(server)
        return server

    yield _start
    for server in running:
        server.stop(0.5)


@pytest.fixture
def client_for():
    """Factory: a PredictionClient for an address; all closed at teardown."""
    from ampflow.serving.client import PredictionClient

    clients = []

    def _make(address: str, **kwargs):
        kwargs.setdefault("timeout_s", 10.0)
        kwargs.setdefault("retries", 2)
        kwargs.setdefault("backoff_s", 0.05)
        client = PredictionClient(address, **kwargs)
        clients.append(client)
        return client

    yield _make
    for client in clients:
        client.close()


@pytest.fixture(scope="session")
def conformance_target(model_store, tmp_path_factory):
    """The server under test: external (env) or an in-process `ampflow serve` server."""
    if EXTERNAL_TARGET:
        base = os.environ.get("AMPFLOW_SERVING_MODEL_DIR")
        if not base:
            pytest.fail("AMPFLOW_SERVING_TARGET needs AMPFLOW_SERVING_MODEL_DIR (the base path "
                        "it serves) to compare answers with in-process inference")
        limit = os.environ.get("AMPFLOW_SERVING_MAX_MESSAGE_BYTES")
        yield Target(EXTERNAL_TARGET, MODEL, Path(base), False, int(limit) if limit else None)
        return
    from ampflow.serving.server import start_local_server

    base = tmp_path_factory.mktemp("conformance") / MODEL
    install_version(model_store, base, 1)
    config = ServerConfig(models=(ModelConfig(MODEL, base),), host="127.0.0.1", port=0,
                          max_message_bytes=LOCAL_MAX_MESSAGE_BYTES, grace_s=1.0,
                          batching=BatchingConfig())
    server = start_local_server(config)
    try:
        yield Target(server.address, MODEL, base, True, LOCAL_MAX_MESSAGE_BYTES)
    finally:
        server.stop(0.5)


@pytest.fixture(scope="session")
def reference(conformance_target):
    """The same SavedModel (version 1) loaded in-process: what every answer must equal."""
    import tensorflow as tf

    return tf.saved_model.load(str(conformance_target.base_path / "1"))


@pytest.fixture(scope="session")
def digits_export(tmp_path_factory, trained_model, prepared_digits):
    """A real export (all three signatures) of the session's mixed_float16 digits model.

    `force=True` stands in for the evaluate step's verdict (the export tests cover the gate);
    the export's own parity checks, image_bytes included, still run. Returns the ExportResult.
    """
    from ampflow.components.export_savedmodel import ExportConfig, run_export

    base = tmp_path_factory.mktemp("digits-export")
    return run_export(ExportConfig(model_dir=trained_model("mixed_float16"),
                                   data_dir=prepared_digits, export_base=base, force=True,
                                   num_parity_images=64, num_warmup_records=1))
