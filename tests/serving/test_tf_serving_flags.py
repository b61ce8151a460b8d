"""`ampflow serve` takes tensorflow_model_server's command line as it is (issue 49, point 2).

TF Serving's flag names are aliases of serve's own (parsed here into the same config, no
server), what build_argv writes for the real binary reads back to the same config, every
other flag of the binary is refused in one line naming it, and the tensorflow/serving
container's own arguments start a server that answers.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from serving_helpers import free_port, install_version, local_only

from ampflow.cli import build_parser
from ampflow.serving import tf_serving_binary as tfs
from ampflow.serving.cli import main as serving_main
from ampflow.serving.cli import serve_config_from_args
from ampflow.serving.config import BatchingConfig, ModelConfig, ServerConfig, TlsConfig

# tensorflow_model_server's flags, as tensorflow_serving/model_servers/main.cc lists them
UPSTREAM_FLAGS = (
    "port grpc_socket_path rest_api_port rest_api_num_threads rest_api_timeout_in_ms "
    "rest_api_enable_cors_support enable_batching allow_version_labels_for_unavailable_models "
    "batching_parameters_file enable_per_model_batching_parameters model_config_file "
    "model_config_file_poll_wait_seconds model_name model_base_path num_load_threads "
    "num_unload_threads max_num_load_retries load_retry_interval_micros "
    "file_system_poll_wait_seconds flush_filesystem_caches tensorflow_session_parallelism "
    "tensorflow_session_config_file tensorflow_intra_op_parallelism "
    "tensorflow_inter_op_parallelism use_alts_credentials ssl_config_file platform_config_file "
    "per_process_gpu_memory_fraction saved_model_tags grpc_channel_arguments grpc_max_threads "
    "enable_model_warmup num_request_iterations_for_warmup version monitoring_config_file "
    "remove_unused_fields_from_bundle_metagraph prefer_tflite_model num_tflite_pools "
    "num_tflite_interpreters_per_pool enable_signature_method_name_check "
    "xla_cpu_compilation_enabled xla_gpu_compilation_enabled enable_profiler "
    "thread_pool_factory_config_file mixed_precision skip_initialize_tpu "
    "enable_grpc_healthcheck_service enable_serialization_as_tensor_content").split()


def _config(*argv: str) -> ServerConfig:
    return serve_config_from_args(build_parser().parse_args(["serve", *argv]))


def _exit_code(*argv: str) -> int:
    """`ampflow serve ARGV`'s exit code in this process (a usage error is argparse's exit)."""
    try:
        return serving_main(["serve", *argv])
    except SystemExit as e:
        return e.code


def test_every_tf_serving_flag_is_an_alias_taken_or_refused():
    known = ({"port"} | set(tfs.TF_SERVING_ALIASES) | set(tfs.TF_SERVING_FIXED)
             | set(tfs.TF_SERVING_UNSUPPORTED))
    assert known == set(UPSTREAM_FLAGS)
    assert not set(tfs.TF_SERVING_UNSUPPORTED) & set(tfs.TF_SERVING_FIXED)


@pytest.mark.parametrize("tf_form, own_form", [
    (["--port=8500", "--rest_api_port=8501", "--model_name=m", "--model_base_path=/models/m"],
     ["--port", "8500", "--rest-api-port", "8501", "--model-name", "m", "--model-base-path",
      "/models/m"]),
    (["--model_base_path", "b", "--rest_api_port", "9000"],  # argparse's spaced form too
     ["--model-base-path", "b", "--rest-api-port", "9000"]),
    (["--model_base_path=b", "--file_system_poll_wait_seconds=5"],
     ["--model-base-path", "b", "--file-system-poll-wait-seconds", "5"]),
    (["--model_base_path=b", "--rest_api_timeout_in_ms=500"],
     ["--model-base-path", "b", "--rest-api-timeout-in-ms", "500"]),
    (["--model_base_path=b", "--prefer_tflite_model=true"],
     ["--model-base-path", "b", "--model-format", "prefer_tflite"]),
    (["--model_base_path=b", "--prefer_tflite_model"],  # a bool alone: true
     ["--model-base-path", "b", "--model-format", "prefer_tflite"]),
    (["--model_base_path=b", "--prefer_tflite_model=false"], ["--model-base-path", "b"]),
    (["--model_base_path=b", "--enable_model_warmup=false"],
     ["--model-base-path", "b", "--no-warmup"]),
    (["--model_base_path=b", "--enable_signature_method_name_check"],  # a bool alone: true
     ["--model-base-path", "b", "--enable-signature-method-name-check"]),
    (["--model_base_path=b", "--enable_signature_method_name_check=true"],
     ["--model-base-path", "b", "--enable-signature-method-name-check"]),
    (["--model_base_path=b", "--grpc_channel_arguments=grpc.max_receive_message_length=4096,"
      "grpc.max_send_message_length=4096"],
     ["--model-base-path", "b", "--max-message-bytes", "4096"]),
    # the values that are what serve does anyway: taken, changing nothing
    (["--model_base_path=b", "--enable_batching=false", "--model_config_file_poll_wait_seconds=0",
      "--enable_grpc_healthcheck_service"], ["--model-base-path", "b"]),
])
def test_tf_serving_spelling_parses_to_the_same_config(tf_form, own_form):
    assert _config(*tf_form) == _config(*own_form)


def test_tf_serving_model_config_file_parses_to_the_same_config(tmp_path):
    path = tmp_path / "models.config"
    path.write_text('model_config_list { config { name: "a" base_path: "/models/a" } }')
    config = _config(f"--model_config_file={path}")
    assert config == _config("--model-config-file", str(path))
    assert [m.name for m in config.models] == ["a"]


def test_build_argv_reads_back_to_the_same_config(tmp_path):
    """What `serve` hands the real binary, given back to `serve`, is the config it came from.

    --host and --allow-reload-config are not in the argv: the binary has neither (it listens on
    every interface and always takes reloads, which is why cannot_honour wants them given).
    """
    model = ModelConfig("m", tmp_path / "m", version_policy="specific", versions=(1, 2),
                        version_labels={"stable": 1}, model_format="prefer_tflite")
    config = ServerConfig(models=(model,), host="0.0.0.0", allow_reload_config=True, port=8600,
                          rest_api_port=8601, rest_api_timeout_in_ms=5000,
                          file_system_poll_wait_seconds=2.0,
                          max_message_bytes=4096, enable_warmup=False,
                          enable_signature_method_name_check=True)
    assert tfs.cannot_honour(config) == []
    argv = tfs.build_argv(config, tmp_path / "work")
    read = _config("--host", "0.0.0.0", "--allow-reload-config", *argv[1:])
    assert read == dataclasses.replace(
        config, model_config_file=tmp_path / "work" / "models.config",
        models=(dataclasses.replace(model, base_path=model.base_path.resolve()),))


@pytest.mark.slow  # `ampflow serve` in a child process (here it execs a stand-in, ~5 s)
def test_tf_serving_arguments_reach_the_real_binary_the_same(tmp_path):
    """`--server tf-serving` with the container's arguments: the binary (a stand-in that echoes
    its argv; the real one cannot be installed here) gets the same values, as it spells them."""
    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "argv: $*"\n')
    fake.chmod(0o755)
    (tmp_path / "models" / "m" / "1").mkdir(parents=True)
    given = ["--port=8555", "--rest_api_port=8556", "--model_name=m",
             f"--model_base_path={tmp_path / 'models' / 'm'}", "--enable_model_warmup=false",
             "--file_system_poll_wait_seconds=3"]
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
           "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "ampflow.serving.cli", "serve", "--server", "tf-serving",
         "--host", "0.0.0.0", "--allow-reload-config", *given],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.split("argv: ", 1)[1].split()
    for flag in ("--port=8555", "--rest_api_port=8556", "--enable_model_warmup=false",
                 "--file_system_poll_wait_seconds=3"):
        assert flag in argv
    config_file = next(a.split("=", 1)[1] for a in argv if a.startswith("--model_config_file="))
    (model,) = _config(f"--model_config_file={config_file}").models
    assert (model.name, model.base_path) == ("m", (tmp_path / "models" / "m").resolve())


@pytest.mark.parametrize("extra, flag", [
    ({"batching": BatchingConfig(max_batch_size=8)}, "--enable_batching"),
    ("tls", "--ssl_config_file"),
])
def test_build_argv_flags_with_no_alias_are_refused_when_read_back(extra, flag, tmp_path, capsys):
    """The binary's files for batching and TLS are not read by serve: refused, not dropped (a
    config read back without its batching would serve something else). Monitoring is read:
    test_monitoring_config.py."""
    if extra == "tls":
        for name in ("cert.pem", "key.pem"):
            (tmp_path / name).write_text(f"-----{name}-----\n")
        extra = {"tls": TlsConfig(tmp_path / "cert.pem", tmp_path / "key.pem")}
    config = ServerConfig(models=(ModelConfig("m", tmp_path / "m"),), **extra)
    argv = tfs.build_argv(config, tmp_path / "work")
    assert _exit_code(*argv[1:]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"ampflow serve: error: TF Serving's {flag} is not supported")


@pytest.mark.parametrize("name", sorted(tfs.TF_SERVING_UNSUPPORTED))
def test_unsupported_tf_serving_flag_exits_2_in_one_line_naming_it(name, capsys):
    assert _exit_code("--model-base-path", "b", f"--{name}=1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"ampflow serve: error: TF Serving's --{name} is not supported by "
                          "`ampflow serve`: ")
    assert tfs.TF_SERVING_UNSUPPORTED[name] in err and f"Received: --{name}=1" in err


@pytest.mark.parametrize("argv, message", [
    (["--enable_batching"], "TF Serving's --enable_batching is not supported by `ampflow "
                            "serve` except as =false: batching is --max-batch-size N"),
    (["--model_config_file_poll_wait_seconds=60"],
     "needs --model-config-file (the file to re-read)"),
    (["--rest_api_timeout_in_ms=soon"], "--rest_api_timeout_in_ms must be a whole number. "
                                        "Received: --rest_api_timeout_in_ms=soon"),
    (["--enable_grpc_healthcheck_service=false"], "except as =true: grpc.health.v1 is always"),
    (["--rest_api_port=abc"], "--rest_api_port must be a whole number. Received: "
                              "--rest_api_port=abc"),
    (["--enable_model_warmup=maybe"], "--enable_model_warmup must be true or false. Received: "
                                      "--enable_model_warmup=maybe"),
    (["--grpc_channel_arguments=grpc.max_connection_age_ms=2000,grpc.so_reuseport=0"],
     "grpc.so_reuseport is not taken: --workers N decides it (the workers share the ports). "
     "Received: 'grpc.so_reuseport=0'"),
    (["--grpc_channel_arguments=grpc.max_connection_age_ms"],
     "takes key=value items separated by commas. Received: 'grpc.max_connection_age_ms'"),
    (["--grpc_channel_arguments=grpc.max_receive_message_length=4096,"
      "grpc.max_send_message_length=8192"], "ampflow has one --max-message-bytes for both"),
    (["--grpc_channel_arguments=grpc.max_send_message_length=lots"],
     "grpc.max_send_message_length must be a whole number >= 0"),
    (["--model_name"], "argument --model_name: expected one argument"),
])
def test_tf_serving_flag_bad_value_is_one_line(argv, message, capsys):
    assert _exit_code("--model-base-path", "b", *argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ampflow serve: error: ")
    assert message in err


def test_serve_help_lists_tf_serving_spellings(capsys):
    with pytest.raises(SystemExit):
        serving_main(["serve", "--help"])
    out = capsys.readouterr().out
    for name in tfs.TF_SERVING_ALIASES:
        assert f"--{name}" in out
    assert "--rest_api_num_threads" not in out  # refused flags are not offered


def _wait_listening(proc: subprocess.Popen, timeout_s: float) -> str:
    found: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            match = re.match(r"ampflow serve: listening on (\S+:\d+)", line)
            if match and not found:
                found.append(match.group(1))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not found and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found, f"ampflow serve did not start (exit {proc.poll()})"
    return found[0]


@pytest.mark.slow
@pytest.mark.serving
@local_only
@pytest.mark.timeout(300)
def test_serve_with_the_tf_serving_containers_arguments_answers(model_store, tmp_path):
    """The tensorflow/serving image's entrypoint arguments, `--port=8500 --rest_api_port=8501
    --model_name=m --model_base_path=/models/m`, on free ports (the suite runs beside other
    servers): the model answers on both, under the name given."""
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.rest_client import RestClient
    from ampflow.serving.testing import sample_images

    base = tmp_path / "models" / "m"
    install_version(model_store, base, 1)
    grpc_port, rest_port = free_port(), free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ampflow.cli", "serve", "--server", "local",
             f"--port={grpc_port}", f"--rest_api_port={rest_port}", "--model_name=m",
             f"--model_base_path={base}"],
            stdout=subprocess.PIPE, stderr=err, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        address = _wait_listening(proc, 240)
        assert address.endswith(f":{grpc_port}"), Path(log).read_text()[-2000:]
        images = sample_images(2, seed=3)
        with PredictionClient(address) as grpc_client:
            by_grpc = grpc_client.predict("m", images).outputs["probabilities"]
        with RestClient(f"127.0.0.1:{rest_port}") as rest_client:
            by_rest = rest_client.predict("m", images).outputs["probabilities"]
        assert by_grpc.shape == (2, 10)
        np.testing.assert_allclose(by_rest, by_grpc, rtol=1e-5, atol=1e-6)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
