"""Longest test files first, so that `make test`'s two pytest-xdist workers finish together.

`make test` runs `-n 2 --dist loadfile`: a whole file goes to one worker, and a worker asks for
its next file once it has two tests left. xdist's own order (the files with the most tests
first) put the files of one or two long tests (the demo, the pipeline runs: 25-140 s each)
last, and a worker that asked early could hold several of them while the other sat idle: on a
quiet 2-core host 893 s of wall time for 1,545 s of tests, the last two minutes on one core.
Ordered by their measured seconds, longest first (`--no-loadscope-reorder` keeps the order),
the files are handed out as in longest-processing-time-first scheduling, and the short files
fill the gaps at the end.

The seconds live in `tests/file_durations.json`, written by a run with
`--record-file-durations tests/file_durations.json` (it updates the files that ran and keeps the
others). A file not listed counts as 0 s and runs among the short ones; a listed file that no
longer exists is harmless here and flagged by tests/test_suite_hygiene.py.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

DURATIONS_FILE = Path(__file__).with_name("file_durations.json")


def file_of(nodeid: str) -> str:
    """`tests/a/test_b.py::test_c[x]` -> `tests/a/test_b.py` (xdist's loadfile unit)."""
    return nodeid.split("::", 1)[0]


def read_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """File -> seconds; empty when the file is absent (then the order is pytest's own)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def longest_files_first(items: list, seconds: dict[str, float]) -> list:
    """`items` regrouped so the longest files come first; ties keep collection order.

    A file's tests stay together and in their own order (module fixtures are set up once).
    """
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(file_of(item.nodeid), len(first_seen))

    def key(item) -> tuple[float, int]:
        name = file_of(item.nodeid)
        return -seconds.get(name, 0.0), first_seen[name]

    return sorted(items, key=key)  # stable: within a file, collection order


class DurationRecorder:
    """Sums each file's setup + call + teardown seconds and merges them into a JSON file.

    Registered only in the process that sees every report (xdist's controller, or a run
    without workers), so the sums are whole.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        self.write()

    def write(self) -> None:
        merged = read_durations(self.path)
        merged.update({name: round(value, 1) for name, value in self.seconds.items()})
        ordered = dict(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0])))
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")
