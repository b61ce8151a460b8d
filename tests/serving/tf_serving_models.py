"""TF Serving's test models, built the way its export scripts build them.

`write_half_plus_two` follows the native TF2 branch of TF Serving's
`servables/tensorflow/testdata/saved_model_half_plus_two.py` (a `tf.Module` with the same
variables and signatures; written here, not copied): y = 0.5 * x + 2 (`c` = 3 for the `y2`/`x2`
variants), its Predict signature declaring `x` as `[-1, 1]`, as the TF1 export of the same
script does. TF2 saves every signature with method name `tensorflow/serving/predict`, which is
what TF Serving's `--enable_signature_method_name_check=false` (its default) is for.
"""

from __future__ import annotations

from pathlib import Path


def _feature_spec():
    import tensorflow as tf

    return {"x": tf.io.FixedLenFeature([1], dtype=tf.float32)}


def write_half_plus_two(export_dir: Path) -> Path:
    """The native TF2 half_plus_two SavedModel in `export_dir`; returns it."""
    import tensorflow as tf

    class HalfPlusTwo(tf.Module):
        def __init__(self):
            self.a = tf.Variable(0.5, name="a")
            self.b = tf.Variable(2.0, name="b")
            self.c = tf.Variable(3.0, name="c")

        def compute(self, x, inc):
            return tf.add(tf.multiply(self.a, x), inc)

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def predict(self, x):
            return {"y": self.compute(x, self.b)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress_xy(self, serialized):
            x = tf.io.parse_example(serialized, _feature_spec())["x"]
            return {"outputs": self.compute(x, self.b)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress_xy2(self, serialized):
            x = tf.io.parse_example(serialized, _feature_spec())["x"]
            return {"outputs": self.compute(x, self.c)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify_xy(self, serialized):
            x = tf.io.parse_example(serialized, _feature_spec())["x"]
            return {"scores": self.compute(x, self.b)}

    model = HalfPlusTwo()
    tf.saved_model.save(model, str(export_dir), signatures={
        "serving_default": model.predict,
        "regress_x_to_y": model.regress_xy,
        "regress_x_to_y2": model.regress_xy2,
        "classify_x_to_y": model.classify_xy,
    })
    return export_dir


def write_complex_output(export_dir: Path) -> Path:
    """A SavedModel whose one output is complex64, which JSON cannot carry."""
    import tensorflow as tf

    class ComplexOut(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"z": tf.complex(x, x)}

    model = ComplexOut()
    tf.saved_model.save(model, str(export_dir), signatures={"serving_default": model.serve})
    return export_dir


def half_plus_two_tflite(with_signature_def: bool = False) -> bytes:
    """half_plus_two as TF Serving's export script writes `saved_model_half_plus_two_tflite`.

    The TF1 branch of its script: a session graph parsing tf.Examples, `x` pinned to (1, 1) by
    `ensure_shape` (the v1 converter takes no unknown shape), y = 0.5 * x + 2, converted by
    the real `TFLiteConverter.from_session`: a flatbuffer with no SignatureDefs, tensors named
    `x` and `y`. `with_signature_def`: the `_with_sigdef` variant, its input tensor named
    `tflite_input` and a Predict SignatureDef (`x` -> `tflite_input:0`, `y` -> `y:0`) stored in
    the model's `signature_defs_metadata`, as TFLite's `signature_def_utils` stores it.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as sess:
        a, b = v1.Variable(0.5, name="a"), v1.Variable(2.0, name="b")
        serialized = v1.placeholder(tf.string, name="tf_example", shape=[None])
        x = v1.parse_example(serialized, _feature_spec())["x"]
        x = tf.ensure_shape(x, (1, 1), name="tflite_input" if with_signature_def else "x")
        y = tf.identity(tf.add(tf.multiply(a, x), b), name="y")
        sess.run(v1.global_variables_initializer())
        model = v1.lite.TFLiteConverter.from_session(sess, [x], [y]).convert()
        signature = v1.saved_model.predict_signature_def({"x": x}, {"y": y})
    if with_signature_def:
        model = with_signature_defs_metadata(model, {"serving_default": signature})
    return model


def with_signature_defs_metadata(model: bytes, signature_defs: dict) -> bytes:
    """`model` with `signature_defs` in its `signature_defs_metadata` entry.

    What TFLite's C++ `SetSignatureDefMap` writes: a metadata entry of that name whose buffer
    is a FlexBuffer map of signature key -> serialized SignatureDef (a FlexBuffer string).
    """
    from flatbuffers import flexbuffers
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    builder = flexbuffers.Builder()
    with builder.Map():
        for key, signature in signature_defs.items():
            builder.Key(key)
            # these protos are ASCII (names, small sizes), so a FlexBuffer string holds them
            builder.String(signature.SerializeToString().decode("ascii"))
    buffer = schema.BufferT()
    buffer.data = list(builder.Finish())
    model_t = flatbuffer_utils.read_model_from_bytearray(model)
    model_t.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = "signature_defs_metadata", len(model_t.buffers) - 1
    model_t.metadata = [*(model_t.metadata or []), entry]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model_t))


def matmul_tflite() -> bytes:
    """A TF1-session TFLite model with no SignatureDefs whose graph takes one shape only.

    y = x @ w with x (1, 4) and w (4, 2): an `x` of 3 columns cannot be multiplied.
    """
    import numpy as np
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as sess:
        x = v1.placeholder(tf.float32, name="x", shape=[1, 4])
        w = v1.Variable(np.arange(8, dtype=np.float32).reshape(4, 2), name="w")
        y = tf.identity(tf.matmul(x, w), name="y")
        sess.run(v1.global_variables_initializer())
        return v1.lite.TFLiteConverter.from_session(sess, [x], [y]).convert()


def write_half_plus_two_tf1(export_dir: Path) -> Path:
    """The TF1 half_plus_two of TF Serving's export script (`saved_model_half_plus_two_cpu`).

    Its TF1 branch, written here: a session graph parsing tf.Examples fed to `tf_example` (a
    string placeholder of unknown shape, as in the metadata TF Serving's tests expect), `x`
    and `x2` features, y = 0.5 * x + 2, y2 = 0.5 * x + 3, y3 = 0.5 * x2 + 3, saved with
    `SavedModelBuilder` and five SignatureDefs with TF1's method names (its SignatureDefs
    agree with the graph; `write_half_plus_three_tf1` is the one whose do not).
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    utils, sig_utils = v1.saved_model.utils, v1.saved_model.signature_def_utils
    consts = v1.saved_model.signature_constants
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as sess:
        a, b_var, c = (v1.Variable(v, name=n) for v, n in ((0.5, "a"), (2.0, "b"), (3.0, "c")))
        serialized = v1.placeholder(tf.string, name="tf_example")
        parsed = v1.parse_example(tf.reshape(serialized, [-1]), {
            "x": v1.FixedLenFeature([1], dtype=tf.float32),
            "x2": v1.FixedLenFeature([1], dtype=tf.float32, default_value=[0.0])})
        x = tf.identity(parsed["x"], name="x")
        y = tf.identity(tf.add(tf.multiply(a, x), b_var), name="y")
        y2 = tf.identity(tf.add(tf.multiply(a, x), c), name="y2")
        x2 = tf.identity(parsed["x2"], name="x2")
        a2, c2 = v1.Variable(0.5, name="a2"), v1.Variable(3.0, name="c2")
        y3 = tf.identity(tf.add(tf.multiply(a2, x2), c2), name="y3")

        def signature(inputs, outputs, method):
            return sig_utils.build_signature_def(
                {k: utils.build_tensor_info(t) for k, t in inputs.items()},
                {k: utils.build_tensor_info(t) for k, t in outputs.items()}, method)

        regress = consts.REGRESS_METHOD_NAME
        signatures = {
            "regress_x_to_y": signature({"inputs": serialized}, {"outputs": y}, regress),
            "regress_x_to_y2": signature({"inputs": serialized}, {"outputs": y2}, regress),
            "regress_x2_to_y3": signature({"inputs": x2}, {"outputs": y3}, regress),
            "classify_x_to_y": signature({"inputs": serialized}, {"scores": y},
                                         consts.CLASSIFY_METHOD_NAME),
            "serving_default": signature({"x": x}, {"y": y}, consts.PREDICT_METHOD_NAME),
        }
        sess.run(v1.global_variables_initializer())
        builder = v1.saved_model.builder.SavedModelBuilder(str(export_dir))
        builder.add_meta_graph_and_variables(sess, [v1.saved_model.tag_constants.SERVING],
                                             signature_def_map=signatures)
        builder.save()
    return export_dir


def write_half_plus_three_tf1(export_dir: Path) -> Path:
    """TF Serving's `saved_model_half_plus_three` testdata, as TF 1.0 wrote it (not copied).

    What its `00000123/saved_model.pb` holds (read from the file): a session graph of TF
    1.0's ops, `tf_example` (a string placeholder) parsed by the rank-1 `ParseExample` into
    `x` ([-1, 1]), y = 0.5 * x + 3 and its copy `Identity`, `x2` (a float placeholder)
    -> y2 = 0.5 * x2 + 3; two SignatureDefs whose TensorInfos carry a name and a dtype but no
    shape, as TF 1.0's `build_tensor_info` wrote them: `serving_default` (Predict, x -> y) and
    `tensorflow/serving/regress` (Regress, `inputs` -> `outputs`), whose `inputs` says
    DT_FLOAT for the string `tf_example`. An absent shape reads as a scalar, which `y`'s
    [-1, 1] contradicts: `tf.saved_model.load` refuses the model, TF Serving serves it. The
    GraphDef is stamped as TF 1.0 stamped it too: producer 21, where a placeholder's empty
    `shape {}` means "unknown" (a scalar from producer 22 on).
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as sess:
        a, b, c = (v1.Variable(v, name=n) for v, n in ((0.5, "a"), (3.0, "b"), (3.0, "c")))
        serialized = v1.placeholder(tf.string, name="tf_example")
        parsed = tf.raw_ops.ParseExample(  # TF 1.0's op: `serialized` must be a vector
            serialized=serialized, names=tf.constant([], tf.string), sparse_keys=[],
            dense_keys=[tf.constant("x")], dense_defaults=[tf.constant([], tf.float32)],
            sparse_types=[], dense_shapes=[[1]])
        x = tf.identity(parsed.dense_values[0], name="x")
        y = tf.add(tf.multiply(a, x), b, name="y")
        x2 = v1.placeholder(tf.float32, name="x2")
        tf.add(tf.multiply(a, x2), c, name="y2")

        def info(tensor, dtype=None):  # name and dtype only, as TF 1.0 wrote a TensorInfo
            written = v1.saved_model.utils.build_tensor_info(tensor)
            written.ClearField("tensor_shape")
            written.dtype = (dtype or tensor.dtype).as_datatype_enum
            return written

        build = v1.saved_model.signature_def_utils.build_signature_def
        signatures = {
            "serving_default": build({"x": info(x)}, {"y": info(y)},
                                     "tensorflow/serving/predict"),
            "tensorflow/serving/regress": build({"inputs": info(serialized, tf.float32)},
                                                {"outputs": info(tf.identity(y))},
                                                "tensorflow/serving/regress"),
        }
        sess.run(v1.global_variables_initializer())
        builder = v1.saved_model.builder.SavedModelBuilder(str(export_dir))
        builder.add_meta_graph_and_variables(sess, [v1.saved_model.tag_constants.SERVING],
                                             signature_def_map=signatures)
        builder.save()
    path = Path(export_dir) / "saved_model.pb"
    saved_model = saved_model_pb2.SavedModel.FromString(path.read_bytes())
    graph_def = saved_model.meta_graphs[0].graph_def
    graph_def.versions.producer = 21
    for node in graph_def.node:
        if node.op == "Placeholder":
            node.attr["shape"].shape.Clear()
    path.write_bytes(saved_model.SerializeToString())
    return Path(export_dir)


# upstream's tf_text_regression (tensorflow/text's oss_scripts/model_server/save_models.py),
# small and written here: y = x + 1 once a TF Text tokenizer ran (upstream checks 18 TF Text
# ops that way), and a `tokens` signature whose outputs are the tokenizer's. It runs in a fresh
# process that imports tensorflow_text, which prints what the model answers there (JSON), so
# the process that serves it need not have imported tensorflow_text itself.
_TF_TEXT_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text as tft


class TfTextRegression(tf.Module):
    def __init__(self):
        super().__init__()
        self.tokenizer = tft.WhitespaceTokenizer()

    @tf.function(input_signature=[tf.TensorSpec([1], tf.float32, name="x")])
    def regression(self, x):
        words = self.tokenizer.tokenize(["I like pie."])
        check = tf.debugging.assert_equal(words.row_lengths(), tf.constant([3], tf.int64))
        with tf.control_dependencies([check]):
            return {"y": tf.add(x, [1.0])}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def tokens(self, text):
        words = self.tokenizer.tokenize(text)
        return {"num_tokens": words.row_lengths(), "tokens": words.to_tensor(default_value="")}


module = TfTextRegression()
tf.saved_model.save(module, sys.argv[1], signatures={
    "serving_default": module.regression.get_concrete_function(),
    "tokens": module.tokens.get_concrete_function()})
answer = module.tokens(tf.constant(json.loads(sys.argv[2])))
print(json.dumps({"num_tokens": answer["num_tokens"].numpy().tolist(),
                  "tokens": [[t.decode() for t in row] for row in answer["tokens"].numpy()]}))
"""


def write_tf_text_regression(export_dir: Path, texts: list[str]) -> dict:
    """Save the TF Text model at `export_dir` from a fresh process that imports tensorflow_text;
    what its `tokens` signature answers there for `texts` ({"num_tokens", "tokens"})."""
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TF_TEXT_SCRIPT, str(export_dir),
                           json.dumps(texts)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
