"""`ampflow serve --workers 2`, one real server through its life (issues 42 point 3 and 49).

Both workers answer on one port and /metrics counts every request once; a worker SIGKILLed
under load is restarted and gets its fair share back; a new version reaches every worker;
SIGTERM drains requests in flight. One server for all of it: each phase needs the one before
(each two-worker server started is two TensorFlow imports, 5-8 CPU-s each on this host).

Issue 49: with 16 clients each on a connection of its own, every client reconnects to the
survivor when its worker dies, and the kernel hands a worker *connections* (SO_REUSEPORT):
without a maximum connection age they stay there and the restarted worker gets nothing
(measured: 0 requests to the end of the run). `--workers N` sets one by default
(WORKERS_CONNECTION_AGE_S): each connection gets a GOAWAY when it is that old, its client
reconnects, and the kernel spreads the new connections over both workers; the bound is the
issue's 30 s from the restarted worker being ready. Which worker answered is read from each
worker's own metrics file (workers_helpers.py). Every other assertion is a count or a state.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from serving_helpers import MODEL, free_port, install_version, local_only, predict_request
from workers_helpers import (
    ROUND,
    SERVE_FLAGS,
    fresh_round,
    own_channel,
    per_pid,
    predict_on,
    predicts,
    scraped_predicts,
    wait_for,
    worker_pids,
)

CLIENTS = 16  # connections under load: all 16 hashed to one worker has p = 2**-15
FAIR_SHARE = 0.3  # of the two workers' requests in a window (an even split is 0.5)
WINDOW_S = 5.0
BACK_WITHIN_S = 30.0  # issue 49: a fair share within 30 s of the restarted worker being ready
RELOAD_BOUND_S = 60.0  # poll interval + loading on a busy 2-core machine, far above either
IN_FLIGHT_TRIES = 5  # rounds sent before SIGTERM until one is still waiting for its batch


class _Load:
    """CLIENTS threads calling Predict in a loop, each on its own connection, until closed."""

    def __init__(self, address: str) -> None:
        from ampflow.serving.testing import sample_images

        self.stop, self.codes = threading.Event(), Counter()
        self._lock = threading.Lock()
        request = predict_request(MODEL, sample_images(1, seed=7))
        self._threads = [threading.Thread(target=self._run, args=(address, request), daemon=True)
                         for _ in range(CLIENTS)]
        for thread in self._threads:
            thread.start()

    def _run(self, address: str, request) -> None:
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        with own_channel(address) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not self.stop.is_set():
                try:
                    stub.Predict(request, timeout=30)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    code = e.code()
                    self.stop.wait(0.05)  # a client's back-off
                with self._lock:
                    self.codes[code] += 1

    def close(self) -> None:
        """Stop and join every client: their last calls answered (and so counted) by then."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


