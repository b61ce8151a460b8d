"""Check that the installed packages satisfy what ampflow declares it needs.

`pip install` enforces pyproject's ranges once; a later `pip install keras==3.12` (or a base
image with its own Keras) silently breaks them, and the symptom is an AttributeError deep in
training. The declared floors are the versions the code was checked against
(tests/test_packaging.py runs the Keras-sensitive code on the floor release), so a violated
range is reported up front, in one line, naming the package, the installed and the required
version.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

from ampflow.errors import AmpflowError

DISTRIBUTION = "ampflow"


class DependencyVersionError(AmpflowError):
    """An installed package is outside the version range ampflow declares."""

    exit_code = 2


def unmet_requirements(
    requirements: list[str] | None = None,
    installed_version: Callable[[str], str | None] | None = None,
) -> list[str]:
    """Return one message per declared (non-extra) requirement the installation violates.

    `requirements` defaults to ampflow's installed metadata; `installed_version` (name → version
    or None when absent) to importlib.metadata. Both are injectable for tests.
    """
    from packaging.requirements import Requirement

    if requirements is None:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    lookup = installed_version or _installed_version
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra (dev tools) or another platform's dependency
        version = lookup(requirement.name)
        if version is None:
            problems.append(f"{requirement.name} is not installed (ampflow needs {requirement})")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name} {version} is installed, ampflow needs "
                            f"{requirement}")
    return problems


def check_installed_versions() -> None:
    """Raise DependencyVersionError when an installed package violates a declared range."""
    try:
        problems = unmet_requirements()
    except importlib.metadata.PackageNotFoundError:
        return  # running from a source tree that was never installed: nothing declared
    if problems:
        raise DependencyVersionError(
            "installed packages do not match ampflow's requirements: " + "; ".join(problems)
            + ". Reinstall with `pip install -e .` (or `make test`/`make demo`, which do)."
        )


def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
