"""One model version held as a TFLite flatbuffer, served like a SavedModel version.

A version dir holding one `.tflite` file (any of the converter's variants: float32, float16,
dynamic_range, full_int8, with float or int8 input/output) is run by LiteRT's interpreter
(`ai_edge_litert`, else `tf.lite`), through the signatures the converter kept
(`serving_default`); a model with none gets those TF Serving builds (tflite_tensors.py).
Clients see the SavedModel's contract: a quantized input or output (int8, uint8, int16 with a
scale) is described as float32 in the SignatureDefs that metadata returns, requests are
quantized with the model's own scale and zero point (q = round(x / scale) + zp, clipped), and
outputs dequantized ((q - zp) * scale), so Predict, V2 infer, REST and warm-up go through
`InferenceCore` exactly as for a SavedModel. An interpreter is not thread-safe: calls are
serialized per version (server-side batching still merges concurrent requests first).
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import numpy as np

from ampflow.errors import ModelLoadError
from ampflow.serving.model_format import PREDICT_METHOD, SAVED_MODEL_PB
from ampflow.serving.models.tflite_tensors import TensorRunner, tensor_signatures

TFLITE_SUFFIX = ".tflite"
_QUANTIZED = (np.int8, np.uint8, np.int16)


def _tflite_files(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir()
                      if p.suffix == TFLITE_SUFFIX and p.is_file() and not p.name.startswith("."))
    except OSError:
        return []


def tflite_file(path: Path) -> Path | None:
    """The one `.tflite` file of a version dir (None: there is none; several: an error)."""
    found = _tflite_files(path)
    if len(found) > 1:
        raise ModelLoadError(f"a TFLite version dir must hold one .tflite file. Received: "
                             f"{[p.name for p in found]}")
    return found[0] if found else None


def detect_format(path: Path, prefer_tflite: bool = False) -> str:
    """`saved_model` when the dir has saved_model.pb, else `tflite` when it has .tflite files.

    `prefer_tflite` (TF Serving's --prefer_tflite_model): `tflite` whenever it has one.
    """
    if (path / SAVED_MODEL_PB).exists() and not (prefer_tflite and _tflite_files(path)):
        return "saved_model"
    return "tflite" if _tflite_files(path) else "saved_model"


class TFLiteServable:
    """A loaded TFLite version: a `servable.Servable`, run by LiteRT's interpreter."""

    platform = "tflite"  # what V2 model metadata calls this format
    model_format = "tflite"
    token_cost = None  # token ids at a fixed length: the row and byte limits bound them

    def __init__(self, model: str, version: int, path: Path) -> None:
        self.model = model
        self.version = version
        self.path = path
        file = tflite_file(path)
        if file is None:
            raise ModelLoadError(f"no .tflite file in the version dir (model {model} version "
                                 f"{version})")
        self.runtime, self._interpreter = _interpreter(file)
        self._lock = threading.Lock()
        self._runners, self._details, self.signature_defs = {}, {}, {}
        for key in self._interpreter.get_signature_list():
            runner = self._interpreter.get_signature_runner(key)
            inputs, outputs = runner.get_input_details(), runner.get_output_details()
            self._runners[key] = runner
            self._details[key] = (inputs, outputs)
            self.signature_defs[key] = _signature_def(inputs, outputs)
        if not self._runners:  # a TF1-session conversion: TF Serving's signatures instead
            for key, (inputs, outputs, sig) in tensor_signatures(self._interpreter, file).items():
                self._runners[key] = TensorRunner(self._interpreter, inputs, outputs)
                self._details[key] = (inputs, outputs)
                self.signature_defs[key] = sig or _signature_def(inputs, outputs)
        self.metadata_signature_defs = self.signature_defs

    def can_run(self, signature: str) -> bool:
        """Whether the flatbuffer carries `signature`."""
        return signature in self._runners

    def run(self, signature: str, inputs: dict) -> dict:
        """Quantize inputs by the model's parameters, invoke, dequantize the outputs."""
        input_details, output_details = self._details[signature]
        feed = {key: _quantize(np.asarray(value), input_details[key])
                for key, value in inputs.items()}
        with self._lock:
            outputs = self._runners[signature](**feed)
            return {key: _dequantize(np.array(value), output_details[key])
                    for key, value in outputs.items()}


def _interpreter(file: Path):
    """LiteRT's interpreter when it imports, else tf.lite's; tensors allocated."""
    try:
        from ai_edge_litert.interpreter import Interpreter
        runtime = "litert"
    except Exception:  # ImportError, or a native library that does not load here
        import tensorflow as tf

        Interpreter, runtime = tf.lite.Interpreter, "tflite"  # noqa: N806 - a class
    try:
        with warnings.catch_warnings():  # tf.lite.Interpreter warns that LiteRT replaces it
            warnings.simplefilter("ignore", UserWarning)
            interpreter = Interpreter(model_path=os.fspath(file))
        interpreter.allocate_tensors()
    except (ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{file.name} does not load in the {runtime} interpreter: {e}") \
            from e
    return runtime, interpreter


def _is_quantized(detail: dict) -> bool:
    scale, _zero_point = detail["quantization"]
    return bool(scale) and np.dtype(detail["dtype"]) in _QUANTIZED


def _signature_def(inputs: dict, outputs: dict):
    """The SignatureDef clients see: quantized tensors as float32, -1 for a dynamic size."""
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    sig = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
    for target, details in ((sig.inputs, inputs), (sig.outputs, outputs)):
        for key, detail in details.items():
            info = target[key]
            info.name = detail["name"]
            dtype = np.float32 if _is_quantized(detail) else detail["dtype"]
            info.dtype = tf.as_dtype(dtype).as_datatype_enum
            shape = detail.get("shape_signature", detail["shape"])
            for size in shape:
                info.tensor_shape.dim.add(size=int(size))
    return sig


def _quantize(values: np.ndarray, detail: dict) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if not _is_quantized(detail):
        return values.astype(dtype, copy=False)
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    q = np.round(values.astype(np.float32) / scale) + zero_point
    return np.clip(q, info.min, info.max).astype(dtype)


def _dequantize(values: np.ndarray, detail: dict) -> np.ndarray:
    if not _is_quantized(detail):
        return values
    scale, zero_point = detail["quantization"]
    return ((values.astype(np.float32) - zero_point) * scale).astype(np.float32)
