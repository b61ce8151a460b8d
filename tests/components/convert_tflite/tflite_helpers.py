"""Helpers for the convert tests (a unique module name: every test folder shares sys.path)."""

from __future__ import annotations

from pathlib import Path


def save_contract_savedmodel(model, version_dir: Path, labels: list[str]) -> Path:
    """Save `model` with the contract's serving_default signature and assets/labels.txt."""
    import tensorflow as tf

    h, w, c = model.input_shape[1:]

    class Servable(tf.Module):
        def __init__(self):
            super().__init__()
            self.model_variables = [v.value for v in model.variables]  # tf.Variables, frozen

        @tf.function(input_signature=[tf.TensorSpec([None, h, w, c], tf.float32, "images")])
        def serve(self, images):
            probabilities = tf.cast(model(images, training=False), tf.float32)
            return {"probabilities": probabilities,
                    "class_ids": tf.argmax(probabilities, axis=-1, output_type=tf.int64)}

    servable = Servable()
    tf.saved_model.save(servable, str(version_dir), signatures={"serving_default": servable.serve})
    (version_dir / "assets").mkdir(exist_ok=True)
    (version_dir / "assets" / "labels.txt").write_text("\n".join(labels) + "\n")
    return version_dir
