"""The four TFLite variants and how each is converted from a SavedModel signature.

| variant        | weights | activations | why                                                  |
|----------------|---------|-------------|------------------------------------------------------|
| float32        | float32 | float32     | the reference: same numbers as the SavedModel        |
| float16        | float16 | float32     | ~2x smaller; GPU delegates run it natively in fp16   |
| dynamic_range  | int8    | float32     | ~4x smaller, no calibration data needed              |
| full_int8      | int8    | int8        | ~4x smaller, integer-only kernels (NPUs, MCUs, DSPs) |

full_int8 is calibrated with a representative dataset (raw training images, as the model takes
them); with `int8_io` its input and output tensors are int8 too, and callers quantize with the
input tensor's (scale, zero_point) and dequantize the outputs (see each variant's JSON).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ampflow.artifacts.tflite_variants import VARIANTS
from ampflow.components.convert_tflite.explain import explain_conversion_error
from ampflow.errors import ConfigError, ModelLoadError
from ampflow.serving.model_format import DEFAULT_SIGNATURE

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class VariantSpec:
    """What a variant stores, written into its metadata JSON."""

    name: str
    weights: str
    activations: str
    description: str


SPECS: dict[str, VariantSpec] = {
    "float32": VariantSpec("float32", "float32", "float32", "No quantization."),
    "float16": VariantSpec("float16", "float16", "float32",
                           "float16 weights, dequantized to float32 at load time on CPUs."),
    "dynamic_range": VariantSpec("dynamic_range", "int8", "float32",
                                 "int8 weights; activations quantized on the fly per op."),
    "full_int8": VariantSpec("full_int8", "int8", "int8",
                             "int8 weights and activations, calibrated on a representative "
                             "dataset from the training split."),
}


def convert_variant(
    saved_model_dir: str | os.PathLike,
    variant: str,
    *,
    signature_key: str = DEFAULT_SIGNATURE,
    representative: np.ndarray | None = None,
    int8_io: bool = False,
    input_shape: tuple[int, ...] | None = None,
) -> bytes:
    """Convert one signature of a SavedModel to `variant`; return the flatbuffer bytes.

    `representative` (float32-castable images [N, H, W, C], raw pixels as the model takes them)
    is required for full_int8 and must match `input_shape` (the signature's, without batch; read
    from the SavedModel when not given): a conv net would calibrate on other image sizes without
    complaint and get the wrong ranges.
    Converter failures come back as an explained `ConversionError`. To convert one SavedModel
    to several variants, `SavedModelConverter` loads it once for all of them.
    """
    return SavedModelConverter(saved_model_dir, signature_key).convert(
        variant, representative=representative, int8_io=int8_io, input_shape=input_shape)


class SavedModelConverter:
    """One SavedModel signature, converted to any variant; the SavedModel is loaded once.

    `tf.lite.TFLiteConverter.from_saved_model` loads the whole SavedModel (functions and
    variables) only to check the signature key, and every `convert()` loads it once more only
    to read its debug info, so four variants from four converters loaded it eight times. Here
    the converter is built once and each variant converts with a deep copy of it (an unused
    converter holds only its settings and the SavedModel's path), and every load TensorFlow's
    converter asks for is answered with one loaded SavedModel (`loaded`, e.g. the one the
    checks already hold, or loaded here at the first variant): no load per variant, the same
    bytes (tests/components/convert_tflite). What is left per variant is the converter's own
    C++ import of the SavedModel and its passes, which no public API shares. Measured on
    ResNet-50 at 32×32 (2-core Xeon): the loads were ~1.3 CPU-s of each variant's ~7.
    """

    def __init__(self, saved_model_dir: str | os.PathLike,
                 signature_key: str = DEFAULT_SIGNATURE, *, loaded: Any = None) -> None:
        self.saved_model_dir = os.fspath(saved_model_dir)
        self.signature_key = signature_key
        self._loaded = loaded  # a tf.saved_model.load() of saved_model_dir, or None: load once
        self._template = None  # built at the first convert, after its arguments are checked

    def convert(self, variant: str, *, representative: np.ndarray | None = None,
                int8_io: bool = False, input_shape: tuple[int, ...] | None = None) -> bytes:
        """`variant`'s flatbuffer bytes (see `convert_variant` for the arguments)."""
        if variant not in SPECS:
            raise ConfigError(f"variant must be one of {VARIANTS}. Received: variant={variant!r}")
        samples = None
        if variant == "full_int8":
            if representative is not None and input_shape is None:
                input_shape = _input_shape_of(self._saved_model(), self.signature_key,
                                              self.saved_model_dir)
            samples = check_representative(representative, input_shape)
        with _loads_answered_with(self.saved_model_dir, self._saved_model()):
            converter = _configure(self._fresh_converter(), variant, samples, int8_io)
            try:
                with _native_stderr_to_debug_log():
                    return converter.convert()
            except Exception as e:  # the converter raises ConverterError, RuntimeError, ...
                raise explain_conversion_error(e, variant=variant,
                                               source=self.saved_model_dir) from e

    def _saved_model(self):
        """The loaded SavedModel, loaded at the first call unless it was given."""
        if self._loaded is None:
            self._loaded = _load_saved_model(self.saved_model_dir, self.signature_key)
        return self._loaded

    def _fresh_converter(self):
        """A converter no variant has set or run yet."""
        if self._template is None:
            self._template = _from_saved_model(self.saved_model_dir, self.signature_key)
        try:
            return copy.deepcopy(self._template)
        except Exception as e:  # noqa: BLE001 (a TensorFlow whose converter cannot be copied)
            log.debug("TFLite converter not copyable (%s); building it again", e)
            return _from_saved_model(self.saved_model_dir, self.signature_key)


def _load_saved_model(saved_model_dir: str, signature_key: str):
    import tensorflow as tf

    try:
        return tf.saved_model.load(saved_model_dir)
    except (OSError, ValueError, KeyError) as e:
        raise _missing_signature(saved_model_dir, signature_key, e) from e


def _from_saved_model(saved_model_dir: str, signature_key: str):
    import tensorflow as tf

    try:
        return tf.lite.TFLiteConverter.from_saved_model(
            saved_model_dir, signature_keys=[signature_key])
    except (OSError, ValueError, KeyError) as e:
        raise _missing_signature(saved_model_dir, signature_key, e) from e


def _missing_signature(saved_model_dir: str, signature_key: str, error: Exception):
    return ModelLoadError(f"saved_model_dir must hold a SavedModel with the signature "
                          f"{signature_key!r}. Received: saved_model_dir={saved_model_dir!r} "
                          f"({error})")


# The loaded SavedModel each directory's loads are answered with, in this thread's conversion.
_ANSWERED_LOADS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "ampflow_answered_saved_model_loads", default=None)