def _window_shares(samples: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """(end of window, the restarted worker's share of the requests in it) per WINDOW_S."""
    shares = []
    for end, new, old in samples:
        start = next(((t, n, o) for t, n, o in reversed(samples) if t <= end - WINDOW_S), None)
        if start is None:
            continue
        done_new, done_old = new - start[1], old - start[2]
        if done_new + done_old:
            shares.append((end, done_new / (done_new + done_old)))
    return shares


def _fair_share_back(metrics_dir: Path, restarted: int, survivor: int) -> float:
    """Seconds from now (the restarted worker ready) to a window with its fair share.

    Sampled until a window shows the fair share or BACK_WITHIN_S is over: the claim is
    "back within 30 s", so the seconds after it is back prove nothing more.
    """
    ready_at = time.monotonic()
    samples, shares = [], []  # (seconds since ready, requests to the restarted, the survivor)
    while time.monotonic() - ready_at < BACK_WITHIN_S and not any(
            share >= FAIR_SHARE for _, share in shares):
        counts = predicts(per_pid(metrics_dir))
        samples.append((time.monotonic() - ready_at, counts.get(restarted, 0),
                        counts.get(survivor, 0)))
        shares = _window_shares(samples)
        time.sleep(0.5)
    print(f"restarted worker's share per {WINDOW_S:g}s window after ready: "
          + ", ".join(f"{t:.0f}s {share:.2f}" for t, share in shares))
    back = next((t for t, share in shares if share >= FAIR_SHARE), None)
    assert back is not None, (f"the restarted worker never had {FAIR_SHARE:.0%} of a "
                              f"{WINDOW_S:g}s window within {BACK_WITHIN_S:g}s: {shares}")
    return back


def _kill_under_load(server, log: Path, metrics_dir: Path, pids: dict) -> None:
    """SIGKILL worker 0 while CLIENTS call; it restarts and gets its fair share back."""
    load = _Load(server.address)
    try:
        killed, before = pids[0], predicts(per_pid(metrics_dir))[pids[0]]
        wait_for(lambda: predicts(per_pid(metrics_dir)).get(killed, 0) > before, 60,
                 "load on worker 0")
        os.kill(killed, signal.SIGKILL)
        killed_at = time.monotonic()
        restarted = wait_for(lambda: worker_pids(log).get(0) not in (None, killed)
                             and worker_pids(log)[0], 180, "worker 0 restarted and ready")
        print(f"restarted and ready in {time.monotonic() - killed_at:.0f}s")
        back = _fair_share_back(metrics_dir, restarted, pids[1])
        print(f"fair share back {back:.1f}s after the restarted worker was ready")
    finally:
        load.close()
    print(f"calls under load by code: {dict(load.codes)}")
    assert f"worker 0 (pid {killed}) was killed by SIGKILL; restarting it" in log.read_text()


def _drain_with_requests_in_flight(server, sent: int) -> int:
    """SIGTERM while ROUND requests wait for their batch: every one is answered.

    The precondition (none answered before SIGTERM) is the machine's timing, not the server's
    behaviour: a round answered before it proves nothing, so another is sent (IN_FLIGHT_TRIES).
    Returns the requests sent, those rounds included.
    """
    channels = [own_channel(server.address) for _ in range(ROUND)]
    for channel in channels:  # connected before the requests
        grpc.channel_ready_future(channel).result(timeout=30)
    try:
        with ThreadPoolExecutor(ROUND) as pool:
            for _ in range(IN_FLIGHT_TRIES):
                futures = [pool.submit(predict_on, c, i) for i, c in enumerate(channels)]
                time.sleep(0.7)  # to reach the workers; their batch waits 1.5 s
                sent += ROUND
                if not any(f.done() for f in futures):
                    break
                assert [f.result(timeout=60) for f in futures] == [2] * ROUND
            else:
                pytest.fail(f"{IN_FLIGHT_TRIES} rounds answered before SIGTERM: no batch wait")
            server.proc.send_signal(signal.SIGTERM)
            versions = [f.result(timeout=60) for f in futures]
    finally:
        for channel in channels:
            channel.close()
    assert versions == [2] * ROUND
    assert server.proc.wait(timeout=60) == 0
    return sent


@pytest.mark.slow
@pytest.mark.serving
@local_only
@pytest.mark.timeout(500)
def test_two_workers_share_the_port_restart_rebalance_reload_count_once_and_drain(
        model_store, tmp_path, monkeypatch):
    from ampflow.serving.testing import ServeProcess

    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    metrics_dir, metrics_port = tmp_path / "metrics", free_port()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    log = tmp_path / "server.log"
    poll_s = 0.5
    # batching with a long timeout: the drain at the end has requests in flight to wait for;
    # --no-warmup: each warm-up replay would wait out that timeout alone (3 x 1.5 s held every
    # load: the two workers', the restart's, version 2's, the CPU idle)
    server = ServeProcess(MODEL, base, log, *SERVE_FLAGS, "--metrics-port", str(metrics_port),
                          "--file-system-poll-wait-seconds", str(poll_s),
                          "--max-batch-size", "64", "--batch-timeout-ms", "1500", "--no-warmup",
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

        # a worker killed under load is restarted and gets its share back; its requests stay
        # counted (its file is read with the others'), each once
        _kill_under_load(server, log, metrics_dir, pids)
        by_pid, killed, pids = predicts(per_pid(metrics_dir)), pids[0], worker_pids(log)
        assert set(by_pid) == {killed, *pids.values()} and by_pid[killed] > 0, by_pid
        sent = scraped_predicts(metrics_port)
        assert sent == sum(by_pid.values()), (sent, by_pid)

        # a new version: every worker (the restarted one too) serves it after its poll
        pushed = time.monotonic()
        install_version(model_store, base, 2)

        def every_worker_on_v2() -> bool:
            nonlocal sent
            versions = fresh_round(server.address, int(sent))
            sent += ROUND
            on_v2 = predicts(per_pid(metrics_dir), "2")
            return versions == [2] * ROUND and all(on_v2.get(p) for p in pids.values())

        wait_for(every_worker_on_v2, RELOAD_BOUND_S, "every worker serving version 2")
        print(f"every worker served version 2 {time.monotonic() - pushed:.1f}s after the push "
              f"(poll interval {poll_s}s)")
        assert scraped_predicts(metrics_port) == sent

        sent = _drain_with_requests_in_flight(server, sent)
    finally:
        server.stop()
    text = log.read_text()
    assert "server stopped cleanly" in text
    assert all(f"worker {i} stopped cleanly" in text for i in (0, 1))
    assert sum(predicts(per_pid(metrics_dir)).values()) == sent
