"""`ampflow serve --workers N` (issue 42 point 3): real processes on loopback.

Which worker answered is read from the metrics themselves: in the client library's multiprocess
mode every worker writes its own files (`counter_<pid>.db`) in PROMETHEUS_MULTIPROC_DIR, which
the test names, so it can merge them per pid (what answered, with which version) as well as all
together (what the supervisor's /metrics serves). Each round of requests opens fresh
connections, which the kernel spreads over the workers (SO_REUSEPORT hashes each connection).
Each channel here has a subchannel pool of its own: gRPC otherwise gives every channel of one
process to the same address one shared TCP connection, which lands on one worker.
Assertions are counts and states; the one bound on time is a generous "by then" for a reload.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Imported here, before any test names PROMETHEUS_MULTIPROC_DIR: the client library picks its
# value class (in-process or multiprocess files) once, at import, from that variable. Imported
# first under a test's monkeypatched variable, every later server in this pytest process would
# write files into a dir that no longer exists (CI: 37 serving tests failed on one xdist worker).
import prometheus_client
import pytest
from serving_helpers import MODEL, free_port, install_version, local_only
from workers_helpers import own_channel, per_pid, predicts, wait_for, worker_pids

from ampflow.serving.cli import main as serving_main

SERVE_FLAGS = ("--workers", "2", "--grace-s", "10")
ROUND = 16  # requests (fresh connections) per round: all on one worker has p = 2**-15
RELOAD_BOUND_S = 60.0  # poll interval + loading on a busy 2-core machine, far above either


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

def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def scraped_predicts(port: int) -> float:
    return sum(float(value) for value in re.findall(
        r'^ampflow_serving_requests_total\{method="Predict"[^}]*\} (\S+)$', scrape(port),
        re.MULTILINE))


def predict_on(channel, seed: int) -> int:
    """One Predict of the contract model on `channel`; the version that answered."""
    from serving_helpers import predict_request
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    from ampflow.serving.testing import sample_images

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    return stub.Predict(predict_request(MODEL, sample_images(1, seed=seed)),
                        timeout=60).model_spec.version.value


def fresh_round(address: str, seed: int) -> list[int]:
    """ROUND Predicts at once, each on a new connection; the versions that answered."""
    def one(i: int) -> int:
        with own_channel(address) as channel:
            return predict_on(channel, seed + i)

    with ThreadPoolExecutor(ROUND) as pool:
        return list(pool.map(one, range(ROUND)))


@pytest.mark.slow
@pytest.mark.serving
@local_only
@pytest.mark.timeout(400)
def test_two_workers_share_the_port_reload_restart_count_once_and_drain(
        model_store, tmp_path, monkeypatch):
    from ampflow.serving.testing import ServeProcess

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    metrics_dir, metrics_port = tmp_path / "metrics", free_port()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    log = tmp_path / "server.log"
    poll_s = 0.5
    # batching with a long timeout: the drain at the end has requests in flight to wait for
    started = time.monotonic()
    server = ServeProcess(MODEL, base, log, *SERVE_FLAGS, "--metrics-port", str(metrics_port),
                          "--file-system-poll-wait-seconds", str(poll_s),
                          "--max-batch-size", "64", "--batch-timeout-ms", "1500",
                          stop_timeout_s=60)
    try:
        # the supervisor never imported TensorFlow (or gRPC): the workers were spawned clean
        maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
        assert "tensorflow" not in maps and "cygrpc" not in maps
        pids = worker_pids(log)
        assert len(pids) == 2 and server.proc.pid not in pids.values()

        # one port, both workers answer; /metrics counts every request once
        assert fresh_round(server.address, 0) == [1] * ROUND
        by_pid = predicts(per_pid(metrics_dir))
        assert set(by_pid) == set(pids.values()) and min(by_pid.values()) > 0, by_pid
        assert scraped_predicts(metrics_port) == sum(by_pid.values()) == ROUND

        # a killed worker is restarted, said in the log; its requests stay counted
        killed = pids[0]
        os.kill(killed, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: worker_pids(log)[0] != killed, 180, "worker 0 restarted")
        print(f"started in {killed_at - started:.0f}s, restarted in "
              f"{time.monotonic() - killed_at:.0f}s")
        text = log.read_text()
        assert f"worker 0 (pid {killed}) was killed by SIGKILL; restarting it" in text
        pids = worker_pids(log)
        assert scraped_predicts(metrics_port) == ROUND

        # a new version: every worker (the restarted one too) serves it after its poll
        pushed = time.monotonic()
        install_version(model_store, base, 2)
        sent = ROUND

        def every_worker_on_v2() -> bool:
            nonlocal sent
            versions = fresh_round(server.address, sent)
            sent += ROUND
            on_v2 = predicts(per_pid(metrics_dir), "2")
            return versions == [2] * ROUND and all(on_v2.get(p) for p in pids.values())

        wait_for(every_worker_on_v2, RELOAD_BOUND_S, "every worker serving version 2")
        print(f"every worker served version 2 {time.monotonic() - pushed:.1f}s after the push "
              f"(poll interval {poll_s}s)")
        assert scraped_predicts(metrics_port) == sent

        # SIGTERM with requests in flight (waiting for their batch): every one is answered
        import grpc

        channels = [own_channel(server.address) for _ in range(ROUND)]
        for channel in channels:  # connected before the requests
            grpc.channel_ready_future(channel).result(timeout=30)
        with ThreadPoolExecutor(ROUND) as pool:
            futures = [pool.submit(predict_on, c, i) for i, c in enumerate(channels)]
            time.sleep(0.7)
            assert not any(f.done() for f in futures), "requests finished before SIGTERM"
            server.proc.send_signal(signal.SIGTERM)
            versions = [f.result(timeout=60) for f in futures]
        for channel in channels:
            channel.close()
        assert versions == [2] * ROUND
        assert server.proc.wait(timeout=60) == 0
        sent += ROUND
    finally:
        server.stop()
    text = log.read_text()
    assert "server stopped cleanly" in text
    assert all(f"worker {i} stopped cleanly" in text for i in (0, 1))
    assert sum(predicts(per_pid(metrics_dir)).values()) == sent


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
    """The reliability soak (swaps, a corrupt and a half-copied version) against 2 workers."""
    metrics_dir = tmp_path / "metrics"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    report = _soak_module().soak(tmp_path, clients=ROUND, seconds=20, poll_s=0.5,
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