@contextlib.contextmanager
def _loads_answered_with(saved_model_dir: str, loaded) -> Iterator[None]:
    """Inside, TensorFlow's converter gets `loaded` for every load of `saved_model_dir`.

    The converter loads the SavedModel (`tensorflow.lite.python.lite._load`, tf.saved_model's
    load) in `from_saved_model` and again in every `convert()`, and reads from it only the
    signatures and the debug info, which a second load of the same directory would give the
    same. Its module-level `_load` is wrapped once (a TensorFlow without it: loads as before);
    other directories, other threads and code outside this block load as usual.
    """
    lite = _converter_module()
    if lite is None:
        yield
        return
    token = _ANSWERED_LOADS.set({os.path.realpath(saved_model_dir): loaded})
    try:
        yield
    finally:
        _ANSWERED_LOADS.reset(token)


def _converter_module():
    """tensorflow.lite.python.lite with its `_load` answering from `_ANSWERED_LOADS`, or None."""
    try:
        from tensorflow.lite.python import lite
    except ImportError:
        return None
    load = getattr(lite, "_load", None)
    if not callable(load):
        return None
    if not getattr(load, "answers_ampflow_loads", False):
        lite._load = _answering(load)
    return lite


def _answering(load):
    def answered_load(export_dir, *args, **kwargs):
        given = (_ANSWERED_LOADS.get() or {}).get(os.path.realpath(os.fspath(export_dir)))
        return given if given is not None else load(export_dir, *args, **kwargs)

    answered_load.answers_ampflow_loads = True
    return answered_load


