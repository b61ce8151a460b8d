"""Find what an upstream task wrote inside its artifact dir."""

from __future__ import annotations

import os
from pathlib import Path

from ampflow.errors import ModelLoadError


def find_exported_version(export_base: str | os.PathLike) -> Path:
    """Return `<export_base>/<model_name>/<highest complete version>` of the one model there."""
    from ampflow.components.export_savedmodel.versions import list_versions

    base = Path(export_base)
    models = [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")] \
        if base.is_dir() else []
    if len(models) != 1:
        raise ModelLoadError(f"{base} must hold exactly one exported model dir. "
                             f"Received: {sorted(p.name for p in models)}")
    versions = list_versions(models[0])
    if not versions:
        raise ModelLoadError(f"{models[0]} holds no complete version dir")
    return models[0] / str(max(versions))
