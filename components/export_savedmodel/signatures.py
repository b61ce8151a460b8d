"""The serving signatures of docs/ARTIFACTS.md, and the proto-level checks of a written SavedModel.

`serving_default` (method `tensorflow/serving/predict`): `images` float32 [-1, H, W, C] raw
pixels 0..255 → `probabilities` float32 [-1, K], `class_ids` int64 [-1].
`classify` (method `tensorflow/serving/classify`): `inputs` string [-1] of serialized tf.Example
with float_list feature `image` (H*W*C raw pixels) → `scores` float32 [-1, K], `classes` string
[-1, K] (the label names, in class-id order).
`image_bytes` (method `tensorflow/serving/predict`): `image_bytes` string [-1], one encoded
JPEG/PNG/BMP/GIF file per element, decoded and resized in the graph by the training rule
(`prepare_data.images.decode_to_model_input`, size-checked first: encoded_images.py) → the
outputs of `serving_default`, from the same model call.

TF2's `tf.saved_model.save` writes every SignatureDef with method_name
`tensorflow/serving/predict`, so after saving, the `classify` SignatureDef's method name is
rewritten (`ampflow.serving.model_format.set_method_name`, which also refreshes
fingerprint.pb). The step then reloads the result.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ampflow.errors import ExportError, ModelLoadError
from ampflow.serving import model_format
from ampflow.serving.model_format import (
    CLASS_IDS_OUTPUT,
    CLASSIFY_METHOD,
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    IMAGE_BYTES_INPUT,
    IMAGE_BYTES_SIGNATURE,
    IMAGE_FEATURE,
    IMAGES_INPUT,
    PREDICT_METHOD,
    PROBABILITIES_OUTPUT,
)

LABELS_FILE = "labels.txt"
_HALF_DTYPES = ("float16", "bfloat16")


def prediction_outputs(num_classes: int) -> dict[str, Any]:
    """The outputs every Predict signature of the contract has, image or text."""
    return {PROBABILITIES_OUTPUT: {"dtype": "float32", "shape": [-1, num_classes]},
            CLASS_IDS_OUTPUT: {"dtype": "int64", "shape": [-1]}}


def classify_signature(num_classes: int) -> dict[str, Any]:
    """The contract's `classify` signature, image or text: serialized tf.Examples in."""
    k = num_classes
    return {
        "method_name": CLASSIFY_METHOD,
        "inputs": {"inputs": {"dtype": "string", "shape": [-1]}},
        "outputs": {"scores": {"dtype": "float32", "shape": [-1, k]},
                    "classes": {"dtype": "string", "shape": [-1, k]}},
    }


def expected_signatures(input_shape: tuple[int, int, int], num_classes: int) -> dict[str, Any]:
    """The contract, in the form `describe_signatures` returns (-1 = any batch size)."""
    h, w, c = input_shape
    predictions = prediction_outputs(num_classes)
    return {
        DEFAULT_SIGNATURE: {
            "method_name": PREDICT_METHOD,
            "inputs": {IMAGES_INPUT: {"dtype": "float32", "shape": [-1, h, w, c]}},
            "outputs": predictions,
        },
        IMAGE_BYTES_SIGNATURE: {
            "method_name": PREDICT_METHOD,
            "inputs": {IMAGE_BYTES_INPUT: {"dtype": "string", "shape": [-1]}},
            "outputs": dict(predictions),
        },
        CLASSIFY_SIGNATURE: classify_signature(num_classes),
    }


def save_servable(model, input_shape: tuple[int, int, int], labels: list[str],
                  export_dir: str | os.PathLike) -> None:
    """Write `model` (a float32 Keras model on raw pixels) as a SavedModel with all signatures."""
    export_dir = Path(export_dir)
    with tempfile.TemporaryDirectory(prefix="ampflow-labels-") as tmp:
        labels_path = Path(tmp) / LABELS_FILE
        labels_path.write_text("".join(f"{name}\n" for name in labels))
        module, signatures = _servable(model, tuple(input_shape), list(labels), labels_path)
        save_signatures(module, signatures, export_dir)


