"""Configs, the ModelServerConfig text proto, the real binary's argv, tensors and the CLI."""

from __future__ import annotations

import re

import numpy as np
import pytest
from serving_helpers import MODEL, install_version, local_only
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from ampflow.errors import ConfigError
from ampflow.serving.cli import main as serving_main
from ampflow.serving.config import (
    BatchingConfig,
    ModelConfig,
    ServerConfig,
    TlsConfig,
    parse_model_server_config,
    to_model_server_config_text,
)
from ampflow.serving.protocols import tensors
from ampflow.serving.status import ServingStatusError
from ampflow.serving.testing import sample_images
from ampflow.serving.tf_serving_binary import build_argv

MODEL_CONFIG_TEXT = """
model_config_list {
  config {
    name: "digits"
    base_path: "/models/digits"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
  }
  config {
    name: "other"
    base_path: "/models/other"
    model_version_policy { latest { num_versions: 2 } }
  }
}
"""


# ---- configs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"port": 70000}, "port must be in 0..65535 (0 = pick a free one). Received: port=70000"),
    ({"host": "example.com"}, "host must be an IP address"),
    ({"max_message_bytes": 10}, "max_message_bytes must be >= 1024"),
    ({"file_system_poll_wait_seconds": -1}, "file_system_poll_wait_seconds must be >= 0"),
    ({"models": ()}, "at least one model must be configured"),
    ({"max_request_tokens": -1}, "max_request_tokens must be >= 0 (0 = no cap). Received: "
                                 "max_request_tokens=-1"),
    ({"max_execution_tokens": -1}, "max_execution_tokens must be >= 0"),
])
def test_server_config_invalid_value_raises_keras_style_message(kwargs, message, tmp_path):
    kwargs.setdefault("models", (ModelConfig("m", tmp_path),))
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServerConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"name": ""}, "name must be letters, digits"),
    ({"name": "a:b"}, r"REST API can address\)\. Received: name='a:b'"),
    ({"version_policy": "newest"}, "version_policy must be one of"),
    ({"version_policy": "specific"}, "needs at least one version"),
    ({"num_latest": 0}, "num_latest must be >= 1. Received: num_latest=0"),
])
def test_model_config_invalid_value_raises(kwargs, message, tmp_path):
    kwargs = {"name": "m", "base_path": tmp_path, **kwargs}
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**kwargs)


def test_batching_and_tls_configs_validate(tmp_path):
    with pytest.raises(ConfigError, match="max_batch_size must be >= 0"):
        BatchingConfig(max_batch_size=-1)
    assert not BatchingConfig(max_batch_size=1).enabled
    with pytest.raises(ConfigError, match="cert_file must be a readable PEM file"):
        TlsConfig(tmp_path / "missing.pem", tmp_path / "key.pem")


def test_model_server_config_text_proto_parses_policies_and_labels():
    digits, other = parse_model_server_config(MODEL_CONFIG_TEXT)
    assert (digits.name, digits.version_policy, digits.versions) == ("digits", "specific", (1, 2))
    assert digits.version_labels == {"stable": 1, "canary": 2}
    assert (other.version_policy, other.num_latest) == ("latest", 2)
    again = parse_model_server_config(to_model_server_config_text((digits, other)))
    assert again[0].version_labels == digits.version_labels
    assert again[1].num_latest == 2


def test_model_server_config_bad_text_raises_config_error():
    with pytest.raises(ConfigError, match="ModelServerConfig text proto"):
        parse_model_server_config("model_config_list { nonsense: 1 }")


# ---- the real binary's argv (the binary itself cannot run here) ---------------------------------

def test_tf_serving_argv_carries_every_flag(tmp_path):
    config = ServerConfig(
        models=(ModelConfig(MODEL, tmp_path / "m", version_labels={"stable": 1}),),
        port=8600, file_system_poll_wait_seconds=2.0, max_message_bytes=4096,
        batching=BatchingConfig(max_batch_size=32, batch_timeout_ms=5), metrics_port=8601,
        rest_api_port=8601, enable_warmup=False)
    argv = build_argv(config, tmp_path / "work")
    assert argv[0] == "tensorflow_model_server"
    flags = dict(a.split("=", 1) for a in argv[1:])
    assert flags["--port"] == "8600"
    assert flags["--file_system_poll_wait_seconds"] == "2"
    assert flags["--grpc_channel_arguments"] == (
        "grpc.max_receive_message_length=4096,grpc.max_send_message_length=4096")
    assert flags["--enable_batching"] == "true"
    assert flags["--enable_model_warmup"] == "false"
    assert flags["--rest_api_port"] == "8601"
    (model,) = parse_model_server_config(open(flags["--model_config_file"]).read())
    assert model.version_labels == {"stable": 1}
    batching = open(flags["--batching_parameters_file"]).read()
    assert "max_batch_size { value: 32 }" in batching
    assert "batch_timeout_micros { value: 5000 }" in batching
    assert "prometheus_config" in open(flags["--monitoring_config_file"]).read()


