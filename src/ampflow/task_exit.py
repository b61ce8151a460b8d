"""A KFP task's or a cluster worker's process ends once its work is done, without teardown.

Each step of the pipeline runs as its own process (`python -m kfp.dsl.executor_main`, under
the kfp local runner and on a cluster alike). Once the executor has written the task's output,
all that is left is the interpreter's finalization, which in a process that imported
TensorFlow takes 2-4 s of wall time (~0.7 CPU-s) on this 2-core host: module teardown and
TensorFlow's C++ destructors, for memory the OS reclaims anyway. Measured in the demo's logs:
"Wrote executor output file" to "finished with status SUCCESS" 3.1 s for prepare-data, 3.8 s
for evaluate-parity; with six such tasks per run, the pipeline waited ~20 s for nothing.

`install()` (called when the `ampflow` package is imported, only in a KFP executor process)
registers an exit handler that runs every other exit handler (logging's flush included),
flushes stdout and stderr, then ends the process with `os._exit(0)`. Only after a success: the
executor wrote the task's output file (it does so after the component function returned) and
no exception went uncaught (sys.excepthook saw none); a failed task (an exception, a
`sys.exit(1)`: no output file) finalizes as before and keeps its exit code.
Nothing else is lost: files are written by then (the steps write atomically and close what they
open, and non-daemon threads are joined before exit handlers run), as with `serve --workers`. A
multi-worker run's worker ends the same way (`end_cluster_worker_at_exit`: 7-34 s saved).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import time

# The module KFP runs every lightweight component's task with (`python3 -m ...`).
KFP_EXECUTOR = "kfp.dsl.executor_main"
_state = {"installed": False, "failed": False, "since": 0.0}


def in_kfp_task() -> bool:
    """Whether this process is a KFP task: its main module is KFP's component executor."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == KFP_EXECUTOR


def install() -> None:
    """In a KFP task's process, end it without finalization once it succeeded; once."""
    if _state["installed"] or not in_kfp_task():
        return
    _state.update(installed=True, since=time.time())
    sys.excepthook = _noting_failure(sys.excepthook)
    atexit.register(_exit_without_teardown)


def _noting_failure(hook):
    def excepthook(*exc_info):
        _state["failed"] = True
        hook(*exc_info)
    return excepthook


def in_cluster_worker() -> bool:
    """Whether TF_CONFIG names a cluster of more than one task (this process is one of them)."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
        return sum(len(cluster.get(kind) or ()) for kind in ("chief", "worker")) > 1
    except (AttributeError, TypeError, ValueError):
        return False  # not a cluster this module reads: the normal exit


def end_cluster_worker_at_exit() -> None:
    """After a multi-worker run's command succeeded, end the process at exit without teardown.

    Called by ampflow.command for the process's own command line only, never a caller's.

    In a worker, TensorFlow's teardown also shuts its coordination service agent down, which
    waits on the other workers, or on heartbeats to a chief that has already gone: measured on
    the shared 2-core host, 7-9 s from a worker's last line to its exit (0.3-0.5 s without
    teardown), and 34 s in one `ampflow train --workers 2` run, all of it the launcher waiting.
    An exit handler, not an exit here: Python joins non-daemon threads before exit handlers run.
    """
    if in_cluster_worker():
        atexit.register(_end_now)


def _exit_without_teardown() -> None:
    if _state["failed"] or not _output_written():
        return  # the normal way out, with the failure's exit code
    _end_now()


def _end_now() -> None:
    """Run the other exit handlers, flush stdout and stderr, end the process with 0."""
    for handler in (_exit_without_teardown, _end_now):
        atexit.unregister(handler)
    atexit._run_exitfuncs()  # the others (logging.shutdown, TensorFlow's own), newest first
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0)


def _output_written() -> bool:
    """Whether the executor wrote this task's output file (`outputs.outputFile`) since start."""
    parser = argparse.ArgumentParser(add_help=False)  # as executor_main reads it
    parser.add_argument("--executor_input")
    text = parser.parse_known_args(sys.argv[1:])[0].executor_input
    try:
        path = json.loads(text)["outputs"]["outputFile"]
        return os.path.getmtime(path) >= _state["since"]
    except (TypeError, KeyError, ValueError, OSError):
        return False
