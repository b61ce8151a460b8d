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

from ampflow.errors import AmpflowError, ConfigError


def k8s_manifests_dir() -> Path:
    """$AMPFLOW_K8S_DIR (set in the image), else the repo's k8s/ (an editable install).

    Both the deploy step (TF Serving) and the train step (TFJob template) read manifests there.
    """
    if os.environ.get("AMPFLOW_K8S_DIR"):
        return Path(os.environ["AMPFLOW_K8S_DIR"])
    return Path(__file__).resolve().parents[2] / "k8s"  # <checkout>/src/ampflow/files.py


def yaml_documents(source) -> list[Any]:
    """Every document of a YAML text or open file, as `yaml.safe_load_all` gives them.

    libyaml's parser (`CSafeLoader`, in PyYAML's wheels) with the same safe constructors: a
    compiled pipeline (~80 KB) takes ~0.01 CPU-s instead of ~0.15 with the pure-Python parser,
    which `submit`, `compile --backend` and the manifest renders each paid per read.
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # a PyYAML built without libyaml
    return list(yaml.load_all(source, Loader=loader))


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


def read_artifact_json(directory: str | os.PathLike, name: str, *, artifact: str, hint: str,
                       error: type[AmpflowError]) -> Any:
    """The JSON file `name` of a step's output dir, or one clear `error`.

    Missing: "<dir> is not <artifact>: expected <name> in it (<hint>)." (the usual cause is a
    wrong dir or a step that has not run); present but not JSON: "<path> is corrupt".
    """
    path = Path(directory) / name
    if not path.is_file():
        raise error(f"{directory} is not {artifact}: expected {name} in it ({hint}).")
    try:
        return read_json(path)
    except ValueError as e:
        raise error(f"{path} is corrupt: {e}") from e


@contextlib.contextmanager
def staging_dir(final: str | os.PathLike, *, replaces: str | None = None) -> Iterator[Path]:
    """Yield a temp dir beside `final`; rename it to `final` only if the block succeeds.

    The temp dir starts with a dot so that directory scanners (TF Serving's version poller,
    our own loaders) never take it for a finished artifact. On failure it is removed.

    An existing `final` is replaced only if it is empty or holds the file `replaces` (i.e. it
    is an earlier output of the same step); anything else is refused with a ConfigError, so
    `--output-dir .` can never wipe a user's directory. The old dir is renamed aside first and
    deleted only after the new one is in place. With `replaces=None` an existing non-empty
    `final` is always refused (a published version is immutable), atomically: the rename fails.
    """
    final = Path(final)
    _check_replaceable(final, replaces)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.incomplete-"))
    except OSError as e:
        raise ConfigError(f"cannot write beside {final}: {e.strerror or e}") from e
    tmp.chmod(0o755)  # mkdtemp makes 0700; TF Serving may run as another user
    try:
        yield tmp
        _swap_in(tmp, final, replaces)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _check_replaceable(final: Path, replaces: str | None) -> None:
    if not final.exists() or (final.is_dir() and not any(final.iterdir())):
        return
    if replaces and final.is_dir() and (final / replaces).is_file():
        return
    expected = f"an earlier output (holding {replaces})" if replaces else "nothing"
    raise ConfigError(
        f"{final} already exists and is not safe to replace. Expected: a new directory or "
        f"{expected}. Received: an existing {'directory' if final.is_dir() else 'file'} "
        "with other contents; choose another output path."
    )


def _swap_in(tmp: Path, final: Path, replaces: str | None) -> None:
    """Rename `tmp` to `final`, moving an earlier output aside first and deleting it after."""
    old = None
    if replaces and final.is_dir() and any(final.iterdir()):
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old-"))
        os.replace(final, old / "previous")
    elif final.is_dir():
        final.rmdir()  # empty: a plain rename onto it would work too, but be explicit
    try:
        os.rename(tmp, final)  # fails (ENOTEMPTY/EEXIST) if another writer got there first
    except OSError as e:
        if old is not None:
            os.replace(old / "previous", final)
        raise ConfigError(f"could not publish {final}: {e.strerror or e}") from e
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _json_default(obj: Any) -> Any:
    """Make numpy scalars/arrays and paths JSON-serialisable."""
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def check_volume_writable(path: str | os.PathLike, what: str) -> None:
    """One clear line when this uid cannot write the volume mounted at `path` (nothing else).

    KFP sets no fsGroup on its pods (kubeflow/pipelines#3866), so a volume whose root belongs
    to root with mode 0755 (a fresh block-storage PVC) is read-only to the image's user, and
    every retry would fail the same way deep inside training.
    """
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if os.access(existing, os.W_OK | os.X_OK):
        return
    st = existing.stat()
    raise ConfigError(
        f"{what} is not writable by this pod's user (uid {os.getuid()}, gid {os.getgid()}): "
        f"{existing} belongs to uid {st.st_uid} gid {st.st_gid} with mode "
        f"{st.st_mode & 0o7777:04o}, and KFP sets no fsGroup (kubeflow/pipelines#3866). Use a "
        "storage class whose volumes any uid can write (NFS-style), or make the volume's root "
        "group 10001 writable once (README: Going to a real cluster)")
