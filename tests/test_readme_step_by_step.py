"""The tutorial's "Step by step" runs as written: every command exits 0 and predict prints a class.

The commands are read from docs/tutorial/step-by-step.md (the docs site's tutorial, which the
README links to) between the `step-by-step` markers, so the walkthrough cannot drift from the
real flags. Bash reads the block as written (`set -euo pipefail`, its line continuations,
quoting, `& SERVER=$!` and `kill $SERVER`), with `ampflow`, `python`, `kill` and `wait` defined
as functions that write down the argv bash gives them; the test then runs those argvs in this
process, through the console script's `main` (and the `python -c` code through `exec`), the way
tests/test_cli_step_by_step.py walks the how-tos: nine processes each paid a TensorFlow
start-up, most of this test's minute. The only change is the server port: 8500 becomes a free
one, so the test does not collide with a server already running here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from ports import free_port

STEP_BY_STEP = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "step-by-step.md"

# Each function writes its name, its own pid (a background job's is the `$!` bash gives the
# script) and its arguments, each ending in NUL, then \x01 NUL: one append (one write) per call,
# so the background job's record never interleaves with the script's. The recorded `wait`
# returns 0 (a real one would wait for the job, which only recorded `serve`).
RECORDER = r"""
_record() { printf '%s\0' "$@" $'\1' >> "$CALLS"; }
ampflow() { _record ampflow "$BASHPID" "$@"; }
python() { _record python "$BASHPID" "$@"; }
kill() { _record kill "$BASHPID" "$@"; }
wait() { _record wait "$BASHPID" "$@"; }
"""


def readme_steps() -> str:
    """The bash block between `<!-- step-by-step:begin -->` and `<!-- step-by-step:end -->`."""
    text = STEP_BY_STEP.read_text()
    block = re.search(r"<!-- step-by-step:begin -->\s*```bash\n(.*?)```\s*"
                      r"<!-- step-by-step:end -->", text, flags=re.DOTALL)
    assert block, f"{STEP_BY_STEP.name} lost its step-by-step markers"
    return block.group(1)


def _free_port() -> int:
    """A loopback port for a server, below the ephemeral range (tests/ports.py says why)."""
    return free_port()


def test_readme_step_by_step_chains_every_step():
    commands = [line.split()[1] for line in readme_steps().splitlines()
                if line.startswith("ampflow ")]
    assert commands == ["prepare-data", "train", "evaluate", "export", "convert", "deploy",
                        "serve", "predict"]


def _calls_as_bash_reads(steps: str, tmp_path: Path) -> list[tuple[str, int, list[str]]]:
    """(program, pid, argv) of every command of `steps`, as bash parsed and expanded them."""
    calls = tmp_path / "calls"
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + RECORDER + steps],
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "CALLS": str(calls)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    records = [r.split("\0")[:-1] for r in calls.read_text().split("\x01\0")[:-1]]
    return [(r[0], int(r[1]), r[2:]) for r in records]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_readme_step_by_step_runs_as_written(tmp_path, monkeypatch):
    from cli_walk import run_cli, serve_and_predict

    steps = readme_steps()
    assert "--port 8500" in steps
    calls = _calls_as_bash_reads(steps.replace("--port 8500", f"--port {_free_port()}"),
                                 tmp_path)
    assert {program for program, _, _ in calls} == {"ampflow", "python", "kill", "wait"}
    (serve,) = [c for c in calls if c[0] == "ampflow" and c[2][0] == "serve"]
    # serve runs in the background (its own pid), and the script stops that job, no other
    assert serve[1] not in {pid for program, pid, _ in calls if program != "ampflow"}
    assert [argv for program, _, argv in calls if program in ("kill", "wait")] == [
        [str(serve[1])], [str(serve[1])]]

    monkeypatch.chdir(tmp_path)  # the block's paths are relative to where it runs
    out = {}
    for program, _, argv in calls:
        if program == "python":
            assert argv[0] == "-c", argv
            exec(compile(argv[1], "<python -c>", "exec"), {"__name__": "__main__"})  # noqa: S102
        elif program == "ampflow" and argv[0] == "predict":
            out["serve"], out["predict"] = serve_and_predict(serve[2], argv)
        elif program == "ampflow" and argv[0] != "serve":
            out[argv[0]] = run_cli(*argv)
    for command in ("prepare-data", "train", "evaluate", "export", "convert", "deploy",
                    "serve", "predict"):
        out[command].assert_ok()
    for command in ("prepare-data", "train", "evaluate", "export", "convert", "deploy"):
        assert f"ampflow {command}: done" in out[command].out, (command, out[command].out)
    assert json.loads((tmp_path / "work/eval/verdict.json").read_text())["passed"] is True
    # export's own summary counts an image model's parity examples in images (the text
    # walk's, in texts: tests/test_cli_step_by_step.py)
    assert re.search(r"export_parity +max \|SavedModel - Keras\| = \S+ on \d+ images",
                     out["export"].out), out["export"].out
    assert re.search(r"^model ampflow version 1 signature serving_default$",
                     out["predict"].out, flags=re.MULTILINE), out["predict"].out
    assert re.search(r"^digit\.npy: \d \(\d\) [01]\.\d{4}", out["predict"].out,
                     flags=re.MULTILINE), out["predict"].out
    assert (tmp_path / "work/serving/ampflow/1/saved_model.pb").is_file()
    assert (tmp_path / "work/model/config.json").is_file()
    assert (tmp_path / "work/data/config.json").is_file()
