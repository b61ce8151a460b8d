"""A client command pointed at a port where nothing listens says what to check, in one line."""

from __future__ import annotations

import pytest
from serving_helpers import free_port

from ampflow.cli import main


@pytest.mark.parametrize("command", ["predict", "model-status", "model-metadata"])
@pytest.mark.parametrize("protocol,port_flag", [("grpc", "--port"), ("rest", "--rest-api-port")])
def test_nothing_listening_is_said_with_the_flag_to_check(command, protocol, port_flag, capsys,
                                                          tmp_path):
    port = free_port()
    argv = [command, "--protocol", protocol, "--port", str(port), "--retries", "0"]
    if command == "predict":
        argv.append(str(tmp_path / "digit.npy"))
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert f"nothing answers at 127.0.0.1:{port} over " in err[0]
    assert f"is `ampflow serve` running there (its {port_flag} {port})?" in err[0]