def test_tf_serving_argv_passes_model_config_file_and_tls(tmp_path):
    config_file = tmp_path / "models.config"
    config_file.write_text(MODEL_CONFIG_TEXT)
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text(f"-----{name}-----\n")
    config = ServerConfig(models=parse_model_server_config(MODEL_CONFIG_TEXT),
                          model_config_file=config_file,
                          tls=TlsConfig(tmp_path / "cert.pem", tmp_path / "key.pem",
                                        tmp_path / "ca.pem"))
    flags = dict(a.split("=", 1) for a in build_argv(config, tmp_path / "work")[1:])
    assert flags["--model_config_file"] == str(config_file.resolve())
    assert "--enable_batching" not in flags
    ssl = open(flags["--ssl_config_file"]).read()
    assert 'server_cert: "-----cert.pem-----\\n"' in ssl
    assert "client_verify: true" in ssl


# ---- tensors -----------------------------------------------------------------------------------

def _proto(dtype, dims, **values) -> tensor_pb2.TensorProto:
    shape = tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])
    proto = tensor_pb2.TensorProto(dtype=dtype, tensor_shape=shape)
    for field, items in values.items():
        getattr(proto, field).extend(items)
    return proto


def test_to_ndarray_typed_values_fill_like_tensorflow():
    array = tensors.to_ndarray("x", _proto(types_pb2.DT_FLOAT, [2, 2], float_val=[1.0, 2.0]))
    np.testing.assert_array_equal(array, [[1.0, 2.0], [2.0, 2.0]])


def test_to_ndarray_too_many_values_is_invalid_argument():
    with pytest.raises(ServingStatusError, match="needs 2 values. Received: 3"):
        tensors.to_ndarray("x", _proto(types_pb2.DT_INT64, [2], int64_val=[1, 2, 3]))


def test_to_proto_uses_tensor_content_for_numbers_and_string_val_for_bytes():
    assert tensors.to_proto(np.ones((2, 2), np.float32)).tensor_content
    assert list(tensors.to_proto(np.array([b"a", b"b"])).string_val) == [b"a", b"b"]


# ---- CLI ---------------------------------------------------------------------------------------

def test_cli_serve_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        serving_main(["serve", "--help"])
    out = capsys.readouterr().out
    for text in ("(default: 8500)", "(default: 127.0.0.1)", "(default: latest)",
                 "--model-config-file", "--tls-client-ca", "--max-batch-size",
                 "--file-system-poll-wait-seconds"):
        assert text in out


def test_cli_serve_without_model_is_one_line_config_error(capsys):
    assert serving_main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("ampflow serve: error: give --model-base-path or "
                           "--model-config-file. Received: neither")


@pytest.fixture
def served_digit(model_store, tmp_path, start_server):
    """A server with version 1 of the contract model, and one sample digit saved as a PNG."""
    from PIL import Image

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base)
    png = tmp_path / "digit.png"
    Image.fromarray(sample_images(1, seed=9)[0][..., 0].astype(np.uint8), mode="L").save(png)
    return server, png


