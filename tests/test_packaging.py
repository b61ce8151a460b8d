"""The hand-written package list in pyproject.toml must cover every step folder."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"ampflow": "src/ampflow", "ampflow.cli": "cli", "ampflow.components": "components",
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


def test_the_mapping_is_pyprojects_and_the_dockerfile_copies_every_mapped_folder():
    # The image builds the package from the folders pyproject maps: one it does not COPY is a
    # wheel without that package (found at the first import in a pipeline step, not here).
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert mapped["package-dir"] == MAPPING
    copied = {line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ")}
    missing = [folder for folder in MAPPING.values()
               if not any(folder == c or folder.startswith(f"{c}/") for c in copied)]
    assert missing == []


def test_the_root_package_is_named_as_imported_and_never_shadows_the_installed_tree():
    # src/ampflow holds only the root modules; at the checkout's root (on sys.path under
    # `python -m pytest`) it would hide ampflow.components. No root-level `ampflow/` at all.
    assert MAPPING["ampflow"].endswith("/ampflow")
    assert not (ROOT / "ampflow").exists()
    out = subprocess.run([sys.executable, "-c", "import ampflow.components, ampflow.cli"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]

def test_an_editable_install_finds_the_checkouts_k8s_manifests(monkeypatch):
    # Without $AMPFLOW_K8S_DIR (the image sets it) the steps read the checkout's k8s/, found
    # from the root package's file: a layout move must move that path with it.
    from ampflow.files import k8s_manifests_dir

    monkeypatch.delenv("AMPFLOW_K8S_DIR", raising=False)
    assert k8s_manifests_dir() == ROOT / "k8s"
    assert (k8s_manifests_dir() / "base" / "kustomization.yaml").is_file()

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
    assert "ampflow train: error: unrecognized argument --no-such-flag" in done.stderr
    assert "Traceback" not in done.stderr


def test_installed_packages_satisfy_declared_requirements():
    from ampflow.requirements import unmet_requirements

    assert unmet_requirements() == []


def test_unmet_requirements_names_package_installed_and_required_version():
    from ampflow.requirements import unmet_requirements

    versions = {"keras": "3.9.2", "tensorflow": "2.21.0"}
    problems = unmet_requirements(
        ["keras<4,>=3.10", "tensorflow~=2.21.0", "absent>=1", 'pytest>=8; extra == "dev"'],
        installed_version=versions.get)
    assert problems == ["keras 3.9.2 is installed, ampflow needs keras<4,>=3.10",
                        "absent is not installed (ampflow needs absent>=1)"]


def test_cli_refuses_to_run_with_a_package_outside_its_declared_range(monkeypatch, capsys):
    import importlib.metadata

    from ampflow import cli

    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "3.9.0" if name == "keras" else real_version(name))
    code = cli.main(["prepare-data", "--output-dir", "/nonexistent/never-created"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        "ampflow prepare-data: error: installed packages do not match ampflow's requirements: "
        "keras 3.9.0 is installed, ampflow needs keras<4,>=3.10. Reinstall with `pip install -e "
        ".` (or `make test`/`make demo`, which do)."]


@pytest.mark.slow
def test_keras_floor_release_runs_the_keras_sensitive_layers(tmp_path):
    """The declared Keras floor is true: the fused BatchNormalization (which subclasses Keras's
    layer and reads its attributes) passes its tests on exactly that release."""
    from packaging.requirements import Requirement

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    keras = next(Requirement(r) for r in declared if Requirement(r).name == "keras")
    floor = next(s.version for s in keras.specifier if s.operator == ">=")
    target = tmp_path / f"keras-{floor}"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         f"keras=={floor}"], capture_output=True, text=True, timeout=300)
    if install.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot install keras=={floor}: {install.stderr[-1000:]}")
        pytest.skip(f"keras=={floor} not installable here (no registry?)")
    env = {**os.environ, "PYTHONPATH": str(target), "TF_CPP_MIN_LOG_LEVEL": "2"}
    # One process: it names the Keras it imported on its first line, then runs the tests
    # (a second process only to print the version paid another TensorFlow start-up).
    tests = str(ROOT / "tests/components/train/test_fused_batch_norm.py")
    run = subprocess.run(
        [sys.executable, "-c", "import sys, keras, pytest; print(keras.__version__, flush=True); "
         "sys.exit(pytest.main(sys.argv[1:]))", "-q", "-p", "no:cacheprovider", tests,
         "-k", "not resnet and not mobilenet"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    version = run.stdout.splitlines()[0] if run.stdout else ""
    from packaging.version import Version

    assert Version(version.strip()) == Version(floor), run.stderr[-3000:]  # what ran
    assert run.returncode == 0, run.stdout[-3000:]
