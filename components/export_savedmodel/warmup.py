"""TF Serving warm-up records: real test images replayed by the server before a version serves.

TF Serving reads `assets.extra/tf_serving_warmup_requests` (TFRecords of `PredictionLog`, at
most 1000) when it loads a version and runs each request once, so the first client request
does not pay for graph initialisation. A record that fails makes the server refuse the
version, so the step replays every record against the exported model before publishing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ampflow.components.export_savedmodel.signatures import (
    CLASSIFY,
    IMAGE_FEATURE,
    SERVING_DEFAULT,
)
from ampflow.errors import ExportError

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit


def write_warmup_records(export_dir: str | os.PathLike, model_name: str, images: np.ndarray,
                         num_predict: int) -> int:
    """Write `num_predict` Predict requests (one real image each) and one Classify request.

    Returns the number of records written. With `num_predict == 0` no file is written.
    """
    import tensorflow as tf

    if num_predict == 0:
        return 0
    if len(images) == 0:
        raise ExportError("warm-up needs at least one real image; the test split is empty")
    records = [_predict_log(model_name, images[i % len(images)][None])
               for i in range(num_predict)]
    records.append(_classify_log(model_name, images[:1]))
    path = Path(export_dir) / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record.SerializeToString())
    return len(records)


def read_warmup_records(export_dir: str | os.PathLike) -> list:
    """The `PredictionLog` protos of a version dir's warm-up file ([] if it has none)."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = Path(export_dir) / WARMUP_FILE
    if not path.is_file():
        return []
    logs = []
    for raw in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
        log_proto = prediction_log_pb2.PredictionLog()
        log_proto.ParseFromString(raw)
        logs.append(log_proto)
    return logs


def replay_warmup_records(export_dir: str | os.PathLike, loaded) -> int:
    """Run every warm-up request through the loaded SavedModel, as TF Serving will at load."""
    import tensorflow as tf

    logs = read_warmup_records(export_dir)
    for i, entry in enumerate(logs):
        kind = entry.WhichOneof("log_type")
        try:
            if kind == "predict_log":
                request = entry.predict_log.request
                inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
                loaded.signatures[request.model_spec.signature_name or SERVING_DEFAULT](**inputs)
            elif kind == "classify_log":
                request = entry.classify_log.request
                serialized = [e.SerializeToString() for e in request.input.example_list.examples]
                loaded.signatures[request.model_spec.signature_name or CLASSIFY](
                    inputs=tf.constant(serialized))
            else:
                raise ValueError(f"unexpected log type {kind!r}")
        except Exception as e:
            raise ExportError(f"warm-up record {i} ({kind}) fails against the exported model, "
                              f"so TF Serving would refuse to load it: {e}") from e
    return len(logs)


def image_example(image: np.ndarray):
    """A tf.Example with the float_list feature `image` that the classify signature parses."""
    import tensorflow as tf

    values = np.asarray(image, dtype=np.float32).ravel()
    return tf.train.Example(features=tf.train.Features(feature={
        IMAGE_FEATURE: tf.train.Feature(float_list=tf.train.FloatList(value=values))}))


def _predict_log(model_name: str, batch: np.ndarray):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = SERVING_DEFAULT
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(batch.astype(np.float32)))
    return prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request))


def _classify_log(model_name: str, batch: np.ndarray):
    from tensorflow_serving.apis import classification_pb2, prediction_log_pb2

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = CLASSIFY
    request.input.example_list.examples.extend(image_example(image) for image in batch)
    return prediction_log_pb2.PredictionLog(
        classify_log=prediction_log_pb2.ClassifyLog(request=request))
