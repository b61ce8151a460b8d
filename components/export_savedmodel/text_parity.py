"""Export parity for a text model: raw text through the graph's tokenizer answers as token ids do.

The sibling of parity.py. The reference token ids come from the tokenizer the model was trained
with (its model dir's vocab.txt + tokenizer.json, tokenized outside the graph, as a TFLite
client does with the shipped vocabulary); the reference probabilities from the exported float32
Keras twin on those ids. Checked on real test sentences:
- `serving_default` on the raw strings (the in-graph tokenizer) against the twin;
- `token_ids` on the reference ids against the twin, and against `serving_default`: the same
  model function on the same ids, so any difference beyond `TEXT_VS_IDS_ATOL` means the graph
  tokenizes differently from the vocabulary the model learnt (a wrong, re-fitted or re-ordered
  vocabulary, another sequence length or standardization);
- `classify` on tf.Examples of the same sentences against the twin.
The trained (mixed-precision) model's distance is reported for information: evaluate gates it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ampflow.artifacts.signature_names import TEXT_INPUT, TOKEN_IDS_INPUT, TOKEN_IDS_SIGNATURE
from ampflow.components.export_savedmodel.text_signatures import text_example
from ampflow.errors import GateFailedError
from ampflow.serving.model_format import (
    CLASS_IDS_OUTPUT,
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    PROBABILITIES_OUTPUT,
)

_BATCH = 128
# serving_default vs token_ids: the same model on the same int32 ids, the first cut to the
# batch's length bucket (ampflow.modeling.length_buckets), the second at the cap: the padding
# cut adds exact zeros, so only a kernel summing in another order moves an answer (measured
# 0.0 for bert_tiny), and a tokenizer that differs moves it by far more than 1e-6.
TEXT_VS_IDS_ATOL = 1e-6


@dataclass(frozen=True)
class TextParityReport:
    """Observed differences between the SavedModel's text signatures and the Keras models."""

    num_texts: int
    atol: float
    rtol: float
    max_abs_diff: float  # serving_default (raw text) vs the float32 twin on reference ids
    mean_abs_diff: float
    token_ids_max_abs_diff: float  # token_ids signature vs the twin
    text_vs_token_ids_max_abs_diff: float  # serving_default vs token_ids on the same texts
    text_vs_token_ids_class_ids_equal: bool
    classify_max_abs_diff: float
    argmax_agreement: float
    class_ids_consistent: bool
    classes_are_labels: bool
    trained_max_abs_diff: float  # vs the model as trained (mixed policy): information only
    trained_argmax_agreement: float
    passed: bool

    @property
    def num_examples(self) -> int:
        return self.num_texts

    def as_metadata(self) -> dict[str, Any]:
        return asdict(self)


def check_text_export_parity(loaded, twin, trained, tokenizer, texts: list[str],
                             labels: list[str], *, atol: float, rtol: float) -> TextParityReport:
    """Compare the loaded SavedModel's text signatures with the Keras models; raise on a miss."""
    from ampflow.components.export_savedmodel.parity import keras_probabilities

    ids = np.asarray(tokenizer.tokenize(np.asarray(texts, dtype=object)), dtype=np.int32)
    reference = keras_probabilities(twin, ids)
    trained_probs = keras_probabilities(trained, ids)
    probs, class_ids = _predict(loaded, DEFAULT_SIGNATURE, TEXT_INPUT,
                                np.asarray([t.encode("utf-8") for t in texts], dtype=object))
    id_probs, id_class_ids = _predict(loaded, TOKEN_IDS_SIGNATURE, TOKEN_IDS_INPUT, ids)
    scores, classes = _classify(loaded, texts)
    diff = np.abs(probs - reference)
    text_vs_ids = float(np.abs(probs - id_probs).max())
    ids_equal = bool(np.array_equal(class_ids, id_class_ids))
    consistent = bool(np.array_equal(class_ids, probs.argmax(-1)))
    classes_ok = bool((classes == np.asarray(labels, dtype=object)).all())
    close = all(np.allclose(out, reference, atol=atol, rtol=rtol)
                for out in (probs, id_probs, scores))
    report = TextParityReport(
        num_texts=len(texts), atol=atol, rtol=rtol,
        max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()),
        token_ids_max_abs_diff=float(np.abs(id_probs - reference).max()),
        text_vs_token_ids_max_abs_diff=text_vs_ids,
        text_vs_token_ids_class_ids_equal=ids_equal,
        classify_max_abs_diff=float(np.abs(scores - reference).max()),
        argmax_agreement=float(np.mean(class_ids == reference.argmax(-1))),
        class_ids_consistent=consistent, classes_are_labels=classes_ok,
        trained_max_abs_diff=float(np.abs(probs - trained_probs).max()),
        trained_argmax_agreement=float(np.mean(class_ids == trained_probs.argmax(-1))),
        passed=(close and consistent and classes_ok and ids_equal
                and text_vs_ids <= TEXT_VS_IDS_ATOL),
    )
    if not report.passed:
        raise GateFailedError(_failure_message(report))
    return report


def _predict(loaded, signature: str, input_name: str, batch: np.ndarray):
    import tensorflow as tf

    fn = loaded.signatures[signature]
    outs = [fn(**{input_name: tf.constant(batch[i:i + _BATCH])})
            for i in range(0, len(batch), _BATCH)]
    return (np.concatenate([o[PROBABILITIES_OUTPUT].numpy() for o in outs]),
            np.concatenate([o[CLASS_IDS_OUTPUT].numpy() for o in outs]))


def _classify(loaded, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow as tf

    fn = loaded.signatures[CLASSIFY_SIGNATURE]
    serialized = np.array([text_example(t).SerializeToString() for t in texts], dtype=object)
    outs = [fn(inputs=tf.constant(serialized[i:i + _BATCH]))
            for i in range(0, len(texts), _BATCH)]
    classes = np.concatenate([o["classes"].numpy() for o in outs])
    return (np.concatenate([o["scores"].numpy() for o in outs]),
            np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(classes))


def _failure_message(r: TextParityReport) -> str:
    return (
        "export parity failed, so the SavedModel is not published. Expected: the text "
        f"signatures within atol={r.atol:g} + rtol={r.rtol:g}·|ref| of the Keras float32 model "
        f"on {r.num_texts} real test sentences tokenized with the model's own vocabulary, and "
        f"serving_default (text tokenized in the graph) answering as token_ids on those ids "
        f"(atol {TEXT_VS_IDS_ATOL:g}). Received: max |serving_default − Keras| = "
        f"{r.max_abs_diff:.3g}, max |token_ids − Keras| = {r.token_ids_max_abs_diff:.3g}, "
        f"max |serving_default − token_ids| = {r.text_vs_token_ids_max_abs_diff:.3g} (class_ids "
        f"equal={r.text_vs_token_ids_class_ids_equal}), max |classify − Keras| = "
        f"{r.classify_max_abs_diff:.3g}, class_ids consistent={r.class_ids_consistent}, "
        f"classes are labels={r.classes_are_labels}. A difference between serving_default and "
        "token_ids means the graph's tokenizer is not the one the model was trained with."
    )
