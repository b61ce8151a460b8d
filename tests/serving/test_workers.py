"""`ampflow serve --workers N` (issue 42 point 3): real processes on loopback.

Which worker answered is read from the metrics themselves: in the client library's multiprocess
mode every worker writes its own files (`counter_<pid>.db`) in PROMETHEUS_MULTIPROC_DIR, which
the test names, so it can merge them per pid (what answered, with which version) as well as all
together (what the supervisor's /metrics serves). Each round of requests opens fresh
connections, which the kernel spreads over the workers (SO_REUSEPORT hashes each connection).
Each channel here has a subchannel pool of its own: gRPC otherwise gives every channel of one
process to the same address one shared TCP connection, which lands on one worker.
Assertions are counts and states. One server's whole life (the port shared, a restart under
load, a reload, the drain) is test_workers_rebalance.py; here the flags, and the soak.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# Imported here, before any test names PROMETHEUS_MULTIPROC_DIR: the client library picks its
# value class (in-process or multiprocess files) once, at import, from that variable. Imported
# first under a test's monkeypatched variable, every later server in this pytest process would
# write files into a dir that no longer exists (CI: 37 serving tests failed on one xdist worker).
import prometheus_client
import pytest
from serving_helpers import free_port, local_only
from workers_helpers import ROUND, SERVE_FLAGS, per_pid, predicts

from ampflow.serving.cli import main as serving_main


@pytest.fixture(autouse=True)
def this_process_keeps_in_process_metrics():
    """After each test, this pytest process's metrics are still in-process ones."""
    before = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    yield
    # (the multiprocess class is named MmapedValue: MultiProcessValue is its factory)
    assert prometheus_client.values.ValueClass is prometheus_client.values.MutexValue
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR") == before


# ---- bad input: one line, before anything starts --------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (("--workers", "0"), "--workers must be in 1..64 (1 = one process). Received: --workers=0"),
    (("--workers", "two"), "argument --workers: invalid int value: 'two'"),
    (("--workers", "2", "--allow-reload-config"),
     "--allow-reload-config needs --workers=1: a HandleReloadConfigRequest reaches only the "
     "worker"),
])
def test_bad_workers_flag_is_one_line(flags, message, tmp_path, capsys):
    try:
        code = serving_main(["serve", "--model-base-path", str(tmp_path), *flags])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("ampflow serve: error: "), err
    assert message in err


def test_supervise_in_a_callers_process_leaves_its_metrics_in_process(tmp_path):
    """`supervise` names PROMETHEUS_MULTIPROC_DIR for its workers; the client library, imported
    first under it, would write every later in-process server's metrics into files of a dir
    that is gone (the CI failure's mechanism). A fresh interpreter, the metrics port taken so
    that supervise stops right after its metrics set-up, before any worker starts."""
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        script = (
            "import os, sys\n"
            "from ampflow.errors import ServingError\n"
            "from ampflow.serving.config import ModelConfig, ServerConfig\n"
            "from ampflow.serving.workers import supervise\n"
            f"config = ServerConfig(models=(ModelConfig('m', {str(tmp_path)!r}),), "
            f"host='127.0.0.1', port=0, metrics_port={busy.getsockname()[1]}, workers=2)\n"
            "try:\n"
            "    supervise(config)\n"
            "except ServingError as e:\n"
            "    print('refused:', e)\n"
            "import prometheus_client.values as v\n"
            "print(v.ValueClass.__name__, os.environ.get('PROMETHEUS_MULTIPROC_DIR'))\n"
            "print('tensorflow' in sys.modules)\n")
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    refused, value_class, tensorflow = proc.stdout.splitlines()
    assert refused.startswith("refused: cannot bind the metrics port"), proc.stdout
    assert value_class == "MutexValue None"  # in-process metrics, and no variable left
    assert tensorflow == "False"  # the supervisor never imports it (nor did this test)


# ---- real workers ----------------------------------------------------------------------------

def _soak_module():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "serving_soak.py"
    spec = importlib.util.spec_from_file_location("serving_soak", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.serving
@local_only
@pytest.mark.timeout(400)
def test_soak_with_two_workers_zero_failures(tmp_path, monkeypatch):
    """The reliability soak (swaps, a corrupt and a half-copied version) against 2 workers.

    Its claim is zero failures over the four pushes, which 8 s hold (pushed 1.6 s to 6 s in,
    the half-copied one's copy lasting 1.2 s: two polls of each worker); the clients run on
    until version 5 has answered. The soak's seconds bought no more (20 s before).
    """
    metrics_dir = tmp_path / "metrics"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    report = _soak_module().soak(tmp_path, clients=ROUND, seconds=8, poll_s=0.5,
                                 flags=(*SERVE_FLAGS, "--metrics-port", str(free_port())),
                                 own_connections=True)
    assert report["requests"] > 0
    assert report["failures"] == 0, report["failures_by_code"]
    assert report["corrupt_v3_answers"] == 0
    assert report["v4_answers_before_copy_finished"] == 0
    assert report["versions_answered"][-1] == 5
    assert report["server_alive_at_end"] and report["server_exit_code"] == 0
    by_pid = predicts(per_pid(metrics_dir))
    assert len(by_pid) == 2 and min(by_pid.values()) > 0, by_pid  # both workers served
    assert sum(by_pid.values()) == report["requests"]  # each request counted once
