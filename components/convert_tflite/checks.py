"""Post-conversion checks: run each .tflite on the test split and compare with the SavedModel.

Every variant is run through its `serving_default` signature (input/output tensors found by
name, never by index), with int8 I/O quantized/dequantized from the tensors' own
(scale, zero_point). Latency is `invoke()` alone on one image after a warm-up, as TFLite's
benchmark_model measures it; throughput is whole batches including set/get.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.errors import ConversionError, ModelLoadError
from ampflow.progress import Progress
from ampflow.serving.model_format import (
    CLASS_IDS_OUTPUT,
    DEFAULT_SIGNATURE,
    PROBABILITIES_OUTPUT,
)

PROBABILITIES = PROBABILITIES_OUTPUT
CLASS_IDS = CLASS_IDS_OUTPUT


@dataclass(frozen=True)
class Timing:
    """Single-image latency and batch throughput measured on this machine."""

    latency_ms_median: float
    latency_ms_p95: float
    latency_runs: int
    throughput_images_per_sec: float
    batch_size: int


class SavedModelReference:
    """The SavedModel signature every variant is compared with."""

    def __init__(self, saved_model_dir: str | os.PathLike, signature_key: str):
        import tensorflow as tf

        try:
            loaded = tf.saved_model.load(os.fspath(saved_model_dir))
        except Exception as e:
            raise ModelLoadError(f"{saved_model_dir} is not a loadable SavedModel: {e}") from e
        if signature_key not in loaded.signatures:
            raise ModelLoadError(
                f"signature_key must name a signature of the SavedModel {sorted(loaded.signatures)}"
                f". Received: signature_key={signature_key!r}"
            )
        self.loaded = loaded  # keeps the variables alive; the converter reuses it
        self._fn = loaded.signatures[signature_key]
        inputs = self._fn.structured_input_signature[1]
        if len(inputs) != 1:
            raise ModelLoadError(f"the {signature_key!r} signature must take one image input. "
                                 f"Received: inputs={sorted(inputs)}")
        (self.input_name, spec), = inputs.items()
        if spec.dtype != tf.float32 or spec.shape.rank != 4:
            raise ModelLoadError(
                f"the {signature_key!r} signature input must be float32 [batch, H, W, C] "
                f"(docs/ARTIFACTS.md). Received: {self.input_name} {spec.dtype.name} "
                f"{spec.shape.as_list()}"
            )
        if PROBABILITIES not in self._fn.structured_outputs:
            raise ModelLoadError(f"the {signature_key!r} signature must return "
                                 f"{PROBABILITIES!r}. Received: outputs="
                                 f"{sorted(self._fn.structured_outputs)}")
        self.input_shape = tuple(spec.shape.as_list()[1:])

    def predict(self, images: np.ndarray, batch_size: int, desc: str | None = None) -> np.ndarray:
        """Probabilities [N, num_classes] for float32 images, in batches (`desc`: shown)."""
        import tensorflow as tf

        out = []
        with Progress(len(images), desc or "", unit="example", enabled=bool(desc)) as progress:
            for start in range(0, len(images), batch_size):
                batch = tf.constant(images[start : start + batch_size], tf.float32)
                out.append(self._fn(**{self.input_name: batch})[PROBABILITIES].numpy())
                progress.update(len(batch))
        return np.concatenate(out)

    def time(self, images: np.ndarray, *, runs: int, warmup: int, batch_size: int) -> Timing:
        """The same timing as for the TFLite variants, for the report's reference row."""
        import tensorflow as tf

        one = tf.constant(images[:1], tf.float32)
        return _time(lambda: self._fn(**{self.input_name: one}),
                     lambda some: self.predict(some, batch_size), images,
                     runs=runs, warmup=warmup, batch_size=batch_size)


class TFLiteRunner:
    """One .tflite model in an interpreter: `tflite` (tf.lite) or `litert` (ai-edge-litert)."""

    def __init__(self, model_path: str | os.PathLike, *, runtime: str = "tflite",
                 signature_key: str = DEFAULT_SIGNATURE, num_threads: int | None = None):
        self.runtime = runtime
        self._interpreter = _make_interpreter(Path(model_path), runtime, num_threads)
        signatures = self._interpreter.get_signature_list()
        if signature_key not in signatures:
            raise ConversionError(f"{model_path} must carry the signature {signature_key!r}. "
                                  f"Received: signatures={sorted(signatures)}")
        runner = self._interpreter.get_signature_runner(signature_key)
        ((self.input_key, self.input_detail),) = runner.get_input_details().items()
        self.output_details = runner.get_output_details()
        self._batch = None

    def predict(self, images: np.ndarray, batch_size: int,
                desc: str | None = None) -> dict[str, np.ndarray]:
        """Float probabilities and class ids for float32 images (int8 I/O handled here).

        With `desc`, the examples checked are shown as progress (`ampflow.progress`).
        """
        probs, ids = [], []
        with Progress(len(images), desc or "", unit="example", enabled=bool(desc)) as progress:
            for start in range(0, len(images), batch_size):
                out = self._run(images[start : start + batch_size])
                probs.append(out[PROBABILITIES])
                ids.append(out.get(CLASS_IDS, np.argmax(out[PROBABILITIES], axis=-1)))
                progress.update(len(probs[-1]))
        return {PROBABILITIES: np.concatenate(probs), CLASS_IDS: np.concatenate(ids)}

    def time(self, images: np.ndarray, *, runs: int, warmup: int, batch_size: int) -> Timing:
        """Median/p95 of `invoke()` on one image, then batch throughput over `images`."""
        self._set_input(images[:1])
        return _time(self._interpreter.invoke, lambda some: self.predict(some, batch_size),
                     images, runs=runs, warmup=warmup, batch_size=batch_size)

    def tensor_dtypes(self) -> dict[str, int]:
        """How many tensors of each dtype the model holds (proves what was quantized)."""
        counts: dict[str, int] = {}
        for detail in self._interpreter.get_tensor_details():
            name = np.dtype(detail["dtype"]).name
            counts[name] = counts.get(name, 0) + 1
        return dict(sorted(counts.items()))

    def io_details(self) -> dict[str, Any]:
        """Input/output names, shapes, dtypes and quantization, for the variant's JSON."""
        return {
            "inputs": {self.input_key: _describe(self.input_detail)},
            "outputs": {k: _describe(v) for k, v in sorted(self.output_details.items())},
        }

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        self._set_input(batch)
        self._interpreter.invoke()
        return {key: _dequantize(self._interpreter.get_tensor(d["index"]), d)
                for key, d in self.output_details.items()}

    def _set_input(self, batch: np.ndarray) -> None:
        detail = self.input_detail
        if self._batch != len(batch):
            self._interpreter.resize_tensor_input(detail["index"], [len(batch), *batch.shape[1:]])
            self._interpreter.allocate_tensors()
            self._batch = len(batch)
        self._interpreter.set_tensor(detail["index"], quantize_input(batch, detail))


