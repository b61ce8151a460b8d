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
