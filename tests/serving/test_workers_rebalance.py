"""A worker killed under load gets its fair share back after its restart (issue 49).

`ampflow serve --workers 2` with 16 clients calling in a loop, each on a connection of its own;
one worker SIGKILLed. The supervisor restarts it, but the kernel hands a worker *connections*
(SO_REUSEPORT), and every client reconnected to the survivor when its worker died: without a
maximum connection age they stay there and the restarted worker gets nothing (measured: 0
requests to the end of the run). `--workers N` sets one by default (WORKERS_CONNECTION_AGE_S):
each connection gets a GOAWAY when it is that old, its client reconnects, and the kernel spreads
the new connections over both workers. Which worker answered is read from each worker's own
metrics file (workers_helpers.py). Real processes; the bound is the issue's 30 s from ready.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import grpc
import pytest
import tensorflow as tf
from serving_helpers import free_port, local_only
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tf_serving_models import write_half_plus_two
from workers_helpers import own_channel, per_pid, predicts, wait_for, worker_pids

CLIENTS = 16
FAIR_SHARE = 0.3  # of the two workers' requests in a window (an even split is 0.5)
WINDOW_S = 5.0
BACK_WITHIN_S = 30.0  # issue 49: a fair share within 30 s of the restarted worker being ready


class _Load:
    """CLIENTS threads calling Predict in a loop, each on its own connection, until stopped."""

    def __init__(self, address: str) -> None:
        self.stop, self.codes = threading.Event(), Counter()
        self._lock = threading.Lock()
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "hpt"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([[2.0]], dtype=tf.float32))
        self._threads = [threading.Thread(target=self._run, args=(address, request), daemon=True)
                         for _ in range(CLIENTS)]
        for thread in self._threads:
            thread.start()

    def _run(self, address: str, request) -> None:
        with own_channel(address) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not self.stop.is_set():
                try:
                    stub.Predict(request, timeout=30)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    code = e.code()
                    time.sleep(0.05)  # a client's back-off
                with self._lock:
                    self.codes[code] += 1

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


@pytest.mark.slow
@pytest.mark.serving
@local_only
@pytest.mark.timeout(400)
def test_a_restarted_worker_gets_a_fair_share_back_within_30s_of_ready(tmp_path, monkeypatch):
    from ampflow.serving.testing import ServeProcess

    base = write_half_plus_two(tmp_path / "hpt" / "1").parent
    metrics_dir = tmp_path / "metrics"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    log = tmp_path / "server.log"
    server = ServeProcess("hpt", base, log, "--workers", "2", "--metrics-port", str(free_port()),
                          stop_timeout_s=60)
    load = None
    try:
        load = _Load(server.address)
        killed = worker_pids(log)[0]
        wait_for(lambda: predicts(per_pid(metrics_dir)).get(killed), 60, "load on worker 0")
        os.kill(killed, signal.SIGKILL)
        restarted = wait_for(lambda: worker_pids(log).get(0) not in (None, killed)
                             and worker_pids(log)[0], 180, "worker 0 restarted and ready")
        ready_at = time.monotonic()
        survivor = worker_pids(log)[1]
        samples = []  # (seconds since ready, requests so far to the restarted, to the survivor)
        shares = []
        # sampled until a window shows the fair share or BACK_WITHIN_S is over: the claim is
        # "back within 30 s", so the seconds after it is back prove nothing more
        while time.monotonic() - ready_at < BACK_WITHIN_S and not any(
                share >= FAIR_SHARE for _, share in shares):
            counts = predicts(per_pid(metrics_dir))
            samples.append((time.monotonic() - ready_at, counts.get(restarted, 0),
                            counts.get(survivor, 0)))
            shares = _window_shares(samples)
            time.sleep(0.5)
        print(f"restarted worker's share per {WINDOW_S:g}s window after ready: "
              + ", ".join(f"{t:.0f}s {share:.2f}" for t, share in shares)
              + f"; calls by code {dict(load.codes)}")
        back = next((t for t, share in shares if share >= FAIR_SHARE), None)
        assert back is not None, (f"the restarted worker never had {FAIR_SHARE:.0%} of a "
                                  f"{WINDOW_S:g}s window within {BACK_WITHIN_S:g}s: {shares}")
        print(f"fair share back {back:.1f}s after the restarted worker was ready")
    finally:
        if load is not None:
            load.close()
        server.stop()


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
