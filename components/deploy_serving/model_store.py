"""Check a SavedModel version dir and push it into a model store the way a server polls it.

TF Serving (and `ampflow serve`) poll `<base_path>/` for numbered version dirs and load the
highest. A server must never see half a version: on a local filesystem we copy into a hidden
dir beside it and rename it into place; an object store has no rename, so we upload every other
file first and `saved_model.pb` last (what TFX's Pusher does), since a loader needs that file.

Two deploys into one local store at once (two pipeline runs, two `ampflow deploy`s) must not
pick the same number: `claim_version` (called by the step, so the CLI and the pipeline number
alike) picks the next free one under an fcntl lock on `<model_base>/.versions.lock` and leaves
a hidden `.<version>.claimed` file that later claims count, so the second deploy takes the
number after the first one's even while the first is still copying. The claim is removed once
the version is published (or its copy failed). A deploy killed in between leaves its claim
behind: that number is skipped, never reused for another model. A deploy of the content the
newest version already holds claims nothing and gets that version (a re-run is a no-op).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampflow.errors import ConfigError, DeployError, ModelConfigError, ModelLoadError
from ampflow.files import staging_dir, write_json_atomic
from ampflow.serving.model_format import (
    DEFAULT_SIGNATURE,
    SAVED_MODEL_PB,
    read_saved_model,
    serving_meta_graph,
)

log = logging.getLogger(__name__)

SIGNATURE = DEFAULT_SIGNATURE  # the signature the canary checks
DEPLOY_RECORD = "ampflow_deploy.json"
VERSIONS_LOCK = ".versions.lock"
_CLAIM = re.compile(r"\.([0-9]+)\.claimed")
_URI_SCHEMES = ("gs://",)
# Object stores neither side can read with this TensorFlow (checked on TF 2.21): TF moved S3 to
# tensorflow-io, whose last release (0.37.1) requires tensorflow<2.17 and whose file-system
# plugins fail to load with 2.21 (undefined symbol), so tf.io.gfile answers "File system scheme
# 's3' not implemented"; and tensorflow/serving images from 2.7 on cannot read s3:// either
# (tensorflow/serving#1963, open).
_UNSUPPORTED = {"s3://": "tf.io.gfile in TF 2.21 and tensorflow/serving >= 2.7 cannot read "
                         "s3:// (tensorflow-io 0.37 needs TF < 2.17; tensorflow/serving#1963); "
                         "use a PVC (a dir) or gs://"}


@dataclass(frozen=True)
class SignatureSpec:
    """The signature the canary calls: inputs (name -> (dtype enum, shape with -1)), outputs.

    `name` is `serving_default` for a SavedModel and an image TFLite variant, `token_ids` for
    a text TFLite variant (LiteRT runs no string op: the variant takes ids).
    """

    inputs: dict[str, tuple[int, tuple[int, ...]]]
    outputs: tuple[str, ...]
    name: str = SIGNATURE

    @classmethod
    def of(cls, name: str, signature_def) -> SignatureSpec:
        """The spec of one SignatureDef proto (a SavedModel's or a TFLite servable's)."""
        inputs = {key: (info.dtype, tuple(d.size for d in info.tensor_shape.dim))
                  for key, info in signature_def.inputs.items()}
        return cls(inputs=inputs, outputs=tuple(sorted(signature_def.outputs)), name=name)


def is_uri(path: str) -> bool:
    """True for an object-store URI (gs://), where only tf.io.gfile can write."""
    return path.startswith(_URI_SCHEMES)


def refuse_unsupported_uri(path: str | None) -> None:
    """ConfigError for a store URI that neither tf.io.gfile nor TF Serving can read."""
    for scheme, why in _UNSUPPORTED.items():
        if path and path.startswith(scheme):
            raise ConfigError(f"model_store must be a directory or gs://... . Received: "
                              f"model_store={path!r}: {why}")


def check_saved_model(path: Path) -> SignatureSpec:
    """Prove `path` is a loadable-looking SavedModel with a `serving_default` signature."""
    if not Path(path).is_dir():  # a flag naming no SavedModel: configuration, exit 2
        raise ModelConfigError(
            "saved_model_dir must be an exported SavedModel version dir. "
            f"Received: {str(path)!r}, which does not exist"
        )
    if not (Path(path) / SAVED_MODEL_PB).is_file():
        raise ModelConfigError(
            f"saved_model_dir must contain {SAVED_MODEL_PB}. Received: {str(path)!r} "
            f"holds {sorted(p.name for p in Path(path).iterdir())}"
        )
    signatures = _signature_defs_without_tensorflow(Path(path))
    if SIGNATURE not in signatures:
        raise ModelLoadError(
            f"{Path(path) / SAVED_MODEL_PB} must have a 'serve' graph with signature "
            f"{SIGNATURE!r}. Received signatures: {sorted(signatures)}"
        )
    return SignatureSpec.of(SIGNATURE, signatures[SIGNATURE])


def _signature_defs_without_tensorflow(path: Path) -> dict:
    """The `serve` graph's SignatureDefs, as serving's `serving_signature_defs`, without TF.

    Deploying copies files, so this check is the only reason the deploy task (and `ampflow
    deploy`) would import TensorFlow: ~4 CPU-s per deploy, which otherwise takes ~0.3 s.
    `import tensorflow.core.protobuf...` runs TensorFlow's whole `__init__`; TensorBoard (an
    ampflow dependency) ships the same MetaGraphDef proto under its own package, and a
    SavedModel is only `{int64 saved_model_schema_version = 1; repeated MetaGraphDef
    meta_graphs = 2}` around it. The same bytes parse to the same fields (unknown ones kept).
    """
    saved_model = read_saved_model(path, _saved_model_message())
    return dict(serving_meta_graph(saved_model, path / SAVED_MODEL_PB).signature_def)


@functools.cache
def _saved_model_message():
    """tensorflow.SavedModel's message over TensorBoard's copy of MetaGraphDef (same numbers)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tensorboard.compat.proto import meta_graph_pb2

    name, field = "ampflow/deploy/saved_model.proto", descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(name)
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto(
            name=name, package="ampflow.deploy", dependency=[meta_graph_pb2.DESCRIPTOR.name])
        message = proto.message_type.add(name="SavedModel")
        message.field.add(name="saved_model_schema_version", number=1,
                          type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
        message.field.add(name="meta_graphs", number=2, type=field.TYPE_MESSAGE,
                          label=field.LABEL_REPEATED, type_name=".tensorboard.MetaGraphDef")
        pool.AddSerializedFile(proto.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("ampflow.deploy.SavedModel"))


def dir_digest(path: Path) -> str:
    """A content hash of a version dir (file paths + bytes), our deploy record left out."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        rel = f.relative_to(path).as_posix()
        if rel == DEPLOY_RECORD:
            continue
        h.update(rel.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def claim_version(
    model_base: str | os.PathLike, at_least: int = 1, *, exactly: int | None = None,
    same_as: Path | None = None,
) -> int:
    """Reserve a version number under `model_base` for one deploy's `push_local`.

    Unless `exactly` is given, it is >= `at_least`, above every version dir (complete or not)
    and above every claim of a deploy still copying; see the module docstring. `exactly`: that
    number, refused while another deploy is copying it. `same_as`: the dir to publish; if the
    newest version (no claim above it) already holds its content, that version, unclaimed.
    """
    model_base = Path(model_base)
    digest = dir_digest(same_as) if same_as is not None and exactly is None else None
    try:
        model_base.mkdir(parents=True, exist_ok=True)
        with open(model_base / VERSIONS_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            claimed = [int(m.group(1)) for name in os.listdir(model_base)
                       if (m := _CLAIM.fullmatch(name))]
            if exactly is not None:
                return _claim_exactly(model_base, exactly, claimed)
            newest = _newest_same_content(model_base, digest, claimed)
            if newest is not None:
                return newest
            version = max([at_least, _next_dir_number(model_base), *(c + 1 for c in claimed)])
            _claim_file(model_base, version).touch()
    except OSError as e:
        raise DeployError(f"could not reserve a version under {model_base}: {e}") from e
    return version


def _next_dir_number(model_base: Path) -> int:
    from ampflow.artifacts.versions import next_version

    return next_version(model_base)


def _claim_exactly(model_base: Path, version: int, claimed: list[int]) -> int:
    """Claim `version` itself (a --version given); DeployError while another deploy holds it."""
    if version in claimed:
        raise DeployError(
            f"version {version} of {model_base.name} is being deployed by another deploy now "
            f"(its claim {_claim_file(model_base, version)} exists; with no deploy running, a "
            "killed one left it: remove it). Expected: another version number, or leave "
            f"--version unset. Received: version={version}")
    _claim_file(model_base, version).touch()
    return version


def _newest_same_content(model_base: Path, digest: str | None, claimed: list[int]) -> int | None:
    """The newest version, if it holds content `digest` and no deploy claims a number above it."""
    newest = _next_dir_number(model_base) - 1
    if digest is None or newest < 1 or any(c > newest for c in claimed):
        return None
    version_dir = model_base / str(newest)
    if version_dir.is_dir() and dir_digest(version_dir) == digest:
        log.info("the newest version %s already holds this model", version_dir)
        return newest
    return None


def _claim_file(model_base: Path, version: int | str) -> Path:
    return Path(model_base) / f".{version}.claimed"


def release_claim(model_base: str | os.PathLike, version: int | str) -> None:
    """Give a claimed number back (its deploy failed before it published the version)."""
    _claim_file(Path(model_base), version).unlink(missing_ok=True)


def push_local(src: Path, dest: Path, record: dict[str, Any]) -> tuple[Path, bool]:
    """Copy `src` to `dest` atomically; returns (dest, already_present).

    The same content already at `dest` is a no-op (a re-run of the step); different content
    is refused: a server may be serving that version, and a version is immutable.
    """
    try:
        return _push_local(src, dest, record)
    finally:  # published or failed: the number is a dir now, or free again
        release_claim(dest.parent, dest.name)


def _push_local(src: Path, dest: Path, record: dict[str, Any]) -> tuple[Path, bool]:
    if dest.exists():
        if dir_digest(dest) == dir_digest(src):
            log.info("version already present with the same content: %s", dest)
            return dest, True
        raise DeployError(
            f"{dest} already holds a different model; versions are immutable. "
            "Expected: a new version number (another --version, or none: the next free one). "
            f"Received: version {dest.name} for model {dest.parent.name}"
        )
    try:
        with staging_dir(dest) as tmp:
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            os.chmod(write_json_atomic(tmp / DEPLOY_RECORD, record), 0o644)
            os.chmod(tmp, 0o755)  # mkdtemp/mkstemp make 0700/0600; servers run as other users
    except ConfigError as e:  # another deploy published this version between check and rename
        raise DeployError(f"could not publish {dest}: {e}; versions are immutable") from e
    except OSError as e:
        raise DeployError(f"could not copy {src} to {dest}: {e}") from e
    return dest, False


def remove_local_version(dest: Path) -> None:
    """Take a version away again (the server then falls back to the previous one)."""
    shutil.rmtree(dest, ignore_errors=True)


def push_uri(src: Path, dest: str, record: dict[str, Any]) -> tuple[str, bool]:
    """Upload `src` to an object-store `dest`, `saved_model.pb` last; same rules as local."""
    import json

    import tensorflow as tf

    gfile = tf.io.gfile
    try:
        digest = dir_digest(src)
        if gfile.exists(f"{dest}/{SAVED_MODEL_PB}"):
            if _uri_record_digest(dest) == digest:
                log.info("version already present with the same content: %s", dest)
                return dest, True
            raise DeployError(
                f"{dest} already holds a model; versions are immutable. "
                "Expected: a new version number. "
                f"Received: version {dest.rstrip('/').rsplit('/', 1)[-1]}"
            )
        files = sorted(p for p in Path(src).rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name == SAVED_MODEL_PB)  # stable: .pb goes last
        for f in files:
            target = f"{dest}/{f.relative_to(src).as_posix()}"
            gfile.makedirs(target.rsplit("/", 1)[0])
            gfile.copy(str(f), target, overwrite=True)
        with gfile.GFile(f"{dest}/{DEPLOY_RECORD}", "w") as fh:
            fh.write(json.dumps({**record, "content_sha256": digest}, indent=2, sort_keys=True))
    except tf.errors.OpError as e:
        raise DeployError(f"could not upload {src} to {dest}: {e.message}") from e
    return dest, False


def _uri_record_digest(dest: str) -> str | None:
    """The content hash our deploy record holds for an uploaded version, if any."""
    import json

    import tensorflow as tf

    path = f"{dest}/{DEPLOY_RECORD}"
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as fh:
        return json.loads(fh.read()).get("content_sha256")