def quantize_input(images: np.ndarray, detail: dict) -> np.ndarray:
    """Inputs → the input tensor's dtype: q = round(x / scale) + zero_point, clipped.

    An integer input without a scale (a text model's int32 token ids) is only cast.
    """
    dtype = np.dtype(detail["dtype"])
    scale, zero_point = detail["quantization"]
    if not np.issubdtype(dtype, np.integer) or not scale:  # float, or ids (no scale)
        return images.astype(dtype)
    info = np.iinfo(dtype)
    q = np.round(images.astype(np.float32) / scale) + zero_point
    return np.clip(q, info.min, info.max).astype(dtype)


def _dequantize(values: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero_point = detail["quantization"]
    if scale and np.dtype(detail["dtype"]) in (np.int8, np.uint8, np.int16):
        return ((values.astype(np.float32) - zero_point) * scale).astype(np.float32)
    return values


def _describe(detail: dict) -> dict[str, Any]:
    scale, zero_point = detail["quantization"]
    return {
        "tensor_name": detail["name"],
        "dtype": np.dtype(detail["dtype"]).name,
        "shape": [int(d) for d in detail.get("shape_signature", detail["shape"])],
        "quantization": {"scale": float(scale), "zero_point": int(zero_point)} if scale else None,
    }


def _make_interpreter(model_path: Path, runtime: str, num_threads: int | None):
    import tensorflow as tf

    # tf.lite.Interpreter is deprecated in favour of LiteRT; where a TF release has dropped it,
    # the checks run in LiteRT (and the edge check then compares LiteRT with itself).
    Interpreter = getattr(tf.lite, "Interpreter", None)  # noqa: N806 - a class
    if runtime == "litert" or Interpreter is None:
        from ai_edge_litert.interpreter import Interpreter  # noqa: N806
    try:
        with warnings.catch_warnings():  # tf.lite.Interpreter warns that LiteRT replaces it
            warnings.simplefilter("ignore", UserWarning)
            interpreter = Interpreter(model_path=os.fspath(model_path), num_threads=num_threads)
        interpreter.allocate_tensors()
    except (ValueError, RuntimeError) as e:
        raise ConversionError(f"{model_path} does not load in the {runtime} interpreter: "
                              f"{e}") from e
    return interpreter


def _time(one, predict, images, *, runs: int, warmup: int, batch_size: int) -> Timing:
    """`one()`'s latency over `runs` calls after `warmup`, then `predict`'s throughput.

    The timed pass is `predict(images)`, whole batches; its warm-up runs each batch shape once
    (the last, shorter batch, then one whole batch, the shape the pass starts with) instead of
    a whole untimed pass: the checks have just run every image, and that pass cost as much as
    the timed one (a fourth of a variant's checks).
    """
    for _ in range(warmup):
        one()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        one()
        samples.append(time.perf_counter() - start)
    for shape in _batch_shapes(len(images), batch_size):  # warm-up: allocates each shape
        predict(images[shape])
    start = time.perf_counter()
    predict(images)
    seconds = time.perf_counter() - start
    ms = np.asarray(samples) * 1e3
    return Timing(
        latency_ms_median=float(np.median(ms)),
        latency_ms_p95=float(np.percentile(ms, 95)),
        latency_runs=runs,
        throughput_images_per_sec=float(len(images) / seconds),
        batch_size=batch_size,
    )


def _batch_shapes(n_images: int, batch_size: int) -> list[slice]:
    """One batch of each size a pass over `n_images` runs, the first batch's size last."""
    shorter = n_images % batch_size
    if n_images <= batch_size or not shorter:
        return [slice(0, min(n_images, batch_size))]
    return [slice(n_images - shorter, n_images), slice(0, batch_size)]


def litert_available() -> str | None:
    """None if `ai_edge_litert` imports here, else why not (the report says it)."""
    try:
        from ai_edge_litert.interpreter import Interpreter  # noqa: F401
    except Exception as e:  # ImportError, or a native-library load failure
        return f"ai-edge-litert is not usable here: {type(e).__name__}: {e}"
    return None
