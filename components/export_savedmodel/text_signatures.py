"""The serving signatures of a text model (docs/ARTIFACTS.md), and the proof TF Serving runs them.

The image contract's sibling (signatures.py): the same outputs, declared once in
`ampflow.serving.model_format`, from inputs a text client has.

`serving_default` (method `tensorflow/serving/predict`): `text` string [-1], one raw UTF-8
text per element, tokenized IN THE GRAPH by the tokenizer the model was trained with (Keras
`TextVectorization`, rebuilt from the model dir's vocab.txt: src/ampflow/modeling/tokenizer.py) →
`probabilities` float32 [-1, K], `class_ids` int64 [-1].
`classify` (method `tensorflow/serving/classify`): `inputs` string [-1] of serialized
tf.Example with bytes_list feature `text` → `scores` float32 [-1, K], `classes` string [-1, K].
`token_ids` (method `tensorflow/serving/predict`): `input_ids` int32 [-1, L], the token ids
themselves (0 = padding) → the outputs of `serving_default`. What the TFLite variants take (the
pip LiteRT runtime runs no string op), and what the export's parity check compares `text` with.

`serving_default` and `classify` cut the ids to the request's length bucket (a model of any
length: the bert_* encoders), `token_ids` runs at the cap. The vocabulary is in the graph (a
hash table, `LookupTableImportV2`) and in `assets/vocab.txt` + `assets/tokenizer.json` (TFLite).
`non_core_ops` proves every op of the graph is a core TensorFlow op (no tensorflow-text op).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ampflow.artifacts.signature_names import TEXT_INPUT, TOKEN_IDS_INPUT, TOKEN_IDS_SIGNATURE
from ampflow.components.export_savedmodel.signatures import (
    LABELS_FILE,
    classify_outputs,
    classify_signature,
    concrete_signature,
    prediction_outputs,
    predictions_of,
    require_signatures,
    save_signatures,
)
from ampflow.data.modality import TEXT_FEATURE
from ampflow.errors import ExportError, ModelLoadError
from ampflow.serving import model_format
from ampflow.serving.model_format import (
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    PREDICT_METHOD,
)


def expected_text_signatures(sequence_length: int, num_classes: int) -> dict[str, Any]:
    """The text contract, in the form `describe_signatures` returns (-1 = any batch size)."""
    predictions = prediction_outputs(num_classes)
    return {
        DEFAULT_SIGNATURE: {
            "method_name": PREDICT_METHOD,
            "inputs": {TEXT_INPUT: {"dtype": "string", "shape": [-1]}},
            "outputs": predictions,
        },
        TOKEN_IDS_SIGNATURE: {
            "method_name": PREDICT_METHOD,
            "inputs": {TOKEN_IDS_INPUT: {"dtype": "int32", "shape": [-1, sequence_length]}},
            "outputs": dict(predictions),
        },
        CLASSIFY_SIGNATURE: classify_signature(num_classes),
    }


def check_text_signatures(export_dir: str | os.PathLike, sequence_length: int,
                          num_classes: int) -> dict:
    """Raise ExportError unless the written signatures are exactly the text contract."""
    return require_signatures(export_dir, expected_text_signatures(sequence_length, num_classes))


def text_example(text: str | bytes, feature: str = TEXT_FEATURE):
    """A tf.Example with one bytes_list feature `text`: what the text classify signature parses."""
    import tensorflow as tf

    value = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return tf.train.Example(features=tf.train.Features(feature={
        feature: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))}))


def save_text_servable(model, tokenizer, labels: list[str],
                       export_dir: str | os.PathLike) -> None:
    """Write `model` (float32, on token ids) with `tokenizer` in the graph, all signatures."""
    export_dir = Path(export_dir)
    with tempfile.TemporaryDirectory(prefix="ampflow-text-assets-") as tmp:
        tmp = Path(tmp)
        (tmp / LABELS_FILE).write_text("".join(f"{name}\n" for name in labels))
        tokenizer.save(tmp)  # vocab.txt + tokenizer.json, shipped for who tokenizes outside
        module, signatures = _text_servable(model, tokenizer, list(labels), tmp)
        save_signatures(module, signatures, export_dir)


def _text_servable(model, tokenizer, labels: list[str], assets: Path):
    """The exported object (variables, tokenizer table, assets) and its three signatures."""
    import tensorflow as tf

    from ampflow.modeling.tokenizer import TOKENIZER_FILE, VOCAB_FILE

    module = tf.Module(name="ampflow_text_servable")
    # plain tf.Variables, not the Keras model: the TFLite converter freezes only those
    module.model_variables = [v.value for v in model.variables]
    module.tokenizer = tokenizer.layer  # tracks the vocabulary's lookup table
    module.labels_asset = tf.saved_model.Asset(str(assets / LABELS_FILE))
    module.vocab_asset = tf.saved_model.Asset(str(assets / VOCAB_FILE))
    module.tokenizer_asset = tf.saved_model.Asset(str(assets / TOKENIZER_FILE))
    length = tokenizer.sequence_length
    label_names = list(labels)

    @tf.function(input_signature=[tf.TensorSpec([None, length], tf.int32)])
    def probabilities_of(token_ids):
        return tf.cast(model(token_ids, training=False), tf.float32)

    probabilities_of_text = _length_following(model, length) or probabilities_of

    def predict_ids(input_ids):  # the argument name is the input's key
        return predictions_of(probabilities_of(input_ids))

    def predict_text(text):
        return predictions_of(probabilities_of_text(tokenizer.tokenize(text)))

    def classify(inputs):
        features = tf.io.parse_example(
            inputs, {TEXT_FEATURE: tf.io.FixedLenFeature([], tf.string)})
        return classify_outputs(
            probabilities_of_text(tokenizer.tokenize(features[TEXT_FEATURE])), label_names)

    return module, {
        DEFAULT_SIGNATURE: concrete_signature(
            predict_text, tf.TensorSpec([None], tf.string, TEXT_INPUT)),
        CLASSIFY_SIGNATURE: concrete_signature(
            classify, tf.TensorSpec([None], tf.string, "inputs")),
        TOKEN_IDS_SIGNATURE: concrete_signature(
            predict_ids, tf.TensorSpec([None, length], tf.int32, TOKEN_IDS_INPUT)),
    }


def _length_following(model, cap: int):
    """The text signatures' model call on ids cut to the request's length bucket, or None.

    A request costs its longest text's bucket (16, 32, 64, ... up to the cap:
    ampflow.modeling.length_buckets), not the cap, when the model takes ids of any length
    (the bert_* encoders); only trailing padding is cut, so the answers are the cap's. The
    `token_ids` signature keeps `[-1, cap]`: TFLite converts it at fixed shapes.
    """
    import tensorflow as tf

    from ampflow.modeling.length_buckets import bucket_lengths, trim_to_bucket

    if tuple(model.inputs[0].shape) != (None, None):
        return None
    buckets = bucket_lengths(cap)

    @tf.function(input_signature=[tf.TensorSpec([None, cap], tf.int32)])
    def probabilities_of_bucket(token_ids):
        return tf.cast(model(trim_to_bucket(token_ids, buckets), training=False), tf.float32)

    return probabilities_of_bucket


def length_buckets_of(model, cap: int) -> list[int] | None:
    """The lengths the text signatures pad a request to (ampflow_export.json); None: the cap."""
    from ampflow.modeling.length_buckets import bucket_lengths

    return list(bucket_lengths(cap)) if tuple(model.inputs[0].shape) == (None, None) else None


def graph_op_types(export_dir: str | os.PathLike) -> set[str]:
    """Every op type the `serve` graph runs: its nodes and its function library's nodes.

    A node whose op is a function of the library (a call) is not an op type and is left out.
    """
    try:
        saved_model = model_format.read_saved_model(export_dir)
        meta_graph = model_format.serving_meta_graph(saved_model, export_dir)
    except ModelLoadError as e:
        raise ExportError(f"the written SavedModel does not read back: {e}") from e
    graph = meta_graph.graph_def
    functions = {f.signature.name for f in graph.library.function}
    ops = {n.op for n in graph.node}
    ops |= {n.op for f in graph.library.function for n in f.node_def}
    return ops - functions


def non_core_ops(op_types: set[str]) -> list[str]:
    """The op types that are not core TensorFlow ops (`tf.raw_ops`: what TF Serving links).

    `tf.raw_ops` lists the ops compiled into TensorFlow itself; an op a library loads at run
    time (tensorflow-text's, `tf.load_op_library`) is not in it, and a TF Serving binary
    without that library refuses the SavedModel ("Op type not registered").
    """
    import tensorflow as tf

    return sorted(op for op in op_types if not hasattr(tf.raw_ops, op))
