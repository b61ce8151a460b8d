"""What the deploy tests share: the tiny real SavedModel in the export layout, and a free port.

A plain module named for what it holds (tests import it; conftest.py holds only fixtures, and a
test importing `conftest` gets whichever conftest.py was imported first in a multi-dir run).

The SavedModel here is our own: a seeded `tf.Module` with the contract's `serving_default`
signature (`images` float32 [-1,8,8,1] -> `probabilities` float32 [-1,10], `class_ids` int64
[-1]) and, as export writes it, the recorded answers to a few images (ampflow_canary.npz). Each
version has other weights, so a test can tell from a prediction which version answered.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ports import free_port  # noqa: F401 - the deploy tests import it from here

from ampflow.artifacts.canary_examples import write_canary_examples
from ampflow.serving.model_format import CLASS_IDS_OUTPUT, DEFAULT_SIGNATURE, PROBABILITIES_OUTPUT

MODEL_NAME = "digits"


def write_saved_model(path: Path, seed: int) -> Path:
    """Save a tiny 8x8x1 -> 10 classifier with seeded weights to `path`."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    class Tiny(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernel = tf.Variable(rng.normal(0, 0.05, (64, 10)).astype(np.float32))
            self.bias = tf.Variable(rng.normal(0, 1.0, (10,)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, "images")])
        def serve(self, images):
            logits = tf.matmul(tf.reshape(images / 255.0, [-1, 64]), self.kernel) + self.bias
            probabilities = tf.nn.softmax(logits)
            class_ids = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
            return {PROBABILITIES_OUTPUT: probabilities, CLASS_IDS_OUTPUT: class_ids}

    module = Tiny()
    tf.saved_model.save(module, str(path), signatures={DEFAULT_SIGNATURE: module.serve})
    # the answers export would record (real-looking images: the model's own outputs)
    images = np.random.default_rng(100 + seed).uniform(0, 255, (6, 8, 8, 1))
    write_canary_examples(path, tf.saved_model.load(str(path)), images)
    return path