@pytest.mark.serving
@local_only
def test_cli_predict_metadata_status_against_running_server(
        served_digit, model_store, tmp_path, capsys):
    server, png = served_digit
    npy = tmp_path / "digit.npy"
    np.save(npy, sample_images(1, seed=9)[0])
    labels = tmp_path / "labels.txt"
    labels.write_text((model_store / "1" / "assets" / "labels.txt").read_text())
    common = ["--port", str(server.port), "--model-name", MODEL]
    assert serving_main(["predict", *common, "--labels", str(labels), "--top-k", "2",
                         str(png), str(npy)]) == 0
    out = capsys.readouterr().out
    assert "model ampflow version 1 signature serving_default" in out
    png_line, npy_line = out.splitlines()[1:3]
    assert png_line.startswith(str(png)) and "digit_" in png_line
    assert png_line.split(": ", 1)[1] == npy_line.split(": ", 1)[1]  # same pixels, same answer
    assert serving_main(["model-status", *common]) == 0
    assert "version 1: AVAILABLE" in capsys.readouterr().out
    assert serving_main(["model-metadata", *common]) == 0
    assert '"tensorflow/serving/classify"' in capsys.readouterr().out
    assert serving_main(["model-status", "--port", str(server.port), "--model-name", "nope",
                         "--retries", "0"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_cli_serve_tf_serving_without_binary_is_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no tensorflow_model_server there
    assert serving_main(["serve", "--model-base-path", str(tmp_path), "--server",
                         "tf-serving"]) == 1
    assert "needs tensorflow_model_server on PATH" in capsys.readouterr().err


def _serve_with_fake_binary(tmp_path, *flags):
    """`ampflow serve` with a stand-in `tensorflow_model_server` (a script echoing its argv)
    first on PATH; the real binary cannot be installed here."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\necho "argv: $*"\n')
    fake.chmod(0o755)
    (tmp_path / "m" / "1").mkdir(parents=True)  # a version: `serve` refuses a base path without
    # TMPDIR: the exec'd server keeps its config folder (it runs from it), so it goes here
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
           "TMPDIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "ampflow.serving.cli", "serve", "--model-base-path",
         str(tmp_path / "m"), "--port", "8555", *flags],
        env=env, capture_output=True, text=True, timeout=120)


def test_cli_serve_auto_execs_binary_only_when_it_can_honour_the_binding(tmp_path):
    proc = _serve_with_fake_binary(tmp_path, "--max-batch-size", "8", "--host", "0.0.0.0",
                                   "--allow-reload-config", "--rest-api-port", "8556")
    assert proc.returncode == 0, proc.stderr
    assert "argv: --port=8555 --model_config_file=" in proc.stdout
    assert "--enable_batching=true" in proc.stdout and "--rest_api_port=8556" in proc.stdout
    config_dir, = tmp_path.glob("ampflow-tf-serving-*")  # nothing left in the machine's /tmp
    assert f"--model_config_file={config_dir}/models.config" in proc.stdout


@pytest.mark.parametrize("flags, reason", [
    ((), "listens on every interface, not only --host 127.0.0.1"),
    (("--host", "0.0.0.0", "--allow-reload-config", "--metrics-port", "9100"),
     "serves metrics on its REST port only"),
    (("--host", "0.0.0.0"), "accepts HandleReloadConfigRequest from any client"),
    (("--host", "0.0.0.0", "--allow-reload-config", "--max-request-tokens", "4096"),
     "it has no --max-request-tokens/--max-execution-tokens"),
])
def test_cli_serve_auto_never_widens_the_binding(tmp_path, monkeypatch, capfd, caplog, flags,
                                                reason):
    # Issue 14 item 4: the binary would listen on all interfaces (and put the REST API on the
    # metrics port), so auto keeps the local server; here it then stops at the missing dir.
    # In process (the subprocess run, and the exec, are the test above's): nothing is exec'd.
    import os

    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\necho "argv: $*"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    argv = ["serve", "--model-base-path", str(tmp_path / "m"), "--port", "8555", *flags]
    capfd.readouterr()
    with caplog.at_level("WARNING"):
        code = serving_main(argv)
    out, err = capfd.readouterr()
    err += caplog.text  # (the warning is logged; in a process the CLI's handler prints it)
    assert "argv:" not in out
    assert reason in err and "serving with the local server instead" in err
    assert code == 2 and "model base path must be an existing directory" in err
    strict = serving_main([*argv, "--server", "tf-serving"])
    out, err = capfd.readouterr()
    assert strict == 2 and "argv:" not in out
    assert "--server tf-serving cannot run with these flags" in err


def test_cli_serve_missing_base_path_fails_at_start(tmp_path, capsys):
    assert serving_main(["serve", "--server", "local", "--port", "0", "--model-base-path",
                         str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "model base path must be an existing directory" in err
    assert "--wait-for-base-path" in err


def test_cli_serve_garbage_tls_certificate_says_so_not_cannot_bind(tmp_path, capsys):
    (tmp_path / "m" / "1").mkdir(parents=True)
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("garbage\n")
    assert serving_main(["serve", "--server", "local", "--port", "0", "--model-base-path",
                         str(tmp_path / "m"), "--tls-cert", str(tmp_path / "cert.pem"),
                         "--tls-key", str(tmp_path / "key.pem")]) == 2
    err = capsys.readouterr().err
    assert "must be a PEM certificate and its matching PEM private key" in err
    assert "cannot bind" not in err


@pytest.mark.serving
@local_only
def test_base_path_that_becomes_a_store_while_waiting_warns_with_the_meant_dir(
        model_store, tmp_path, start_server, caplog):
    base = tmp_path / "models" / MODEL
    base.parent.mkdir()
    server = start_server(base.parent, wait_for_base_path=True)  # (a store is refused at start)
    assert "holds no version dirs" in caplog.text
    install_version(model_store, base, 1)  # a deploy writes one level below
    server.registry.poll_once()
    assert f"did you mean {base}, which holds versions [1]" in caplog.text


@pytest.mark.serving
@local_only
def test_cli_predict_through_classify_signature_prints_top_k(
        served_digit, model_store, capsys):
    server, png = served_digit
    common = ["--port", str(server.port), "--model-name", MODEL, "--top-k", "2"]
    assert serving_main(["predict", *common, "--signature", "classify", str(png)]) == 0
    out = capsys.readouterr().out
    assert "signature classify" in out
    classify_line = out.splitlines()[1]
    labels = str(model_store / "1" / "assets" / "labels.txt")
    assert serving_main(["predict", *common, "--labels", labels, str(png)]) == 0
    predict_line = capsys.readouterr().out.splitlines()[1]
    # the same image through both signatures: the same classes, ids and probabilities
    assert classify_line == predict_line


def test_load_images_corrupt_npy_and_mixed_shapes_are_config_errors(tmp_path):
    import numpy as np

    from ampflow.errors import ConfigError
    from ampflow.serving.client import load_images

    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ConfigError, match="readable numeric .npy"):
        load_images([bad], (-1, 8, 8, 1))
    np.save(tmp_path / "a.npy", np.zeros((8, 8, 1)))
    np.save(tmp_path / "b.npy", np.zeros((4, 4, 1)))
    with pytest.raises(ConfigError, match="one shape"):
        load_images([tmp_path / "a.npy", tmp_path / "b.npy"], (-1, 8, 8, 1))


@pytest.mark.parametrize("bad", ["stable=²", "stable=1²", "stable=", "stable", "stable=-1",
                                 f"stable={2 ** 63}"])
def test_cli_serve_version_label_that_names_no_version_is_one_line(bad, capsys):
    # Issue 41: '²'.isdigit() is True and int('²') raised: a traceback, not a flag error
    assert serving_main(["serve", "--model-base-path", "m", "--version-label", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampflow serve: error: --version-label must be LABEL=VERSION, "
                          "VERSION a number 0..9223372036854775807. Received: ")
    assert len(err.strip().splitlines()) == 1


def test_cli_serve_flag_defaults_are_the_config_fields_defaults():
    from pathlib import Path

    from ampflow.cli import build_parser
    from ampflow.serving.cli import serve_config_from_args

    config = serve_config_from_args(build_parser().parse_args(
        ["serve", "--model-base-path", "m"]))
    assert config == ServerConfig(models=(ModelConfig("ampflow", Path("m")),))


def test_cli_serve_config_error_names_the_flag(capsys):
    assert serving_main(["serve", "--model-base-path", "m", "--num-latest", "0"]) == 2
    assert "--num-latest must be >= 1" in capsys.readouterr().err


def test_cli_in_a_callers_process_leaves_its_settings_as_they_were(tmp_path, capsys, monkeypatch):
    """`main(argv)` in a caller's own process (a test, a notebook): --quiet, --progress-every-s
    and --log-level DEBUG are the command's. Before, they stayed in os.environ (AMPFLOW_QUIET=1
    for every later progress display and child process) and absl's noise filter stayed off."""
    import os

    from ampflow import progress
    from ampflow.fast_start import python_noise_quieted

    monkeypatch.setenv(progress.EVERY_S_ENV, "7")  # the caller's own: kept
    monkeypatch.setenv(progress.QUIET_ENV, "")
    monkeypatch.delenv(progress.QUIET_ENV)  # unset, and unset again after this test
    assert python_noise_quieted()  # `import ampflow` installs absl's noise filter
    code = serving_main(["--quiet", "--progress-every-s", "5", "--log-level", "DEBUG", "serve",
                         "--model-base-path", str(tmp_path / "missing")])
    assert code == 2, capsys.readouterr().err
    assert os.environ.get(progress.EVERY_S_ENV) == "7"
    assert progress.QUIET_ENV not in os.environ
    assert python_noise_quieted()  # --log-level DEBUG took it off for the command only