def save_signatures(module, signatures: dict[str, Any], export_dir: str | os.PathLike) -> None:
    """Save `module` with `signatures`, then give `classify` the method name TF Serving wants.

    Image or text: TF2 writes every signature as Predict (module docstring), so the rewrite
    follows every save. Any failure is an ExportError.
    """
    import tensorflow as tf

    try:
        tf.saved_model.save(module, str(export_dir), signatures=signatures)
    except Exception as e:
        raise ExportError(f"tf.saved_model.save failed for {export_dir}: {e}") from e
    try:
        model_format.set_method_name(export_dir, CLASSIFY_SIGNATURE, CLASSIFY_METHOD)
    except ModelLoadError as e:
        raise ExportError(f"could not set the classify method name in {export_dir}: {e}") from e


def predictions_of(probabilities) -> dict[str, Any]:
    """A Predict signature's outputs (traced in the graph): the probabilities, their argmax."""
    import tensorflow as tf

    return {PROBABILITIES_OUTPUT: probabilities,
            CLASS_IDS_OUTPUT: tf.argmax(probabilities, axis=-1, output_type=tf.int64)}


def classify_outputs(scores, label_names: list[str]) -> dict[str, Any]:
    """The classify signature's outputs (traced): `scores`, and every label name on each row."""
    import tensorflow as tf

    names = tf.constant(label_names, dtype=tf.string)
    classes = tf.tile(names[tf.newaxis, :], tf.stack([tf.shape(scores)[0], 1]))
    return {"scores": scores, "classes": classes}


def concrete_signature(fn, spec):
    """`fn` traced on one input `spec`: a concrete function, what tf.saved_model.save takes."""
    import tensorflow as tf

    return tf.function(fn, input_signature=[spec]).get_concrete_function()


def _read_written(export_dir: str | os.PathLike):
    """The `SavedModel` proto this step wrote; unreadable, it is an export failure."""
    try:
        return model_format.read_saved_model(export_dir)
    except ModelLoadError as e:
        raise ExportError(f"the written SavedModel does not read back: {e}") from e


def describe_signatures(export_dir: str | os.PathLike) -> dict[str, Any]:
    """What `saved_model_cli show --all` prints, as a dict: method, input/output dtypes, shapes."""
    import tensorflow as tf

    try:
        meta_graph = model_format.serving_meta_graph(_read_written(export_dir), export_dir)
    except ModelLoadError as e:
        raise ExportError(str(e)) from e

    def tensors(infos) -> dict[str, Any]:
        return {name: {"dtype": tf.dtypes.as_dtype(info.dtype).name,
                       "shape": None if info.tensor_shape.unknown_rank
                       else [d.size for d in info.tensor_shape.dim]}
                for name, info in sorted(infos.items())}

    return {name: {"method_name": sig.method_name, "inputs": tensors(sig.inputs),
                   "outputs": tensors(sig.outputs)}
            for name, sig in sorted(meta_graph.signature_def.items())
            if not name.startswith("__")}  # skip TF's internal `__saved_model_init_op`


def check_signatures(export_dir: str | os.PathLike, input_shape, num_classes: int) -> dict:
    """Raise ExportError unless the written signatures are exactly the contract; return them."""
    return require_signatures(export_dir, expected_signatures(tuple(input_shape), num_classes))


def require_signatures(export_dir: str | os.PathLike, expected: dict[str, Any]) -> dict:
    """Raise ExportError unless every signature of `expected` is written exactly so; return all."""
    found = describe_signatures(export_dir)
    for name, spec in expected.items():
        if found.get(name) != spec:
            raise ExportError(f"signature {name!r} does not follow docs/ARTIFACTS.md. "
                              f"Expected: {spec}. Received: {found.get(name)}")
    return found


