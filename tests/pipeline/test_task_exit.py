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


COMMAND = '''
import atexit
import sys
import threading
import time
import types


class Held:
    def __del__(self, _open=open):
        _open(MARKERS + ".torn_down", "w").close()


MARKERS, TENSORFLOW, CODE = sys.argv[1], sys.argv[2] == "tf", int(sys.argv[3])
if TENSORFLOW:  # what exit_command asks: whether the process imported TensorFlow
    sys.modules.setdefault("tensorflow", types.ModuleType("tensorflow"))
held = Held()
atexit.register(lambda: open(MARKERS + ".exit_handler", "w").close())


def late():  # a non-daemon thread: joined before the exit handlers run
    time.sleep(0.3)
    open(MARKERS + ".thread", "w").close()


threading.Thread(target=late).start()
print("the command ran", end="")  # no newline: stdout must still be flushed
from ampflow.task_exit import exit_command

exit_command(CODE)
'''


@pytest.mark.parametrize("code", [0, 2])
@pytest.mark.parametrize("tensorflow", [True, False])
def test_a_command_exits_with_its_code_and_skips_teardown_only_after_tensorflow(
        tmp_path, code, tensorflow):
    """The entry points' end (the `ampflow` script, `python -m ampflow.cli`, the serving CLI):
    the command's exit code, its output, its threads and exit handlers, whatever the exit;
    the interpreter's teardown skipped only where TensorFlow's would cost seconds."""
    script = tmp_path / "command.py"
    script.write_text(COMMAND)
    markers = tmp_path / "marker"
    done = subprocess.run([sys.executable, str(script), str(markers),
                           "tf" if tensorflow else "-", str(code)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr[-3000:]
    assert done.stdout == "the command ran"
    assert (tmp_path / "marker.thread").is_file() and (tmp_path / "marker.exit_handler").is_file()
    assert (tmp_path / "marker.torn_down").exists() is not tensorflow


def test_the_console_script_and_module_entry_points_end_through_exit_command():
    """Each way a user starts a command ends through `exit_command` (a wiring check: the
    behaviour is the test above's, and every CLI test's exit code goes through it)."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["ampflow"] == "ampflow.cli:console"
    for module in (root / "cli" / "__main__.py", root / "serving" / "cli.py"):
        assert "exit_command(main())" in module.read_text(), module
