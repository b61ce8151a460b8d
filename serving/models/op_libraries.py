"""Ops a SavedModel needs that this TensorFlow has not registered: TF Text's, loaded on demand.

TF Serving links TF Text's ops into its binary, so a SavedModel that tokenizes in its graph
(`TFText>WhitespaceTokenizeWithOffsetsV2`, ...) loads there; `tf.saved_model.load` here
refuses it with "Op type not registered" unless `tensorflow_text` was imported first (its
import registers the ops). The `tf-text` extra installs it, pinned to TensorFlow's minor as
TensorFlow pins it (its ops are built against one TensorFlow ABI).

Before a SavedModel loads, `ensure_ops_registered` reads the op names its `serve` MetaGraph
lists (`meta_info_def.stripped_op_list`, which TensorFlow writes with every op of the graph
and its functions) and imports `tensorflow_text` only when one is not registered: a server
that never sees such a model never pays that import. Ops still missing after it refuse the
version with one line that names them and what to install.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from pathlib import Path

from ampflow.errors import ModelLoadError
from ampflow.serving.model_format import SAVED_MODEL_PB, read_saved_model, serving_meta_graph

TF_TEXT_PREFIX = "TFText>"  # the namespace TF Text registers its ops under
TF_TEXT_MODULE = "tensorflow_text"
TF_TEXT_DISTRIBUTION = "tensorflow-text"
TF_TEXT_EXTRA = "pip install 'ampflow[tf-text]'"


def ensure_ops_registered(version_dir: str | Path) -> None:
    """Register what `version_dir`'s SavedModel needs, or refuse it (ModelLoadError).

    A saved_model.pb that cannot be read is left to the loader, which refuses it as before.
    """
    try:
        meta_graph = serving_meta_graph(read_saved_model(version_dir),
                                        Path(version_dir) / SAVED_MODEL_PB)
    except ModelLoadError:
        return
    needed = {op.name for op in meta_graph.meta_info_def.stripped_op_list.op}
    missing = unregistered(needed)
    if not missing:
        return
    import_failure = _import_tf_text()
    missing = unregistered(missing)
    if missing:
        import tensorflow as tf

        raise ModelLoadError(missing_ops_message(
            version_dir, missing, import_failure, tf.__version__,
            _installed_version(TF_TEXT_DISTRIBUTION)))


def unregistered(op_names) -> list[str]:
    """The names in `op_names` that this process's TensorFlow has no OpDef for, sorted."""
    from tensorflow.python.framework import op_def_registry

    return sorted(name for name in op_names if op_def_registry.get(name) is None)


def _import_tf_text() -> str | None:
    """Import tensorflow_text (registering its ops); why it failed, or None."""
    try:
        importlib.import_module(TF_TEXT_MODULE)
    except Exception as e:  # ImportError, or a library built for another TensorFlow
        first = str(e).splitlines()[0] if str(e) else ""
        return f"{type(e).__name__}: {first}"
    return None


def missing_ops_message(version_dir, missing: list[str], import_failure: str | None,
                        tf_version: str, tf_text_version: str | None) -> str:
    """The one line that refuses a version whose ops are not registered.

    TF Text's ops (their prefix) name the extra to install and the state of tensorflow-text
    here (`tf_text_version`, None when not installed): not installed, installed for another
    TensorFlow minor, or failing to import. Other ops are ones this TensorFlow lacks, or TF
    Text's older, unprefixed ones when tensorflow_text did not import (the line says so).
    """
    head = (f"{version_dir} uses ops that TensorFlow {tf_version} has not registered. "
            f"Received: {missing}")
    if not any(name.startswith(TF_TEXT_PREFIX) for name in missing):
        if import_failure is None and tf_text_version is not None:
            return (f"{head}; neither this TensorFlow nor {TF_TEXT_DISTRIBUTION} "
                    f"{tf_text_version} registers them")
        return (f"{head}; this TensorFlow lacks them (TF Text's older ops have no "
                f"'{TF_TEXT_PREFIX}' prefix: if the model uses TF Text, {TF_TEXT_EXTRA})")
    minor = ".".join(tf_version.split(".")[:2])
    wanted = f"{TF_TEXT_DISTRIBUTION} {minor}.*, TensorFlow's minor"
    installed = tf_text_version
    if installed is None:
        state = f"{TF_TEXT_DISTRIBUTION} is not installed"
    elif ".".join(installed.split(".")[:2]) != minor:
        state = (f"{TF_TEXT_DISTRIBUTION} {installed} is installed, built for another "
                 f"TensorFlow than {tf_version}")
    elif import_failure is not None:
        state = f"{TF_TEXT_DISTRIBUTION} {installed} did not import ({import_failure})"
    else:
        state = f"{TF_TEXT_DISTRIBUTION} {installed} is imported and does not register them"
    return f"{head}; TF Text's ops need the tf-text extra: {TF_TEXT_EXTRA} ({wanted}); {state}"


def _installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
