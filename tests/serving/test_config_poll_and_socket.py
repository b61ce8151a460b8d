"""TF Serving's `--model_config_file_poll_wait_seconds` and `--grpc_socket_path` (issue 49).

The config file re-read on a timer (config_poll.py): a new model list is applied as a reload
would apply it; a file that does not parse keeps the models served and is said in one log line,
not one per poll; a later good file is applied. gRPC on a Unix socket beside the TCP port, as
upstream's `testPredictUDS` calls it. Real registries loading half_plus_two (TF Serving's test
model, tf_serving_models.py); the server tests run one in-process.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import grpc
import pytest
import tensorflow as tf
from serving_helpers import running_server
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tf_serving_models import write_half_plus_two

from ampflow.cli import build_parser
from ampflow.errors import ConfigError
from ampflow.serving import tf_serving_binary as tfs
from ampflow.serving.cli import serve_config_from_args
from ampflow.serving.config import ModelConfig, ServerConfig, load_model_config_file
from ampflow.serving.config_poll import ConfigFilePoller
from ampflow.serving.models.registry import ModelRegistry

UPSTREAM_BAD_CONFIG = "Error parsing text-format tensorflow.serving.ModelServerConfig"


def _config_text(**models: Path) -> str:
    """A ModelServerConfig as upstream's testModelConfigReload writes it."""
    entries = "".join(f'config: {{ name: "{name}", base_path: "{path}", '
                      f'model_platform: "tensorflow" }} ' for name, path in models.items())
    return f"model_config_list: {{ {entries}}}"


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """half_plus_two under two names, each with version 1, written a minute ago.

    The registry loads a version dir only once it has stopped changing (its settle period,
    1 s here): a "two" written a moment before the config names it would wait for the next
    poll. On a loaded host, writing "two" took over a second, so "one" was settled at start
    and "two" was not when the test's reload came (make test-fast failed so once). These are
    finished dirs, as a deploy leaves them: their files' times are set back past any settle
    period (and start no longer waits one for "one").
    """
    root = tmp_path_factory.mktemp("poll-models")
    bases = {name: write_half_plus_two(root / name / "1").parent for name in ("one", "two")}
    settled = time.time() - 60
    for path in root.rglob("*"):
        os.utime(path, (settled, settled))
    return bases


@pytest.fixture
def registry(bases, tmp_path):
    path = tmp_path / "models.config"
    path.write_text(_config_text(one=bases["one"]))
    registry = ModelRegistry(load_model_config_file(path))
    registry.start(0)
    yield registry, path
    registry.stop()


def test_a_changed_config_file_is_applied_and_an_unchanged_one_left_alone(registry, bases):
    registry, path = registry
    poller = ConfigFilePoller(path, registry, 60, registry.configs()[0])
    assert poller.poll_once() is False  # the file says what is served
    path.write_text(_config_text(two=bases["two"]))
    assert poller.poll_once() is True
    assert registry.model_names() == ["two"]
    assert registry.resolve("two", None, None).version == 1
    assert poller.poll_once() is False


def test_a_bad_config_file_keeps_the_models_served_and_is_one_log_line(registry, bases, caplog):
    registry, path = registry
    poller = ConfigFilePoller(path, registry, 60, registry.configs()[0])
    path.write_text("model_config_list { config { name: ")
    with caplog.at_level(logging.ERROR, logger="ampflow.serving.config_poll"):
        assert poller.poll_once() is False
        assert poller.poll_once() is False  # the same error: not said again
    assert registry.model_names() == ["one"]
    lines = [r.getMessage() for r in caplog.records if r.name == "ampflow.serving.config_poll"]
    assert len(lines) == 1 and "the models served stay as they are" in lines[0]
    assert UPSTREAM_BAD_CONFIG in lines[0] and "\n" not in lines[0]
    path.write_text(_config_text(one=bases["one"], two=bases["two"]))  # fixed: applied
    assert poller.poll_once() is True
    assert registry.model_names() == ["one", "two"]


def test_the_server_wide_model_settings_carry_over_to_the_models_read_later(registry, bases):
    registry, path = registry
    template = ModelConfig("any", bases["one"], model_format="saved_model")
    poller = ConfigFilePoller(path, registry, 60, template)
    path.write_text(_config_text(two=bases["two"]))
    poller.poll_once()
    assert [m.model_format for m in registry.configs()] == ["saved_model"]


