"""Write like a server reads: temp path first, then one atomic rename.

A later step (or TF Serving, which polls version dirs) must never see a half-written artifact.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ampflow.errors import ConfigError


def ensure_writable_dir(path: str | os.PathLike, what: str = "output_dir") -> Path:
    """Create `path` if needed and prove it is writable, before any compute starts."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-", delete=True)
        probe.close()
    except OSError as e:
        raise ConfigError(
            f"{what} must be a writable directory. Received: {what}={str(path)!r} ({e.strerror})"
        ) from e
    return path


def write_json_atomic(path: str | os.PathLike, payload: Any) -> Path:
    """Write `payload` as indented JSON to `path` through a temp file and `os.replace`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=True, default=_json_default)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; servers may read as another user
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file written by `write_json_atomic`."""
    with open(path) as f:
        return json.load(f)


@contextlib.contextmanager
def staging_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp dir beside `final`; rename it to `final` only if the block succeeds.

    The temp dir starts with a dot so that directory scanners (TF Serving's version poller,
    our own loaders) never take it for a finished artifact. On failure it is removed.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.incomplete-"))
    tmp.chmod(0o755)  # mkdtemp makes 0700; TF Serving may run as another user
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _json_default(obj: Any) -> Any:
    """Make numpy scalars/arrays and paths JSON-serialisable."""
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
