"""One log file per task of a local run, and one progress line as each task starts and ends.

How the kfp local runner (kfp 2.17, `SubprocessRunner`) shows a task: it runs the task as a
subprocess with stderr merged into a pipe, and `print`s each line it reads to `sys.stdout`;
its own lines ("Executing task 'train'", "Task 'train' finished with status SUCCESS", the
outputs, a line of dashes that closes the task) go through the root logger to a handler it
creates on `sys.stdout` for each task, and its notes between tasks go to the root logger's
own handlers. Tasks run one at a time. So `TaskLogRouter`, set as `sys.stdout` and
`sys.stderr` and as the root logger's only handler for the run (`routed_output`), sees every
line of the run, in order, with no change to kfp: the lines from "Executing task 'X'" to the
closing dashes go to `<log_dir>/X.log`, the rest to `<log_dir>/pipeline.log`, and the two
announcements become `on_start(task)` / `on_end(task, succeeded)` calls.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_STARTED = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
_TASK_END = re.compile(r"^-{20,}$")
RUNNER_LOG = "pipeline"


def plain(text: str) -> str:
    """The local runner's text without its terminal colour codes."""
    return _COLOUR.sub("", text)


class TaskLogRouter(io.TextIOBase):
    """A text stream that files each line of a local run under the task that printed it."""

    def __init__(self, log_dir: Path, *, on_start: Callable[[str], None],
                 on_end: Callable[[str, bool], None], echo: TextIO | None = None,
                 step_names: dict[str, str] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.step_names = dict(step_names or {})  # the runner's task name -> the step's name
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._on_start, self._on_end, self._echo = on_start, on_end, echo
        self._files: dict[str, TextIO] = {}
        self._current = RUNNER_LOG
        self._pending = ""
        self.running: str | None = None  # started, not yet announced finished

    def log_path(self, task: str) -> Path:
        """Where the lines of `task` go (`pipeline` for the runner's own), named by its step."""
        return self.log_dir / f"{self.step_names.get(task, task)}.log"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self._echo is not None:
            self._echo.write(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._route(plain(line))
        return len(text)

    def flush(self) -> None:
        if self._echo is not None:
            self._echo.flush()
        for file in self._files.values():
            file.flush()

    def close(self) -> None:
        if self._pending:
            self._route(plain(self._pending))
            self._pending = ""
        for file in self._files.values():
            file.close()
        self._files.clear()
        super().close()

    def _route(self, line: str) -> None:
        started = _STARTED.search(line)
        if started:
            self._current = self.running = started.group(1)
            self._on_start(self._current)
        self._file(self._current).write(line + "\n")
        finished = _FINISHED.search(line)
        if finished:
            self._file(self._current).flush()
            self.running = None
            self._on_end(finished.group(1), finished.group(2) == "SUCCESS")
        elif _TASK_END.match(line):
            self._current = RUNNER_LOG

    def _file(self, task: str) -> TextIO:
        if task not in self._files:
            self._files[task] = open(self.log_path(task), "w", encoding="utf-8")  # noqa: SIM115
        return self._files[task]


@contextlib.contextmanager
def routed_output(router: TaskLogRouter) -> Iterator[TaskLogRouter]:
    """Python's stdout, stderr and root logging go to `router` for the block."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    handler = logging.StreamHandler(router)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(router), contextlib.redirect_stderr(router):
            yield router
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        router.close()
        sys.stdout.flush()
