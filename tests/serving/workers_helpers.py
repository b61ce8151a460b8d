"""What the tests of `ampflow serve --workers N` read of real workers: pids, counts, channels.

Which worker answered is read from the metrics themselves: in the client library's multiprocess
mode every worker writes its own files (`counter_<pid>.db`) in PROMETHEUS_MULTIPROC_DIR, which
the test names; the workers' pids from the supervisor's log.
"""

from __future__ import annotations

import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from serving_helpers import MODEL

SERVE_FLAGS = ("--workers", "2", "--grace-s", "10")
ROUND = 16  # requests (fresh connections) per round: all on one worker has p = 2**-15


def per_pid(metrics_dir: Path, name: str = "ampflow_serving_requests_total") -> dict:
    """{pid: {(method, version): count}} from each worker's own counter file."""
    from prometheus_client.multiprocess import MultiProcessCollector

    counts: dict[int, dict] = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(path.stem.split("_")[1])
        for metric in MultiProcessCollector.merge([str(path)], accumulate=False):
            for sample in metric.samples:
                if sample.name == name:
                    key = (sample.labels["method"], sample.labels["version"])
                    counts.setdefault(pid, {})[key] = sample.value
    return counts


def predicts(counts: dict, version: str | None = None) -> dict[int, float]:
    """Predict requests per pid (of one version, or all)."""
    return {pid: sum(v for (method, ver), v in rows.items()
                     if method == "Predict" and version in (None, ver))
            for pid, rows in counts.items()}


def own_channel(address: str):
    """A channel on a TCP connection of its own (not the process's shared one)."""
    import grpc

    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def worker_pids(log: Path) -> dict[int, int]:
    """{worker index: pid} of the workers the supervisor last said were ready."""
    found = re.findall(r"worker (\d+) (?:restarted and )?ready \(pid (\d+)\)", log.read_text())
    return {int(index): int(pid) for index, pid in found}


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:g}s: {what}")


def scrape(port: int) -> str:
    """The supervisor's /metrics page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def scraped_predicts(port: int) -> float:
    """Predict requests counted on /metrics: the values parsed, summed over versions."""
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
