"""TF Serving's layout: `<model_base>/<version>/`, numeric version dirs, published by one rename.

TF Serving's file-system poller loads every child of the model base whose name is an integer,
so a version must appear in one step, complete. We write into `.<version>.incomplete-*` (a
name the poller and `list_versions` ignore) and `os.rename` it into place at the end. Unlike
`ampflow.files.staging_dir`, publishing never replaces an existing version: a server may have
loaded it, and a version number must mean one model forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ampflow.errors import ExportError, ModelLoadError
from ampflow.serving.model_format import version_dirs

log = logging.getLogger(__name__)

SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_VERSION_DIR_MODE = 0o755


def list_versions(model_base: str | os.PathLike) -> list[int]:
    """Complete versions under `model_base`, ascending: numeric dirs that hold a saved_model.pb.

    A missing `model_base` has no versions. Staging dirs (dot-prefixed) never count.
    """
    return sorted(v for v, path in _numeric_dirs(Path(model_base)) if _is_complete(path))


def find_exported_version(export_base: str | os.PathLike) -> Path:
    """`<export_base>/<model_name>/<highest complete version>` of the one model under it.

    The export component writes exactly one model into its artifact dir; later steps (convert,
    deploy) find the version it published here instead of guessing the layout.
    """
    base = Path(export_base)
    models = sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if base.is_dir() else []
    if len(models) != 1:
        raise ModelLoadError(f"{base} must hold exactly one exported model dir. "
                             f"Received: {[p.name for p in models]}")
    versions = list_versions(models[0])
    if not versions:
        raise ModelLoadError(f"{models[0]} holds no complete version dir")
    return models[0] / str(max(versions))


def next_version(model_base: str | os.PathLike) -> int:
    """The next free version number: one above every numeric dir (complete or not), else 1.

    An incomplete numeric dir (copied by hand, say) still takes its number, so that a new export
    never lands in, or is confused with, whatever that dir holds.
    """
    return max((v for v, _ in _numeric_dirs(Path(model_base))), default=0) + 1


@contextlib.contextmanager
def staged_version_dir(model_base: str | os.PathLike, version: int) -> Iterator[Path]:
    """Yield a hidden staging dir; rename it to `<model_base>/<version>` if the block succeeds.

    On any failure the staging dir is removed and no version dir appears. If the process dies
    hard, the dot-prefixed leftover is ignored by TF Serving and by `list_versions`.
    """
    model_base = Path(model_base)
    final = model_base / str(version)
    _refuse_existing(final)
    model_base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=model_base, prefix=f".{version}.incomplete-"))
    # mkdtemp makes it 0700: a server running as another user (the tensorflow/serving
    # container) could not read the published version.
    tmp.chmod(_VERSION_DIR_MODE)
    try:
        yield tmp
        _refuse_existing(final)  # another export may have taken the number meanwhile
        try:
            os.rename(tmp, final)
        except OSError as e:
            raise ExportError(f"could not publish {tmp} as {final}: {e.strerror}") from e
        log.info("published version %d at %s", version, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _refuse_existing(final: Path) -> None:
    if final.exists():
        raise ExportError(
            f"version must be a new version number. Received: version={final.name}, but "
            f"{final} already exists (omit the version to take the next free one)."
        )


def _numeric_dirs(model_base: Path) -> Iterator[tuple[int, Path]]:
    """(version, dir) of the numeric child dirs, by `model_format.version_dirs`'s one rule."""
    yield from version_dirs(model_base).items()


def _is_complete(path: Path) -> bool:
    return any((path / name).is_file() for name in SAVED_MODEL_FILES)
