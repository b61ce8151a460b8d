"""The model a pipeline fine-tunes, given as a URI: a `.keras` file, a model dir, or a checkpoint.

On a cluster the train pod sees only what KFP brings it: `dsl.importer` makes the URI a `Model`
artifact and KFP's launcher downloads it into the pod (from gs://, s3:// or minio://: what the
launcher fetches), so the checkpoint reaches the pod as an input artifact, not through a volume
or the image. The local runner takes a local path the same way. What the URI holds is told apart
here, once for both: `model_argument` maps the downloaded artifact to train's `--model`, and
`check_base_model_uri` refuses, before anything is compiled, what a train task would only fail
on later (a missing or wrong local dir, a hub handle, a scheme the launcher cannot fetch).
An image backbone's ImageNet weights file travels the same way (`check_weights_uri`).
"""

from __future__ import annotations

from pathlib import Path

from ampflow.errors import ModelConfigError

# What KFP's launcher downloads an input artifact from (kfp.dsl's RemotePrefix, less oci://,
# which is a model image rather than files)
REMOTE_SCHEMES = ("gs://", "s3://", "minio://")
KERAS_FILE = "model.keras"  # what a published model dir holds (train's output)
_FORMS = ("a .keras file, a model dir holding model.keras, or a pretrained BERT checkpoint dir "
          "(Hugging Face's layout or a keras-hub preset)")
UPLOAD_HINT = ("upload it where the cluster's launcher fetches it, e.g. `gsutil -m cp -r DIR "
               "gs://BUCKET/PATH` (or `aws s3 cp --recursive`, `mc cp --recursive`), and pass "
               "that URI")
FILE_UPLOAD_HINT = ("upload it where the cluster's launcher fetches it, e.g. `gsutil cp FILE "
                    "gs://BUCKET/PATH` (or `aws s3 cp`, `mc cp`), and pass that URI")


def model_argument(path: str) -> str:
    """The `--model` train gets for the imported artifact at `path`.

    A model dir gives its model.keras (its tokenizer beside it); anything else is taken as it
    is: a `.keras` file, or a checkpoint dir, which train reads and checks itself.
    """
    keras_file = Path(path) / KERAS_FILE
    return str(keras_file) if keras_file.is_file() else str(path)


def is_remote(uri: str) -> bool:
    """Whether `uri` is one the launcher fetches (and this machine cannot look into)."""
    return uri.startswith(REMOTE_SCHEMES)


def check_base_model_uri(uri: str, *, cluster: bool) -> str:
    """`uri` checked as far as this machine can; what was checked, for the log.

    A remote URI is taken as it is (its files are not read from here). A local path must be
    one of the three forms, read as train reads it; on a `cluster` it is refused even then,
    since the launcher does not fetch a path of this machine. Raises ModelConfigError (exit 2).
    """
    from ampflow.modeling.pretrained import DOWNLOADS

    if uri.startswith(tuple(DOWNLOADS)):
        from ampflow.modeling.pretrained import read_pretrained_bert

        read_pretrained_bert(uri)  # one line: the command that downloads it
    if _checked_remote(uri, "base_model_uri"):
        return f"{uri}: remote, not checked here (the train task reads it)"
    path = Path(uri).expanduser()
    what = _local_form(path)
    if cluster:
        raise ModelConfigError(
            f"base_model_uri must be a URI the cluster's launcher fetches "
            f"({', '.join(REMOTE_SCHEMES)}): a train pod does not see this machine's files. "
            f"Received: the local {what} {uri!r}; {UPLOAD_HINT}")
    return f"{path}: {what}, checked"


def _checked_remote(uri: str, name: str) -> bool:
    """Whether `uri` is remote (taken as it is); a scheme the launcher does not fetch is refused."""
    if is_remote(uri):
        return True
    if "://" in uri:
        raise ModelConfigError(
            f"{name} must be a local path or a URI KFP's launcher fetches "
            f"({', '.join(REMOTE_SCHEMES)}). Received: {name}={uri!r}")
    return False


def _local_form(path: Path) -> str:
    """Which of the three forms the local `path` is (read and checked), or ModelConfigError."""
    if path.is_file() and path.suffix == ".keras":
        return ".keras file"
    if path.is_dir() and (path / KERAS_FILE).is_file():
        return "model dir"
    if path.is_dir() and (path / "config.json").is_file():
        from ampflow.modeling.pretrained import read_pretrained_bert

        read_pretrained_bert(path)  # a bad checkpoint is one line naming its file
        return "checkpoint dir"
    received = ("no such file or directory" if not path.exists() else
                "a directory with neither model.keras nor config.json" if path.is_dir() else
                "a file that is not .keras")
    raise ModelConfigError(f"base_model_uri must be {_FORMS}. Received: {path}: {received}")


def check_weights_uri(uri: str, *, cluster: bool) -> str:
    """`weights_uri` (an ImageNet weights file to import) checked as far as this machine can.

    The same rule as a base model's: a remote URI is taken as it is (train checks the file's
    layers against the backbone when it loads it); a local path must be an existing file, and
    on a `cluster` it is refused even then. Raises ModelConfigError (exit 2).
    """
    if _checked_remote(uri, "weights_uri"):
        return f"{uri}: remote, not checked here (the train task reads it)"
    path = Path(uri).expanduser()
    if not path.is_file():
        received = "a directory" if path.is_dir() else "no such file"
        raise ModelConfigError("weights_uri must be a Keras applications weights file (the "
                               f"`..._notop.h5` users download). Received: {path}: {received}")
    if cluster:
        raise ModelConfigError(
            f"weights_uri must be a URI the cluster's launcher fetches "
            f"({', '.join(REMOTE_SCHEMES)}): a train pod does not see this machine's files. "
            f"Received: the local file {uri!r}; {FILE_UPLOAD_HINT}")
    return f"{path}: a local file, read by the train task"
