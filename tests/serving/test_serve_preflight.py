"""`ampflow serve` refuses a base path or a port it cannot serve on, before loading anything.

Issue 38 point 3: a version dir, the store above the model, a folder with no version and a
busy port are each one line, exit 2, with the path or flag that would work; TensorFlow is never
imported on the way (that is what keeps it under a second: no model, no graph runtime).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from serving_helpers import MODEL, install_version, local_only

from ampflow.errors import ConfigError
from ampflow.serving import preflight

# In a child: run `serve` with each argv, say its exit code and stderr, and whether any of
# TensorFlow (or a model) was imported on the way.
_CHILD = """
import contextlib, io, json, sys
from ampflow.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["serve", "--server", "local", *argv])
    results.append([code, err.getvalue()])
print(json.dumps({"results": results, "tensorflow": "tensorflow" in sys.modules}))
"""


def _serve_in_child(*argvs: list[str]) -> tuple[list, bool]:
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argvs)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    return answer["results"], answer["tensorflow"]


@pytest.fixture
def store(model_store, tmp_path):
    """runs/x/serving as deploy writes it: <store>/<model>/1/."""
    root = tmp_path / "serving"
    install_version(model_store, root / MODEL, 1)
    return root


@local_only
def test_serve_refuses_version_dir_store_empty_dir_and_busy_port_before_importing_tf(
        store, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        good = ["--model-name", MODEL, "--model-base-path", str(store / MODEL)]
        results, tf_imported = _serve_in_child(
            ["--model-name", MODEL, "--model-base-path", str(store / MODEL / "1")],
            ["--model-name", MODEL, "--model-base-path", str(store)],
            ["--model-name", MODEL, "--model-base-path", str(empty)],
            [*good, "--port", str(port)],
            [*good, "--port", "0", "--rest-api-port", str(port)])
    for code, err in results:
        assert code == 2, results
        assert len(err.strip().splitlines()) == 1, results
        assert err.startswith("ampflow serve: error: ")
    version_dir, whole_store, no_version, grpc_port, rest_port = (err for _c, err in results)
    assert f"use --model-base-path {store / MODEL}\n" in version_dir
    assert f"use --model-base-path {store / MODEL}, which holds versions [1]" in whole_store
    assert "holds none" in no_version and "--wait-for-base-path" in no_version
    assert f"--port {port}, already in use" in grpc_port
    assert f"--rest-api-port {port}, already in use" in rest_port
    assert not tf_imported  # refused before any model (or TensorFlow) was loaded


def test_store_hint_prefers_the_model_of_the_same_name(tmp_path):
    for model in ("aaa", "zzz"):
        (tmp_path / model / "3").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"use --model-base-path \S+/zzz, which holds "
                                          r"versions \[3\]"):
        preflight.check_base_path("zzz", tmp_path, wait=False)
    with pytest.raises(ConfigError, match=r"holds the models \['aaa', 'zzz'\]"):
        preflight.check_base_path("other", tmp_path, wait=False)


def test_saved_model_files_right_in_the_base_path_are_refused_with_where_to_move_them(
        tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"move them into \S+/1 and keep --model-base-path"):
        preflight.check_base_path(MODEL, tmp_path, wait=True)


def test_wait_flag_allows_a_missing_or_empty_base_path_only(tmp_path):
    preflight.check_base_path(MODEL, tmp_path / "not-yet", wait=True)
    preflight.check_base_path(MODEL, tmp_path, wait=True)
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "model.tflite").write_bytes(b"")
    with pytest.raises(ConfigError, match="version 7 itself"):
        preflight.check_base_path(MODEL, tmp_path / "7", wait=True)  # never where versions go


@local_only
def test_library_start_refuses_the_store_and_a_busy_rest_port(store, start_server):
    with pytest.raises(ConfigError, match="a store of models"):
        start_server(store)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ConfigError, match="--rest-api-port"):
            start_server(store / MODEL, rest_api_port=busy.getsockname()[1])


@pytest.mark.serving
@local_only
def test_waiting_for_an_empty_base_path_logs_every_poll_then_serves(
        model_store, tmp_path, start_server, client_for, caplog):
    base = tmp_path / MODEL
    base.mkdir()
    with caplog.at_level("INFO", logger="ampflow.serving"):
        server = start_server(base, wait_for_base_path=True, file_system_poll_wait_seconds=0.05)
        client = client_for(server.address)
        _wait_for(lambda: caplog.text.count("still no version in") >= 3)
        install_version(model_store, base, 1)
        assert client.wait_until_available(MODEL, timeout=20) == 1


def _wait_for(condition, timeout_s: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
