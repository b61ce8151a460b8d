"""What the tests of `ampflow serve --workers N` read of real workers: pids, counts, channels.

Which worker answered is read from the metrics themselves: in the client library's multiprocess
mode every worker writes its own files (`counter_<pid>.db`) in PROMETHEUS_MULTIPROC_DIR, which
the test names; the workers' pids from the supervisor's log.
"""

from __future__ import annotations

import re
import time
from pathlib import Path


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
