"""A tiny, real SavedModel that follows docs/ARTIFACTS.md, for tests, benchmarks and demos.

The serving side is developed beside the exporter, so it needs its own model with the same
contract: `serving_default` (`images` float32 [-1,H,W,C] raw pixels 0..255 -> `probabilities`
float32 [-1,K], `class_ids` int64 [-1]) and `classify` (`inputs` serialized tf.Example with
float_list feature `image` -> `scores` float32 [-1,K], `classes` string [-1,K]), plus
`assets/labels.txt` and `assets.extra/tf_serving_warmup_requests`.

TF2's `tf.saved_model.save` writes every signature with method_name
`tensorflow/serving/predict`; TF Serving's Classify API insists on
`tensorflow/serving/classify`, so after saving we rewrite that one field of the `classify`
SignatureDef in saved_model.pb (the graph and the functions are untouched).

Run `python -m ampflow.serving.testing --base-path DIR` to write it for a real TF Serving.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from ampflow.files import staging_dir
from ampflow.serving.client import image_example

CLASSIFY_METHOD = "tensorflow/serving/classify"
DEFAULT_SHAPE = (8, 8, 1)
DEFAULT_LABELS = tuple(f"digit_{i}" for i in range(10))


def _build_module(shape: tuple[int, int, int], labels: tuple[str, ...], seed: int):
    import tensorflow as tf

    h, w, c = shape
    n, k = h * w * c, len(labels)
    rng = np.random.default_rng(seed)

    class TinyClassifier(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernel = tf.Variable(rng.normal(0, 0.05, (n, k)).astype(np.float32))
            self.bias = tf.Variable(rng.normal(0, 0.5, (k,)).astype(np.float32))
            self.labels = tf.constant(list(labels))

        @tf.function(input_signature=[tf.TensorSpec([None, h, w, c], tf.float32, "images")])
        def serve(self, images):
            logits = tf.matmul(tf.reshape(images / 255.0, [-1, n]), self.kernel) + self.bias
            probabilities = tf.nn.softmax(logits)
            return {"probabilities": probabilities,
                    "class_ids": tf.argmax(probabilities, axis=-1, output_type=tf.int64)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, "inputs")])
        def classify(self, inputs):
            features = tf.io.parse_example(
                inputs, {"image": tf.io.FixedLenFeature([n], tf.float32)})
            scores = self.serve(tf.reshape(features["image"], [-1, h, w, c]))["probabilities"]
            classes = tf.tile(self.labels[None, :], [tf.shape(scores)[0], 1])
            return {"scores": scores, "classes": classes}

    return TinyClassifier()


def set_method_name(saved_model_dir: Path, signature: str, method_name: str) -> None:
    """Rewrite one SignatureDef's method_name in saved_model.pb (see the module docstring)."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = Path(saved_model_dir) / "saved_model.pb"
    proto = saved_model_pb2.SavedModel.FromString(pb.read_bytes())
    for meta_graph in proto.meta_graphs:
        if signature in meta_graph.signature_def:
            meta_graph.signature_def[signature].method_name = method_name
    pb.write_bytes(proto.SerializeToString())


def sample_images(count: int, shape=DEFAULT_SHAPE, seed: int = 0) -> np.ndarray:
    """Deterministic float32 'raw pixel' images in 0..255."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, *shape)).astype(np.float32)


def _write_warmup(version_dir: Path, model_name: str, images: np.ndarray) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import (
        classification_pb2,
        predict_pb2,
        prediction_log_pb2,
    )

    path = version_dir / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        predict = predict_pb2.PredictRequest()
        predict.model_spec.name = model_name
        predict.model_spec.signature_name = "serving_default"
        predict.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
        writer.write(prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=predict)).SerializeToString())
        classify = classification_pb2.ClassificationRequest()
        classify.model_spec.name = model_name
        classify.model_spec.signature_name = "classify"
        classify.input.example_list.examples.append(image_example(images[0]))
        writer.write(prediction_log_pb2.PredictionLog(
            classify_log=prediction_log_pb2.ClassifyLog(request=classify)).SerializeToString())


def write_model_version(base_path: str | os.PathLike, version: int, *, seed: int | None = None,
                        model_name: str = "ampflow", shape=DEFAULT_SHAPE,
                        labels: tuple[str, ...] = DEFAULT_LABELS, warmup: bool = True) -> Path:
    """Write `<base_path>/<version>/` atomically (staging dir + rename); returns its path."""
    import tensorflow as tf

    final = Path(base_path) / str(version)
    module = _build_module(tuple(shape), tuple(labels), version if seed is None else seed)
    with staging_dir(final, replaces="saved_model.pb") as tmp:
        tf.saved_model.save(module, str(tmp),
                            signatures={"serving_default": module.serve,
                                        "classify": module.classify})
        set_method_name(tmp, "classify", CLASSIFY_METHOD)
        (tmp / "assets").mkdir(exist_ok=True)
        (tmp / "assets" / "labels.txt").write_text("\n".join(labels) + "\n")
        if warmup:
            _write_warmup(tmp, model_name, sample_images(2, shape, seed=99))
    return final


def main(argv: list[str] | None = None) -> int:
    """Write the fixture model, e.g. to serve it with a real tensorflow_model_server."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--base-path", required=True, help="model base path to write into")
    parser.add_argument("--versions", type=int, nargs="+", default=[1], help="versions to write")
    args = parser.parse_args(argv)
    for version in args.versions:
        print(write_model_version(args.base_path, version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
