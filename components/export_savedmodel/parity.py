"""Export parity: the reloaded SavedModel must reproduce the Keras model it was written from.

The reference is the float32 twin that was exported; both run the same float32 math, so the
tolerance can be tight and any drift means the export (signatures, preprocessing, weights) is
wrong. Every signature is checked: `serving_default` and `classify` against Keras, and
`image_bytes` on the same images PNG-encoded (lossless) against `serving_default` itself, so a
decode path that drifts from the pixels (channels, a resize, a value range) fails the export.
The distance to the *trained* (mixed-precision) model is reported too, for information: the
evaluate step owns that gate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ampflow.errors import GateFailedError
from ampflow.serving.model_format import (
    CLASS_IDS_OUTPUT,
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    IMAGE_BYTES_INPUT,
    IMAGE_BYTES_SIGNATURE,
    IMAGES_INPUT,
    PROBABILITIES_OUTPUT,
    image_example,
)

_BATCH = 128
# image_bytes vs serving_default on the same pixels: both run the same graph on the same
# float32 values in batches of the same size (measured: 0.0), so only a decode that changes
# pixels can move the answer; 1e-6 leaves room for a kernel that reassociates differently.
IMAGE_BYTES_ATOL = 1e-6


@dataclass(frozen=True)
class ParityReport:
    """Observed differences between the SavedModel and the Keras models, and the verdict."""

    num_images: int
    atol: float
    rtol: float
    max_abs_diff: float  # serving_default probabilities vs the exported float32 twin
    mean_abs_diff: float
    classify_max_abs_diff: float  # classify scores vs the twin
    argmax_agreement: float  # class_ids vs the twin's argmax
    class_ids_consistent: bool  # class_ids == argmax(probabilities) of the SavedModel itself
    classes_are_labels: bool
    trained_max_abs_diff: float  # vs the model as trained (mixed policy): information only
    trained_argmax_agreement: float
    image_bytes_max_abs_diff: float  # image_bytes on PNGs vs serving_default on their pixels
    image_bytes_class_ids_equal: bool
    passed: bool

    @property
    def num_examples(self) -> int:
        return self.num_images

    def as_metadata(self) -> dict[str, Any]:
        return asdict(self)


def keras_probabilities(model, images: np.ndarray) -> np.ndarray:
    """Probabilities of a Keras model in float32, in batches (no `predict` progress bars)."""
    out = [np.asarray(model(images[i:i + _BATCH], training=False), dtype=np.float32)
           for i in range(0, len(images), _BATCH)]
    return np.concatenate(out)


def check_export_parity(loaded, twin, trained, images: np.ndarray, labels: list[str], *,
                        atol: float, rtol: float) -> ParityReport:
    """Compare the loaded SavedModel's signatures with the Keras models; raise on a miss."""
    images = images.astype(np.float32)
    reference = keras_probabilities(twin, images)
    trained_probs = keras_probabilities(trained, images)
    probs, class_ids = _serve(loaded, images)
    scores, classes = _classify(loaded, images)
    # PNG carries whole pixel values; resized images are not whole, so both signatures get the
    # same rounded pixels (the decode path is what is checked, not the rounding)
    whole = np.clip(np.round(images), 0, 255)
    whole_probs, whole_ids = (probs, class_ids) if np.array_equal(whole, images) else _serve(
        loaded, whole)
    encoded_probs, encoded_ids = _serve_encoded(loaded, whole)
    encoded_diff = float(np.abs(encoded_probs - whole_probs).max())
    encoded_equal = bool(np.array_equal(encoded_ids, whole_ids))
    diff = np.abs(probs - reference)
    consistent = bool(np.array_equal(class_ids, probs.argmax(-1)))
    classes_ok = bool((classes == np.asarray(labels, dtype=object)).all())
    close = bool(np.allclose(probs, reference, atol=atol, rtol=rtol)
                 and np.allclose(scores, reference, atol=atol, rtol=rtol))
    report = ParityReport(
        num_images=len(images), atol=atol, rtol=rtol,
        max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()),
        classify_max_abs_diff=float(np.abs(scores - reference).max()),
        argmax_agreement=float(np.mean(class_ids == reference.argmax(-1))),
        class_ids_consistent=consistent, classes_are_labels=classes_ok,
        trained_max_abs_diff=float(np.abs(probs - trained_probs).max()),
        trained_argmax_agreement=float(np.mean(class_ids == trained_probs.argmax(-1))),
        image_bytes_max_abs_diff=encoded_diff, image_bytes_class_ids_equal=encoded_equal,
        passed=(close and consistent and classes_ok and encoded_equal
                and encoded_diff <= IMAGE_BYTES_ATOL),
    )
    if not report.passed:
        raise GateFailedError(_failure_message(report))
    return report


def _serve(loaded, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow as tf

    fn = loaded.signatures[DEFAULT_SIGNATURE]
    outs = [fn(**{IMAGES_INPUT: tf.constant(images[i:i + _BATCH])})
            for i in range(0, len(images), _BATCH)]
    return _predictions(outs)


def _serve_encoded(loaded, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`image_bytes` on images of whole pixel values as PNG files (lossless: exact pixels)."""
    import tensorflow as tf

    pixels = images.astype(np.uint8)
    encoded = np.array([tf.io.encode_png(image).numpy() for image in pixels], dtype=object)
    fn = loaded.signatures[IMAGE_BYTES_SIGNATURE]
    outs = [fn(**{IMAGE_BYTES_INPUT: tf.constant(encoded[i:i + _BATCH])})
            for i in range(0, len(images), _BATCH)]
    return _predictions(outs)


def _predictions(outs) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate([o[PROBABILITIES_OUTPUT].numpy() for o in outs]),
            np.concatenate([o[CLASS_IDS_OUTPUT].numpy() for o in outs]))


def _classify(loaded, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow as tf

    fn = loaded.signatures[CLASSIFY_SIGNATURE]
    serialized = np.array([image_example(image).SerializeToString() for image in images],
                          dtype=object)
    outs = [fn(inputs=tf.constant(serialized[i:i + _BATCH]))
            for i in range(0, len(images), _BATCH)]
    classes = np.concatenate([o["classes"].numpy() for o in outs])
    return (np.concatenate([o["scores"].numpy() for o in outs]),
            np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(classes))


def _failure_message(r: ParityReport) -> str:
    return (
        "export parity failed, so the SavedModel is not published. Expected: SavedModel "
        f"outputs within atol={r.atol:g} + rtol={r.rtol:g}·|ref| of the Keras float32 model on "
        f"{r.num_images} real test images, class_ids == argmax(probabilities), classes == "
        "labels, and image_bytes on the same images as PNG files answering as serving_default. "
        "Received: max |serving_default − Keras| = {r.max_abs_diff:.3g}, "
        f"max |classify − Keras| = {r.classify_max_abs_diff:.3g}, "
        f"max |image_bytes(PNG) − serving_default| = {r.image_bytes_max_abs_diff:.3g} "
        f"(atol {IMAGE_BYTES_ATOL:g}), image_bytes class_ids equal="
        f"{r.image_bytes_class_ids_equal}, class_ids consistent={r.class_ids_consistent}, "
        f"classes are labels={r.classes_are_labels}."
    )
