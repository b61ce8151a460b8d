"""The order `make test` hands test files to its two workers in (tests/suite_order.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from suite_order import DurationRecorder, file_of, longest_files_first


def _items(*nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_longest_files_come_first_and_each_file_keeps_its_tests_together_in_order():
    items = _items("tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t1",
                   "tests/b.py::t2[x]", "tests/d.py::t1")
    seconds = {"tests/b.py": 139.0, "tests/c.py": 20.0, "tests/a.py": 0.5}
    order = [i.nodeid for i in longest_files_first(items, seconds)]
    assert order == ["tests/b.py::t1", "tests/b.py::t2[x]", "tests/c.py::t1",
                     "tests/a.py::t1", "tests/a.py::t2",
                     "tests/d.py::t1"]  # not listed: 0 s, after every listed one


def test_unlisted_files_keep_their_collection_order():
    items = _items("tests/z.py::t", "tests/y.py::t", "tests/x.py::t")
    assert longest_files_first(items, {}) == items


def test_the_recorder_sums_every_phase_per_file_and_keeps_files_that_did_not_run(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/old.py": 7.0, "tests/a.py": 99.0}))
    recorder = DurationRecorder(path)
    for nodeid, duration in [("tests/a.py::t1", 1.25), ("tests/a.py::t1", 2.0),
                             ("tests/a.py::t2[p]", 0.5), ("tests/b.py::C::t", 10.0)]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=duration))
    recorder.write()
    written = json.loads(path.read_text())
    assert written == {"tests/b.py": 10.0, "tests/old.py": 7.0, "tests/a.py": 3.8}
    assert list(written) == ["tests/b.py", "tests/old.py", "tests/a.py"]  # longest first


def test_file_of_a_class_test_and_a_parametrized_one():
    assert file_of("tests/k8s/test_m.py::TestX::test_y[a::b]") == "tests/k8s/test_m.py"
