"""`ampflow predict --wait-s` waits for a server that is still starting in one line, not ten.

The tutorial starts `ampflow serve &` and runs `predict --wait-s 60` at once. Each poll used
the client's retries, so the answer came after ~11 `attempt i/N, retrying` warnings (issue
46); TF Serving's clients print nothing per poll. Now one line says what it waits for, and
giving up stays one error line. A real server, in this process, starts on the port once the
client has said it waits.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from serving_helpers import MODEL, free_port

from ampflow.cli import main
from ampflow.serving.config import ModelConfig, ServerConfig


def _lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


class _StartOnWaiting(logging.Handler):
    """Starts the server when the client says it waits: its first poll found nothing."""

    def __init__(self, config: ServerConfig):
        super().__init__(logging.INFO)
        self.config, self.running = config, []

    def emit(self, record: logging.LogRecord) -> None:
        if "waiting up to" in record.getMessage() and not self.running:
            from ampflow.serving.server import start_local_server

            self.running.append(start_local_server(self.config))


@pytest.fixture
def late_server(model_store):
    """A port, and a server that starts on it only once predict has said it waits.

    Started by the wait line itself, not by a timer: a timer raced the CLI's own start-up,
    and under load the server was up before the first poll (no wait, no line).
    """
    port = free_port()
    config = ServerConfig(models=(ModelConfig(MODEL, model_store),), host="127.0.0.1",
                          port=port, grace_s=0.5)
    handler = _StartOnWaiting(config)
    logging.getLogger().addHandler(handler)
    yield port
    logging.getLogger().removeHandler(handler)
    for server in handler.running:
        server.stop(0.5)


def test_predict_waits_for_a_starting_server_in_one_line(late_server, tmp_path, caplog, capsys):
    image = tmp_path / "digit.npy"
    np.save(image, np.full((8, 8, 1), 128, np.float32))
    caplog.set_level(logging.INFO)
    code = main(["predict", "--port", str(late_server), "--model-name", MODEL,
                 "--wait-s", "30", str(image)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith(f"model {MODEL} version 2 ")
    assert _lines(caplog, "attempt") == []  # no per-poll retry warnings
    waiting = _lines(caplog, "waiting up to 30s")
    assert waiting == [f"waiting up to 30s for model {MODEL!r} at 127.0.0.1:{late_server} to "
                       "be AVAILABLE"]


@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_predict_that_gives_up_waiting_says_so_in_one_line(protocol, tmp_path, caplog,
                                                          capsys):
    port = free_port()
    caplog.set_level(logging.INFO)
    code = main(["predict", "--protocol", protocol, "--port", str(port), "--wait-s", "1",
                 str(tmp_path / "digit.npy")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert f"model 'ampflow' at 127.0.0.1:{port} was not AVAILABLE within --wait-s 1" in err[0]
    assert _lines(caplog, "attempt") == [] and len(_lines(caplog, "waiting up to 1s")) == 1