def _configure(converter, variant: str, samples, int8_io: bool):
    """Set a fresh converter's options for `variant`."""
    import tensorflow as tf

    if variant != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if variant == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if variant == "full_int8":
        converter.representative_dataset = _representative_fn(samples)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if int8_io:
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
    return converter


def signature_input_shape(saved_model_dir: str | os.PathLike, signature_key: str) -> tuple:
    """The signature's single input shape without the batch dim, e.g. (8, 8, 1)."""
    directory = os.fspath(saved_model_dir)
    return _input_shape_of(_load_saved_model(directory, signature_key), signature_key,
                           directory)


def _input_shape_of(loaded, signature_key: str, saved_model_dir: str = "") -> tuple:
    try:
        fn = loaded.signatures[signature_key]
    except KeyError as e:
        raise _missing_signature(saved_model_dir, signature_key, e) from e
    (spec,) = fn.structured_input_signature[1].values()
    return tuple(spec.shape.as_list()[1:])


def check_representative(
    representative: np.ndarray | None, input_shape: tuple[int, ...] | None
) -> np.ndarray:
    """Validate the calibration images before the converter sees them (its errors are opaque)."""
    if representative is None:
        raise ConfigError("the full_int8 variant needs a representative dataset of images "
                          "[N, H, W, C]. Received: representative=None")
    samples = np.asarray(representative)
    if samples.ndim == 0 or samples.shape[0] == 0:
        raise ConfigError("the representative dataset must hold at least one image. "
                          f"Received: shape={list(samples.shape)}")
    if input_shape is not None and tuple(samples.shape[1:]) != tuple(input_shape):
        raise ConfigError(
            "representative dataset images must have the model input's shape "
            f"{list(input_shape)} (one image, without the batch dim). Received: images of "
            f"shape {list(samples.shape[1:])} (dataset shape {list(samples.shape)}); calibrate "
            "with images from the dataset the model was trained on."
        )
    if not (np.issubdtype(samples.dtype, np.number) or samples.dtype == np.bool_):
        raise ConfigError("representative dataset images must be numeric. "
                          f"Received: dtype={samples.dtype}")
    if samples.dtype == np.int32:  # a text model's token ids: the signature takes int32
        return samples
    return samples.astype(np.float32)


def draw_representative(data_dir: str | os.PathLike, size: int, seed: int) -> np.ndarray:
    """`size` training images (raw pixels, float32) drawn without replacement with `seed`.

    From the training split, never the test split the variants are checked on; seeded, so a
    rerun calibrates on the same images and produces the same .tflite bytes.
    """
    from ampflow.data import load_arrays

    images, _ = load_arrays(data_dir, "train")
    rng = np.random.default_rng(seed)
    take = rng.choice(len(images), size=min(size, len(images)), replace=False)
    return images[np.sort(take)].astype(np.float32)


def _representative_fn(samples: np.ndarray):
    def generate() -> Iterator[list[np.ndarray]]:
        for i in range(len(samples)):
            yield [samples[i : i + 1]]

    return generate


@contextlib.contextmanager
def _native_stderr_to_debug_log() -> Iterator[None]:
    """Keep the converter's native (C++) MLIR chatter off the terminal; log it at DEBUG.

    The converter writes straight to file descriptor 2, so Python-level redirection cannot
    catch it; the fd is duplicated to a temp file and restored afterwards.
    """
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (some embedded interpreters): nothing to redirect
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace").strip()
            if text:
                log.debug("converter output:\n%s", text[-20000:])
