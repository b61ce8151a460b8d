"""The tutorial's "Step by step" runs as written: every command exits 0 and predict prints a class.

The commands are read from docs/tutorial/step-by-step.md (the docs site's tutorial, which the
README links to) between the `step-by-step` markers and run by bash in a scratch dir, so the
walkthrough cannot drift from the real flags. The only change is the
server port: 8500 becomes a free one, so the test does not collide with a server already
running here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

STEP_BY_STEP = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "step-by-step.md"


def readme_steps() -> str:
    """The bash block between `<!-- step-by-step:begin -->` and `<!-- step-by-step:end -->`."""
    text = STEP_BY_STEP.read_text()
    block = re.search(r"<!-- step-by-step:begin -->\s*```bash\n(.*?)```\s*"
                      r"<!-- step-by-step:end -->", text, flags=re.DOTALL)
    assert block, f"{STEP_BY_STEP.name} lost its step-by-step markers"
    return block.group(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_step_by_step_chains_every_step():
    commands = [line.split()[1] for line in readme_steps().splitlines()
                if line.startswith("ampflow ")]
    assert commands == ["prepare-data", "train", "evaluate", "export", "convert", "deploy",
                        "serve", "predict"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_readme_step_by_step_runs_as_written(tmp_path):
    steps = readme_steps()
    assert "--port 8500" in steps
    script = ("set -euo pipefail\n"
              "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"  # a failed step stops serve
              + steps.replace("--port 8500", f"--port {_free_port()}"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1100)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    for command in ("prepare-data", "train", "evaluate", "export", "convert", "deploy"):
        assert f"ampflow {command}: done" in done.stdout, command
    assert json.loads((tmp_path / "work/eval/verdict.json").read_text())["passed"] is True
    assert re.search(r"^model ampflow version 1 signature serving_default$", done.stdout,
                     flags=re.MULTILINE)
    assert re.search(r"^digit\.npy: \d \(\d\) [01]\.\d{4}", done.stdout, flags=re.MULTILINE)
    assert (tmp_path / "work/serving/ampflow/1/saved_model.pb").is_file()
    assert (tmp_path / "work/model/config.json").is_file()
    assert (tmp_path / "work/data/config.json").is_file()
