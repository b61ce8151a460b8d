"""One loaded model version: its SignatureDefs (protos, for metadata) and its callable signatures.

TF Serving's `SavedModelBundle`: the SignatureDefs come from `saved_model.pb` itself (what
GetModelMetadata returns), the functions from `tf.saved_model.load` (what a request runs).
"""

from __future__ import annotations

from pathlib import Path

from ampflow.errors import ModelLoadError
from ampflow.serving.model_format import SERVE_TAG, serving_signature_defs

INIT_OP_SIGNATURE = "__saved_model_init_op"
# --model-format: what a version dir holds (auto: saved_model.pb, else one .tflite file)
MODEL_FORMATS = ("auto", "saved_model", "tflite")


def load_servable(model: str, version: int, path: Path, model_format: str = "auto"):
    """Load one version dir as a SavedModel or a TFLite flatbuffer (tflite_servable.py)."""
    from ampflow.serving.tflite_servable import TFLiteServable, detect_format

    chosen = detect_format(path) if model_format == "auto" else model_format
    if chosen == "tflite":
        return TFLiteServable(model, version, path)
    return ServableVersion(model, version, path)


class ServableVersion:
    """One loaded SavedModel version: its signature defs (protos) and callable signatures."""

    platform = "tensorflow_savedmodel"  # what V2 model metadata calls this format

    def __init__(self, model: str, version: int, path: Path) -> None:
        import tensorflow as tf  # heavy: imported where a model is actually loaded

        self.model = model
        self.version = version
        self.path = path
        self.signature_defs = serving_signature_defs(path)
        self._loaded = tf.saved_model.load(str(path), tags=[SERVE_TAG])
        self._functions = dict(self._loaded.signatures)
        # TF Serving lists the init op in metadata too, but it is not a signature to call.
        missing = set(self.signature_defs) - set(self._functions) - {INIT_OP_SIGNATURE}
        if missing:
            raise ModelLoadError(f"signatures {sorted(missing)} are in saved_model.pb but not "
                                 "loadable")

    def can_run(self, signature: str) -> bool:
        """Whether `signature` can be run (the init-op SignatureDef cannot)."""
        return signature in self._functions

    def run(self, signature: str, inputs: dict) -> dict:
        """Run `signature` on numpy/tensor `inputs` keyed by signature input names."""
        outputs = self._functions[signature](**inputs)
        return {key: value.numpy() for key, value in outputs.items()}
