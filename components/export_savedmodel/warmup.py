"""Replay the warm-up records against the exported model, before TF Serving ever sees them.

TF Serving reads `assets.extra/tf_serving_warmup_requests` (TFRecords of `PredictionLog`, at
most 1000; written and read by `ampflow.serving.model_format`) when it loads a version and
runs each request once, so the first client request does not pay for graph initialisation.
A record that fails makes the server refuse the version, so the step replays every record
against the exported model before publishing it.
"""

from __future__ import annotations

import os

from ampflow.errors import ExportError
from ampflow.serving.model_format import (
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    read_warmup_records,
)


def replay_warmup_records(export_dir: str | os.PathLike, loaded) -> int:
    """Run every warm-up request through the loaded SavedModel, as TF Serving will at load."""
    import tensorflow as tf

    try:
        logs = read_warmup_records(export_dir)
    except Exception as e:
        raise ExportError(f"the written warm-up file does not read back: {e}") from e
    for i, entry in enumerate(logs):
        kind = entry.WhichOneof("log_type")
        try:
            if kind == "predict_log":
                request = entry.predict_log.request
                inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
                loaded.signatures[request.model_spec.signature_name or DEFAULT_SIGNATURE](**inputs)
            elif kind == "classify_log":
                request = entry.classify_log.request
                serialized = [e.SerializeToString() for e in request.input.example_list.examples]
                loaded.signatures[request.model_spec.signature_name or CLASSIFY_SIGNATURE](
                    inputs=tf.constant(serialized))
            else:
                raise ValueError(f"unexpected log type {kind!r}")
        except Exception as e:
            raise ExportError(f"warm-up record {i} ({kind}) fails against the exported model, "
                              f"so TF Serving would refuse to load it: {e}") from e
    return len(logs)
