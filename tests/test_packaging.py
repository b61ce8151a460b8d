"""The hand-written package list in pyproject.toml must cover every step folder."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"ampflow": "ampflow", "ampflow.components": "components",
           "ampflow.pipeline": "pipeline", "ampflow.serving": "serving"}


def test_pyproject_lists_every_python_package_folder():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = set()
    for package, folder in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found == listed


def test_ampflow_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "ampflow.cli", "--help"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for command in ("prepare-data", "train", "evaluate", "export", "convert", "serve", "predict",
                    "model-metadata", "model-status", "deploy", "compile", "submit", "run-local",
                    "demo"):
        assert f"    {command} " in out, command


def test_ampflow_unknown_flag_exits_2_with_one_line_usage_error():
    cmd = [sys.executable, "-m", "ampflow.cli", "train", "--data-dir", "d", "--output-dir", "o",
           "--no-such-flag", "3"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in done.stderr
    assert "Traceback" not in done.stderr