def half_precision_nodes(export_dir: str | os.PathLike) -> list[str]:
    """Every node (graph or function library) with a float16/bfloat16 type, tensor or arg.

    An empty list proves the SavedModel runs no half-precision compute: the mixed policy did not
    leak into the served graph (TFLite and many CPU servers reject float16 Conv2D/MatMul).
    """
    found = []
    for meta_graph in _read_written(export_dir).meta_graphs:
        graph = meta_graph.graph_def
        found += [f"graph/{n.name} ({n.op})" for n in graph.node if _node_is_half(n)]
        for function in graph.library.function:
            fname = function.signature.name
            found += [f"{fname}/{n.name} ({n.op})" for n in function.node_def if _node_is_half(n)]
            args = list(function.signature.input_arg) + list(function.signature.output_arg)
            found += [f"{fname}/arg:{a.name}" for a in args if _dtype_is_half(a.type)]
    return found


def _node_is_half(node) -> bool:
    for attr in node.attr.values():
        kind = attr.WhichOneof("value")
        if kind == "type" and _dtype_is_half(attr.type):
            return True
        if kind == "list" and any(_dtype_is_half(t) for t in attr.list.type):
            return True
        if kind == "tensor" and _dtype_is_half(attr.tensor.dtype):
            return True
    return False


def _dtype_is_half(enum_value: int) -> bool:
    import tensorflow as tf

    try:
        return tf.dtypes.as_dtype(enum_value).name in _HALF_DTYPES
    except TypeError:
        return False


def _servable(model, input_shape, labels, labels_path) -> tuple[Any, dict[str, Any]]:
    """The exported object (the model's variables, the labels asset) and its signatures.

    The signature functions are the SavedModel's signatures only, not also attributes of the
    object: an attribute's function is traced and written a second time (ResNet-50: 1.8 MB of
    saved_model.pb instead of 1.3 MB, 2.7 CPU-s of save instead of 1.4); every reader of an
    ampflow export (TF Serving, the converter, the checks) calls `.signatures`.
    """
    import tensorflow as tf

    from ampflow.components.export_savedmodel.encoded_images import decode_batch

    module = tf.Module(name="ampflow_servable")
    # Track the tf.Variables behind the Keras variables, not the Keras model: the TFLite
    # converter only freezes plain tf.Variables into constants (with the model tracked it
    # leaves VAR_HANDLE/READ_VARIABLE ops and a .tflite without weights).
    module.model_variables = [v.value for v in model.variables]
    module.labels_asset = tf.saved_model.Asset(str(labels_path))  # → assets/labels.txt
    h, w, c = input_shape
    label_names = list(labels)  # captured by the closures below, not tracked

    # One function for the model call, which every signature calls: the SavedModel holds the
    # model's graph once, not once per signature (ResNet-50: three times), so the export
    # traces it once and every load (a server, the converter) reads a third of the graph.
    @tf.function(input_signature=[tf.TensorSpec([None, h, w, c], tf.float32)])
    def probabilities_of(images):
        return tf.cast(model(images, training=False), tf.float32)

    def predict(images):
        return predictions_of(probabilities_of(images))

    def predict_encoded(image_bytes):  # the argument name is the input's key
        return predict(decode_batch(image_bytes, (h, w, c)))

    def classify(inputs):
        features = tf.io.parse_example(
            inputs, {IMAGE_FEATURE: tf.io.FixedLenFeature([h * w * c], tf.float32)})
        return classify_outputs(
            probabilities_of(tf.reshape(features[IMAGE_FEATURE], [-1, h, w, c])), label_names)

    return module, {
        DEFAULT_SIGNATURE: concrete_signature(
            predict, tf.TensorSpec([None, h, w, c], tf.float32, IMAGES_INPUT)),
        CLASSIFY_SIGNATURE: concrete_signature(
            classify, tf.TensorSpec([None], tf.string, "inputs")),
        IMAGE_BYTES_SIGNATURE: concrete_signature(
            predict_encoded, tf.TensorSpec([None], tf.string, IMAGE_BYTES_INPUT)),
    }
