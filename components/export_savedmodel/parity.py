"""Export parity: the reloaded SavedModel must reproduce the Keras model it was written from.

The reference is the float32 twin that was exported; both run the same float32 math, so the
tolerance can be tight and any drift means the export (signatures, preprocessing, weights) is
wrong. Both signatures are checked. The distance to the *trained* (mixed-precision) model is
reported too, for information: the evaluate step owns that gate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ampflow.errors import GateFailedError
from ampflow.serving.model_format import CLASSIFY_SIGNATURE, DEFAULT_SIGNATURE, image_example

_BATCH = 128


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
    passed: bool

    def as_metadata(self) -> dict[str, Any]:
        return asdict(self)


def keras_probabilities(model, images: np.ndarray) -> np.ndarray:
    """Probabilities of a Keras model in float32, in batches (no `predict` progress bars)."""
    out = [np.asarray(model(images[i:i + _BATCH], training=False), dtype=np.float32)
           for i in range(0, len(images), _BATCH)]
    return np.concatenate(out)


def check_export_parity(loaded, twin, trained, images: np.ndarray, labels: list[str], *,
                        atol: float, rtol: float) -> ParityReport:
    """Compare the loaded SavedModel's two signatures with the Keras models; raise on a miss."""
    images = images.astype(np.float32)
    reference = keras_probabilities(twin, images)
    trained_probs = keras_probabilities(trained, images)
    probs, class_ids = _serve(loaded, images)
    scores, classes = _classify(loaded, images)
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
        passed=close and consistent and classes_ok,
    )
    if not report.passed:
        raise GateFailedError(_failure_message(report))
    return report


def _serve(loaded, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow as tf

    fn = loaded.signatures[DEFAULT_SIGNATURE]
    outs = [fn(images=tf.constant(images[i:i + _BATCH])) for i in range(0, len(images), _BATCH)]
    return (np.concatenate([o["probabilities"].numpy() for o in outs]),
            np.concatenate([o["class_ids"].numpy() for o in outs]))


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
        f"{r.num_images} real test images, class_ids == argmax(probabilities) and classes == "
        f"labels. Received: max |serving_default − Keras| = {r.max_abs_diff:.3g}, "
        f"max |classify − Keras| = {r.classify_max_abs_diff:.3g}, "
        f"class_ids consistent={r.class_ids_consistent}, classes are labels="
        f"{r.classes_are_labels}."
    )
