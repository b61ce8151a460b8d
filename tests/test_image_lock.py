"""The image's lock file (requirements/image.lock) against pyproject.toml (issue 24, item 4).

The Dockerfile installs every third-party package from the lock with `--require-hashes`, so the
lock must hold, for every platform the image is built for (linux x86_64 and aarch64, Python 3.11
and 3.12, whichever the base image ships), exactly one hashed version of every package, a version
that satisfies pyproject.toml's range (and clients/python's, for ampflow-client's own
dependencies). Stale: a dependency added to or removed from pyproject.toml or image.in and the
lock not regenerated (uv records which input asked for each package: `# via ampflow
(../pyproject.toml)`, `# via -r image.in`). Regenerating: docs/how-to/reliability.md.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "image.lock"
NOT_LOCKED = {"ampflow-client"}  # installed from the checkout (clients/python), --no-deps
ENVIRONMENTS = [
    {"python_version": py, "python_full_version": f"{py}.0", "platform_machine": machine,
     "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
     "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    for py in ("3.11", "3.12") for machine in ("x86_64", "aarch64")]


def _entries() -> list[dict]:
    """Each `name==version ; marker` block of the lock, with its hashes and `# via` line."""
    entries = []
    for block in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        head = re.match(r"([A-Za-z0-9._-]+)==(\S+)(?:\s*;\s*([^\\\n]+))?", block)
        if not head:
            continue
        via = re.search(r"# via (.+)", block)
        entries.append({"name": canonicalize_name(head.group(1)), "version": Version(head.group(2)),
                        "marker": Marker(head.group(3).strip()) if head.group(3) else None,
                        "hashes": re.findall(r"--hash=sha256:([0-9a-f]{64})", block),
                        "via": via.group(1) if via else ""})
    return entries


def _requirements(pyproject: Path) -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads(pyproject.read_text())["project"]["dependencies"]]


def _locked(environment: dict) -> dict[str, Version]:
    pinned: dict[str, list[Version]] = {}
    for entry in _entries():
        if entry["marker"] is None or entry["marker"].evaluate(environment):
            pinned.setdefault(entry["name"], []).append(entry["version"])
    duplicates = {name: versions for name, versions in pinned.items() if len(versions) > 1}
    assert not duplicates, f"two versions of one package for {environment}: {duplicates}"
    return {name: versions[0] for name, versions in pinned.items()}


def test_every_locked_package_is_pinned_with_hashes():
    entries = _entries()
    assert len(entries) > 50
    assert all(entry["hashes"] for entry in entries), [e["name"] for e in entries
                                                       if not e["hashes"]]


@pytest.mark.parametrize("environment", ENVIRONMENTS,
                         ids=lambda e: f"py{e['python_version']}-{e['platform_machine']}")
def test_lock_satisfies_pyproject_ranges_on_every_image_platform(environment):
    locked = _locked(environment)
    wanted = _requirements(ROOT / "pyproject.toml") + _requirements(
        ROOT / "clients" / "python" / "pyproject.toml")
    wanted += [Requirement(line) for line in _image_in()]
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        if name in NOT_LOCKED or (requirement.marker is not None
                                  and not requirement.marker.evaluate(environment)):
            continue
        assert name in locked, f"{name} is not in {LOCK.name}: regenerate it"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"{LOCK.name} pins {name}=={locked[name]}, outside pyproject's {requirement}")


def _image_in() -> list[str]:
    lines = (LOCK.parent / "image.in").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_lock_is_not_stale_its_direct_dependencies_are_pyprojects():
    """What the lock says pyproject.toml and image.in asked for is what they ask for now."""
    from_pyproject = {e["name"] for e in _entries() if "ampflow (../pyproject.toml)" in e["via"]}
    from_image_in = {e["name"] for e in _entries() if "-r image.in" in e["via"]}
    declared = {canonicalize_name(r.name) for r in _requirements(ROOT / "pyproject.toml")}
    assert from_pyproject == declared - NOT_LOCKED
    assert from_image_in == {canonicalize_name(Requirement(r).name) for r in _image_in()}


def test_dockerfile_installs_the_lock_with_hashes_and_nothing_unlocked():
    lines = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir --require-hashes -r requirements/image.lock" in lines
    installs = re.findall(r"pip install[^\n]*", lines)
    assert all("--require-hashes" in i or "--no-deps" in i for i in installs), installs
    assert "dl.k8s.io" not in lines and "curl" not in lines  # kubectl comes from the lock
