"""The reliability suite of issue 14, bounded for the test run: a 12-second soak with hot
reloads (0 failures, the corrupt and the half-copied versions never answer, RSS bounded) and a
fuzz of 2,000 byte-mutated plus the hand-made hostile requests (server alive, RSS bounded,
every request answered with a status). Assertions are counts and bounds, never timings.
The full-size runs are `benchmarks/serving_soak.py` (32 clients x 120 s, 10,000 mutations)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from serving_helpers import local_only

# a server under load for tens of seconds: outside the fast tier (`make test-fast`)
pytestmark = [pytest.mark.serving, pytest.mark.slow, local_only, pytest.mark.timeout(400)]

RSS_BOUND_MB = 50  # issue 14: "the server stays up with RSS within +50 MB"
SUMMARY = "request(s) could not be parsed in the last"  # the guard's line (grpc_guard.py)
SUMMARY_EVERY_S = 10.0  # its interval, the server's default


def _benchmark(name: str):
    """A benchmarks/ script, loaded as a module (it is not in a package)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def soak_module():
    return _benchmark("serving_soak")


def test_fuzz_2000_mutated_and_hand_made_requests_server_alive_rss_bounded(tmp_path):
    started = time.monotonic()
    report = _benchmark("serving_fuzz").fuzz_with_server(tmp_path, mutated=2000, seed=0)
    took_s = time.monotonic() - started
    assert report["server_alive"] and report["good_request_after"] == "OK"
    table = {row["request"]: row for row in report["hand_made"]}
    assert len(table) >= 25
    for name, row in table.items():  # each refused with a definite code, none by a crash
        assert row["code"] not in ("OK", "UNAVAILABLE", "UNKNOWN", "CANCELLED"), (name, row)
    huge = table["52-byte request declaring [4000000,8,8,1], one float_val"]
    assert huge["bytes"] == 52 and huge["code"] == "INVALID_ARGUMENT"
    assert sum(report["mutated_codes"].values()) == 2000
    assert "UNAVAILABLE" not in report["mutated_codes"]
    assert report["rss_mb_after"] - report["rss_mb_before"] < RSS_BOUND_MB, report
    # undecodable requests are logged in one summary line per SUMMARY_EVERY_S, not one
    # traceback each: the summaries grow with the seconds the fuzz took (a slower host writes
    # more), everything else is the same few lines for 2,000 requests as for one
    lines = (tmp_path / "fuzz-server.log").read_text().splitlines()
    summaries = [x for x in lines if SUMMARY in x]
    others = "\n".join(x for x in lines if SUMMARY not in x)
    assert not any("Traceback" in x for x in lines), others[-2000:]
    assert 1 <= len(summaries) <= took_s / SUMMARY_EVERY_S + 1, (took_s, summaries)
    assert len(others) < 20_000, others[-2000:]


def test_soak_12s_hot_reloads_zero_failures(soak_module, tmp_path):
    # the claims are per push (zero failures, the corrupt and the half-copied versions never
    # answer, no RSS growth per swap): 12 s hold all four pushes after the first RSS sample
    # (2.4 s to 9 s in; the half-copied version's copy lasts 1.8 s, three polls)
    report = soak_module.soak(tmp_path, clients=8, seconds=12, poll_s=0.5)
    assert report["requests"] > 0
    assert report["failures"] == 0, report["failures_by_code"]
    assert report["corrupt_v3_answers"] == 0
    assert report["v4_answers_before_copy_finished"] == 0
    assert report["versions_answered"][-1] == 5  # every reload reached the clients
    assert report["server_alive_at_end"] and report["server_exit_code"] == 0
    # the stated bound itself: the first sample is taken 2 s in, once the first version loaded
    # and answered; each reload swaps a version, so the peak must not grow by a model per push
    assert report["rss_mb"]["max"] - report["rss_mb"]["first"] < RSS_BOUND_MB, report["rss_mb"]