def _cli_config(*argv: str) -> ServerConfig:
    return serve_config_from_args(build_parser().parse_args(["serve", *argv]))


def test_tf_serving_spellings_parse_to_the_same_config(bases, tmp_path):
    path = tmp_path / "models.config"
    path.write_text(_config_text(one=bases["one"]))
    tf_form = _cli_config(f"--model_config_file={path}",
                          "--model_config_file_poll_wait_seconds=60",
                          f"--grpc_socket_path={tmp_path / 's.sock'}")
    own_form = _cli_config("--model-config-file", str(path),
                           "--model-config-file-poll-wait-seconds", "60",
                           "--grpc-socket-path", str(tmp_path / "s.sock"))
    assert tf_form == own_form
    assert tf_form.grpc_socket_path == tmp_path / "s.sock"
    argv = tfs.build_argv(tf_form, tmp_path / "work")
    assert "--model_config_file_poll_wait_seconds=60" in argv
    assert f"--grpc_socket_path={tmp_path / 's.sock'}" in argv


@pytest.mark.parametrize("fields, message", [
    ({"model_config_file_poll_wait_seconds": 5.0},
     "model_config_file_poll_wait_seconds needs model_config_file"),
    ({"grpc_socket_path": "/tmp/s.sock", "workers": 2}, "grpc_socket_path needs workers=1"),
    ({"grpc_socket_path": "/tmp/" + "s" * 120}, "grpc_socket_path must be 1..107 bytes"),
])
def test_bad_poll_or_socket_settings_are_refused_in_one_line(fields, message):
    with pytest.raises(ConfigError, match=message):
        ServerConfig(models=(ModelConfig("m", "b"),), **fields)


def test_an_unparsable_config_file_says_tf_servings_words(tmp_path):
    path = tmp_path / "bad.config"
    path.write_text("this is not a config")
    with pytest.raises(ConfigError, match=UPSTREAM_BAD_CONFIG):
        load_model_config_file(path)


def _predict(address: str, model: str) -> float:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[2.0]], dtype=tf.float32))
    with grpc.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return tf.make_ndarray(stub.Predict(request, timeout=30).outputs["y"]).item()


def _wait_for_model(address: str, model: str, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _predict(address, model)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.slow  # starts a server
@pytest.mark.serving
@pytest.mark.timeout(120)
def test_a_polling_server_serves_the_new_config_and_keeps_it_through_a_bad_file(bases, tmp_path,
                                                                              caplog):
    path = tmp_path / "models.config"
    path.write_text(_config_text(one=bases["one"]))
    config = ServerConfig(models=load_model_config_file(path), model_config_file=path,
                          model_config_file_poll_wait_seconds=0.5, port=0, grace_s=0.5)
    with running_server(config) as server:
        assert _predict(server.address, "one") == 3.0
        path.write_text(_config_text(two=bases["two"]))
        assert _wait_for_model(server.address, "two", 30) == 3.0
        path.write_text("garbage {")
        # once a poll has read the bad file (its one error line), not after a sleep that a
        # loaded host may fill with no poll at all
        deadline = time.monotonic() + 30
        while not any("not applied, the models served stay" in r.getMessage()
                      for r in caplog.records):
            assert time.monotonic() < deadline, "no poll read the bad file within 30 s"
            time.sleep(0.05)
        assert _predict(server.address, "two") == 3.0
        with pytest.raises(grpc.RpcError) as gone:
            _predict(server.address, "one")
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.slow  # starts a server
@pytest.mark.serving
@pytest.mark.timeout(120)
def test_predict_over_the_unix_socket_beside_the_tcp_port(bases):
    """Upstream's testPredictUDS: the same Predict at `unix:<path>` as at the gRPC port."""
    with tempfile.TemporaryDirectory(prefix="ampflow-uds-") as folder:  # short: sun_path
        socket_path = Path(folder) / "tf-serving.sock"
        config = ServerConfig(models=(ModelConfig("one", bases["one"]),), port=0, grace_s=0.5,
                              grpc_socket_path=socket_path)
        with running_server(config) as server:
            assert socket_path.is_socket()
            assert _predict(f"unix:{socket_path}", "one") == 3.0
            assert _predict(server.address, "one") == 3.0
