"""A KFP task's process ends without finalization once it succeeded (ampflow.task_exit).

Each case runs KFP's real component executor (`python -m kfp.dsl.executor_main`, the command
of every task under the local runner and on a cluster) on a small component that imports
ampflow, as every step's component does. What tells the two exits apart: an object held in a
module global is finalized (`__del__`) only by the interpreter's teardown, while exit handlers
run either way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

COMPONENT = '''
import atexit
import sys


class Held:
    def __del__(self, _open=open):  # builtins may be gone by then: bound now
        _open(self.markers + ".torn_down", "w").close()


def task(mode: str, markers: str):
    global held
    import ampflow  # noqa: F401  (as every step's component body does)

    held = Held()
    held.markers = markers
    atexit.register(lambda: open(markers + ".exit_handler", "w").close())
    print("the task ran", end="")  # no newline: stdout must still be flushed
    if mode == "raise":
        raise ValueError("the task failed")
    if mode == "exit":
        sys.exit(3)
'''


def _run_task(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    module = tmp_path / "component.py"
    module.write_text(COMPONENT)
    markers = str(tmp_path / "marker")
    executor_input = {"inputs": {"parameterValues": {"mode": mode, "markers": markers}},
                      "outputs": {"outputFile": str(tmp_path / "executor_output.json")}}
    return subprocess.run(
        [sys.executable, "-m", "kfp.dsl.executor_main", "--component_module_path", str(module),
         "--function_to_execute", "task", "--executor_input", json.dumps(executor_input)],
        capture_output=True, text=True, timeout=120)


def test_a_task_that_succeeded_exits_0_with_its_output_written_and_no_teardown(tmp_path):
    done = _run_task(tmp_path, "ok")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the task ran" in done.stdout
    assert (tmp_path / "executor_output.json").is_file()
    assert "Wrote executor output file" in done.stdout  # logging flushed before the exit
    assert (tmp_path / "marker.exit_handler").is_file()  # every exit handler still ran
    assert not (tmp_path / "marker.torn_down").exists()  # the interpreter was not torn down


@pytest.mark.parametrize(("mode", "exit_code", "said"), [
    ("raise", 1, "ValueError: the task failed"), ("exit", 3, "")])
def test_a_task_that_failed_keeps_its_exit_code_and_its_traceback(tmp_path, mode, exit_code,
                                                                   said):
    done = _run_task(tmp_path, mode)
    assert done.returncode == exit_code, done.stderr[-3000:]
    assert said in done.stderr and "the task ran" in done.stdout
    assert not (tmp_path / "executor_output.json").exists()
    assert (tmp_path / "marker.exit_handler").is_file()


def test_outside_a_kfp_task_nothing_is_installed():
    """This process (pytest) imported ampflow: its exit, and its exit code, stay Python's."""
    import ampflow.task_exit as task_exit

    assert not task_exit.in_kfp_task() and not task_exit._state["installed"]


# ---- a worker of a multi-worker run (`ampflow train` under a TF_CONFIG of several tasks) ------

# The process's own command line through ampflow.command.main (as `python -m ampflow.cli` and
# the console script run it), with one command, `work CODE`, that returns CODE.
COMMAND = '''
import atexit, sys, types
from ampflow import command


class Held:
    def __del__(self, _open=open):
        _open(MARKERS + ".torn_down", "w").close()


def register(subparsers):
    work = subparsers.add_parser("work")
    work.add_argument("code", type=int)
    work.set_defaults(func=lambda args: (print("the command ran", end=""),
                                         print("its last log line", file=sys.stderr),
                                         args.code)[-1])


MARKERS = sys.argv.pop(1)
held = Held()
atexit.register(lambda: open(MARKERS + ".exit_handler", "w").close())
sys.exit(command.main(None, [types.SimpleNamespace(register=register)]))
'''
TWO_WORKERS = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                          "task": {"type": "worker", "index": 1}})


def _run_command(tmp_path: Path, code: int, tf_config: str | None):
    import os

    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    done = subprocess.run([sys.executable, "-c", COMMAND, str(tmp_path / "marker"), "work",
                           str(code)], capture_output=True, text=True, env=env, timeout=120)
    return done, (tmp_path / "marker.torn_down").exists()


@pytest.mark.parametrize(("code", "tf_config", "torn_down"), [
    (0, TWO_WORKERS, False),  # the worker that succeeded: no teardown
    (1, TWO_WORKERS, True),   # a failed worker exits the normal way, with its code
    (0, json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker",
                                                                     "index": 0}}), True),
    (0, None, True),          # no cluster: Python's own exit
])
def test_a_cluster_workers_command_that_succeeded_ends_without_teardown(tmp_path, code,
                                                                        tf_config, torn_down):
    """A multi-worker run's worker: its teardown would stop TensorFlow's coordination service,
    seconds of waiting on the other workers (task_exit.end_cluster_worker_at_exit)."""
    done, was_torn_down = _run_command(tmp_path, code, tf_config)
    assert done.returncode == code, done.stderr[-3000:]
    assert was_torn_down is torn_down
    assert done.stdout == "the command ran"  # flushed, with no newline
    assert "its last log line" in done.stderr  # through the stderr filter, before the end
    assert (tmp_path / "marker.exit_handler").is_file()  # every exit handler still ran


def test_a_callers_own_command_never_ends_its_process(monkeypatch):
    """main(argv) in a test or a notebook under a cluster's TF_CONFIG: the caller's process."""
    import types

    from ampflow import command, task_exit

    calls = []
    monkeypatch.setenv("TF_CONFIG", TWO_WORKERS)
    monkeypatch.setattr(task_exit, "end_cluster_worker_at_exit", lambda: calls.append(1))

    def register(subparsers):
        subparsers.add_parser("work").set_defaults(func=lambda args: 0)

    assert command.main(["work"], [types.SimpleNamespace(register=register)]) == 0
    assert calls == [] and task_exit.in_cluster_worker()


@pytest.mark.parametrize(("tf_config", "cluster"), [
    (TWO_WORKERS, True),
    ('{"cluster": {"chief": ["h:1"], "worker": ["h:2"]}, "task": {"type": "chief"}}', True),
    ('{"cluster": {"worker": ["h:1"]}}', False), ("not json", False), ('["a", "b"]', False),
    ("", False)])
def test_in_cluster_worker_reads_tf_configs_tasks(monkeypatch, tf_config, cluster):
    from ampflow import task_exit

    monkeypatch.setenv("TF_CONFIG", tf_config)
    assert task_exit.in_cluster_worker() is cluster
