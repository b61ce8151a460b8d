"""A deploy whose disk fills up half-way (issue 24, item 2).

The full disk is RLIMIT_FSIZE set in the deploy's own process (tests/full_disk.py; SIGXFSZ
ignored so a write past the limit fails with EFBIG, as a full disk fails with ENOSPC): a tiny
filesystem would need root or FUSE. The copy must fail with one line, leave no version dir a
server would load (nor a staging dir, nor its version claim), and the running server must keep
serving the version it had.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from full_disk import file_size_limited

from ampflow.components.deploy_serving import model_store
from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.server import start_local_server
from ampflow.serving.testing import sample_images, write_model_version

pytestmark = pytest.mark.timeout(300)

FILE_SIZE_LIMIT = 16 * 1024  # bytes: the model's variables and graph are larger



def test_deploy_on_a_full_disk_fails_clearly_and_the_server_keeps_its_version(tmp_path):
    from ampflow.serving.client import PredictionClient

    store = tmp_path / "store"
    write_model_version(store / "ampflow", 1, seed=1)
    new = write_model_version(tmp_path / "export" / "ampflow", 2, seed=2)
    server = start_local_server(ServerConfig(
        models=(ModelConfig("ampflow", store / "ampflow"),), host="127.0.0.1", port=0,
        file_system_poll_wait_seconds=0.2, grace_s=1.0))
    client = PredictionClient(server.address, timeout_s=10.0, retries=2, backoff_s=0.05)
    try:
        assert client.wait_until_available("ampflow", timeout=30) == 1
        done = subprocess.run(
            file_size_limited([sys.executable, "-m", "ampflow.cli", "deploy",
                               "--saved-model-dir", str(new), "--model-store", str(store)],
                              FILE_SIZE_LIMIT),
            capture_output=True, text=True, timeout=240,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert done.returncode == 1, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        errors = [line for line in done.stderr.splitlines() if "could not copy" in line]
        assert len(errors) == 1 and "File too large" in errors[0], done.stderr[-3000:]
        names = {p.name for p in (store / "ampflow").iterdir()}
        assert names == {"1", model_store.VERSIONS_LOCK} or names == {"1"}  # nothing half-copied
        assert client.predict("ampflow", sample_images(1)).version == 1
        assert {row["version"] for row in client.status("ampflow")} == {1}
    finally:
        client.close()
        server.stop()
