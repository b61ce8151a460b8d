"""TF Serving's `--grpc_channel_arguments` and the maximum connection age (issue 49).

TF Serving hands each `key=value` to its gRPC server (an int where the value parses as one):
its own test starts with `grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb`. Here the
keys a flag of ours sets set that flag (parsed into the same config as the flag), the two
ampflow decides alone are refused, the rest reach grpcio unchanged; and `--workers N` gets a
maximum connection age by default, so that clients reconnect and a restarted worker gets its
share again (the measurement with real processes: test_workers_rebalance.py, whose one server
also proves the port shared, the reload, the counting and the drain).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import grpc
import pytest
from serving_helpers import running_server
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc
from tf_serving_models import write_half_plus_two

from ampflow.cli import build_parser
from ampflow.errors import ConfigError
from ampflow.serving import tf_serving_binary as tfs
from ampflow.serving.cli import serve_config_from_args
from ampflow.serving.config import WORKERS_CONNECTION_AGE_S, ModelConfig, ServerConfig
from ampflow.serving.server import server_options

UPSTREAM = "grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb"  # testGoodGrpcChannelArgs


def _config(*argv: str) -> ServerConfig:
    return serve_config_from_args(build_parser().parse_args(["serve", "--model-base-path", "b",
                                                             *argv]))


def test_upstreams_channel_arguments_set_the_age_and_pass_the_rest_to_grpc():
    config = _config(f"--grpc_channel_arguments={UPSTREAM}")
    assert config.connection_limits.grpc_max_connection_age_s == 2.0
    assert config.grpc_channel_arguments == (("grpc.lb_policy_name", "grpclb"),)
    options = dict(server_options(config))
    assert options["grpc.max_connection_age_ms"] == 2000
    assert options["grpc.lb_policy_name"] == "grpclb"


def test_channel_arguments_of_our_flags_parse_to_the_same_config_as_the_flags():
    tf_form = _config("--grpc_channel_arguments=grpc.max_connection_age_ms=20000,"
                      "grpc.max_connection_age_grace_ms=3000,grpc.max_connection_idle_ms=30000,"
                      "grpc.max_concurrent_streams=5,"
                      "grpc.http2.min_ping_interval_without_data_ms=1500,"
                      "grpc.max_receive_message_length=4096,grpc.max_send_message_length=4096")
    own_form = _config("--grpc-max-connection-age-s", "20", "--grpc-max-connection-age-grace-s",
                       "3", "--grpc-max-connection-idle-s", "30",
                       "--grpc-max-concurrent-streams", "5", "--grpc-min-ping-interval-s", "1.5",
                       "--max-message-bytes", "4096")
    assert tf_form == own_form


def test_an_int_value_passes_as_an_int_and_any_other_as_a_string():
    config = _config("--grpc_channel_arguments=grpc.http2.max_pings_without_data=3,"
                     "grpc.primary_user_agent=x/1")
    assert config.grpc_channel_arguments == (("grpc.http2.max_pings_without_data", 3),
                                             ("grpc.primary_user_agent", "x/1"))


def test_workers_get_a_maximum_connection_age_by_default_and_one_process_none():
    config = _config()
    assert "grpc.max_connection_age_ms" not in dict(server_options(config))
    as_worker = dict(server_options(config, reuse_port=True))
    assert as_worker["grpc.max_connection_age_ms"] == WORKERS_CONNECTION_AGE_S * 1000
    assert as_worker["grpc.max_connection_age_grace_ms"] == 30_000
    given = dict(server_options(_config("--grpc-max-connection-age-s", "4"), reuse_port=True))
    assert given["grpc.max_connection_age_ms"] == 4000


def test_a_config_holding_a_flags_key_among_the_passed_through_is_refused():
    with pytest.raises(ConfigError, match="must not hold grpc.max_connection_age_ms"):
        ServerConfig(models=(ModelConfig("m", "b"),),
                     grpc_channel_arguments=(("grpc.max_connection_age_ms", 5),))


def test_build_argv_with_an_age_and_passed_arguments_reads_back_to_the_same_config(tmp_path):
    config = _config("--host", "0.0.0.0", "--allow-reload-config",
                     f"--grpc_channel_arguments={UPSTREAM}")
    assert tfs.cannot_honour(config) == []  # the binary takes channel arguments as they are
    argv = tfs.build_argv(config, tmp_path / "work")
    flags = dict(a.split("=", 1) for a in argv[1:])
    assert flags["--grpc_channel_arguments"].endswith(
        "grpc.max_connection_age_ms=2000,grpc.max_connection_age_grace_ms=30000,"
        "grpc.lb_policy_name=grpclb")
    read = serve_config_from_args(build_parser().parse_args(
        ["serve", "--host", "0.0.0.0", "--allow-reload-config", *argv[1:]]))
    assert read.connection_limits == config.connection_limits
    assert read.grpc_channel_arguments == config.grpc_channel_arguments


@pytest.mark.slow  # starts a server
@pytest.mark.serving
@pytest.mark.timeout(120)
def test_a_connection_past_its_age_gets_a_goaway_and_the_client_reconnects(tmp_path):
    write_half_plus_two(tmp_path / "hpt" / "1")
    config = _serving(
        _config("--grpc_channel_arguments=grpc.max_connection_age_ms=1000,"
                "grpc.max_connection_age_grace_ms=500,grpc.lb_policy_name=grpclb",
                "--port", "0"), tmp_path / "hpt")
    states: list[grpc.ChannelConnectivity] = []
    changed = threading.Condition()

    def record(state):
        with changed:
            states.append(state)
            changed.notify_all()

    with running_server(config) as server, grpc.insecure_channel(server.address) as channel:
        channel.subscribe(record, try_to_connect=True)
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "hpt"
        stub.GetModelStatus(request, timeout=30)
        with changed:  # the server's GOAWAY after ~1 s takes the channel out of READY
            assert changed.wait_for(lambda: _left_ready(states), timeout=20), states
        time.sleep(0.1)
        assert stub.GetModelStatus(request, timeout=30).model_version_status[0].version == 1


def _left_ready(states) -> bool:
    """Whether the channel was READY and then in another state (GOAWAY: IDLE or CONNECTING)."""
    if grpc.ChannelConnectivity.READY not in states:
        return False
    return any(s != grpc.ChannelConnectivity.READY
               for s in states[states.index(grpc.ChannelConnectivity.READY) + 1:])


def _serving(config: ServerConfig, base) -> ServerConfig:
    return dataclasses.replace(config, models=(ModelConfig("hpt", base),), grace_s=0.5)
