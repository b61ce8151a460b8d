"""What a model's base path holds: its version dirs, and which of them the policy aspires to.

TF Serving's file-system storage path source: a version is a numeric dir
`<base_path>/<version>/` (a dot-prefixed staging dir is not numeric, so a half-copied version
is never a candidate); the version policy (latest N / all / specific) picks the aspired
versions. Also what a version dir lacks (`missing_entries`) and what changes when it is being
written (`fingerprint`), which the registry uses to load only finished dirs.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from ampflow.serving.config import ModelConfig
from ampflow.serving.model_format import version_dirs

log = logging.getLogger(__name__)


def meant_dir_hint(base: Path) -> str:
    """`; did you mean <base>/<child>?` when a child dir of `base` holds version dirs."""
    try:
        children = [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return ""
    for child in sorted(children):
        if discover_versions(child):
            versions = sorted(discover_versions(child))
            return f"; did you mean {child}, which holds versions {versions}?"
    return ""


def discover_versions(base_path: Path) -> dict[int, Path]:
    """Numeric child dirs of `base_path`, by `model_format.version_dirs`'s one rule.

    Dot-prefixed staging dirs are not numeric; an unreadable base path holds none (the
    registry logs that once per change).
    """
    return version_dirs(base_path)


def aspired_versions(config: ModelConfig, available: list[int]) -> list[int]:
    """Apply the version policy to the versions found on disk."""
    if config.version_policy == "all":
        return list(available)
    if config.version_policy == "specific":
        missing = [v for v in config.versions if v not in available]
        if missing:
            log.warning("model %s: specific versions %s are not on disk", config.name, missing)
        return [v for v in available if v in config.versions]
    return sorted(available)[-config.num_latest:]


def missing_entries(path: Path, reference: set[str]) -> list[str]:
    """What a version dir lacks: entries of the reference layout, or announced shards."""
    try:
        names = {p.name for p in path.iterdir()}
    except OSError:
        return ["the dir itself"]
    missing = sorted(reference - names)
    shards = re.compile(r"variables\.data-(\d+)-of-(\d+)$")
    try:
        found = [shards.match(p.name) for p in (path / "variables").iterdir()]
    except OSError:
        return missing
    announced = {int(m.group(2)) for m in found if m}
    present = {int(m.group(1)) for m in found if m}
    for total in announced:
        missing += [f"variables/variables.data-{i:05d}-of-{total:05d}" for i in range(total)
                    if i not in present]
    if announced and not (path / "variables" / "variables.index").exists():
        missing.append("variables/variables.index")
    return missing


def dir_fingerprint(path: Path) -> tuple:
    """Names, sizes and mtimes of every file and dir under `path`.

    It changes while the dir is being written or when it is rewritten.
    """
    items = []
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            items.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(items))
