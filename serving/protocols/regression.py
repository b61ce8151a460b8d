"""TF Serving's Regress and MultiInference APIs: tf.Examples in, one float per example out.

As TF Serving's `regressor.cc` and `multi_inference.cc` (read, not copied): a regression
signature has one input, `inputs` (the serialized examples, context merged in), and one output,
`outputs`, of DT_FLOAT shaped `[batch]` or `[batch, 1]`; every refusal is INVALID_ARGUMENT
with TF Serving's words. The method name (`tensorflow/serving/regress`) is checked only with
`--enable-signature-method-name-check`, as there. MultiInference runs several Classify and
Regress tasks of one model on the same examples; TF Serving feeds them to one session run,
here each distinct signature runs once on the same serialized examples (the same answers; a
TF2 SavedModel's signatures are separate functions).
"""

from __future__ import annotations

import grpc
import numpy as np
from tensorflow.core.framework import types_pb2

from ampflow.serving.model_format import CLASSIFY_METHOD, DEFAULT_SIGNATURE
from ampflow.serving.protocols import classification
from ampflow.serving.status import ServingStatusError, clip
from ampflow.serving.status import invalid_argument as invalid

REGRESS_METHOD = "tensorflow/serving/regress"
REGRESS_INPUTS = "inputs"
REGRESS_OUTPUTS = "outputs"


def signature_def(servable, signature_name: str, missing: str = "No signature was found "
                  "with the name: "):
    """(name, SignatureDef) a Classify/Regress request names; INVALID_ARGUMENT when absent.

    TF Serving's classifier and regressor answer INVALID_ARGUMENT here, where its Predict
    answers FAILED_PRECONDITION (`InferenceCore.signature`).
    """
    name = signature_name or DEFAULT_SIGNATURE
    if name not in servable.signature_defs or not servable.can_run(name):
        raise invalid(f"{missing}{clip(name)}")
    return name, servable.signature_defs[name]


def regress_input_key(sig, check_method: bool = False) -> str:
    """The input of a regression signature (`inputs`); TF Serving's refusals otherwise."""
    if check_method and sig.method_name != REGRESS_METHOD:
        raise invalid(f"Expected regression signature method_name to be {REGRESS_METHOD}. "
                      f"Was: {sig.method_name}")
    if len(sig.inputs) != 1:
        raise invalid("Expected one input Tensor.")
    if len(sig.outputs) != 1:
        raise invalid("Expected one output Tensor.")
    if REGRESS_INPUTS not in sig.inputs:
        raise invalid(f"No regression inputs found in SignatureDef: inputs "
                      f"{sorted(sig.inputs)} (expected '{REGRESS_INPUTS}')")
    if REGRESS_OUTPUTS not in sig.outputs:
        raise invalid(f"No regression outputs found in SignatureDef: outputs "
                      f"{sorted(sig.outputs)} (expected '{REGRESS_OUTPUTS}')")
    if sig.inputs[REGRESS_INPUTS].dtype != types_pb2.DT_STRING:
        raise invalid(f"Regression input '{REGRESS_INPUTS}' must be DT_STRING (serialized "
                      f"tf.Examples). Received: "
                      f"{types_pb2.DataType.Name(sig.inputs[REGRESS_INPUTS].dtype)}")
    return REGRESS_INPUTS


def fill_regressions(result, outputs: dict, n: int) -> None:
    """One `value` per example from the `outputs` tensor, checked as TF Serving checks it."""
    values = np.asarray(outputs[REGRESS_OUTPUTS])
    if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)):
        raise invalid(f"Expected output Tensor shape to be either [batch_size] or "
                      f"[batch_size, 1] but got {list(values.shape)}")
    if values.shape[0] != n:
        raise invalid(f"Input batch size did not match output batch size: {n} vs. "
                      f"{values.shape[0]}")
    if values.dtype != np.float32:
        raise invalid(f"Expected output Tensor of DT_FLOAT.  Got: {values.dtype.name}")
    for value in values.ravel().tolist():
        result.regressions.add().value = value


def multi_inference_tasks(tasks) -> list[tuple[str, str]]:
    """(method, signature name) of each task, refused as `multi_inference.cc` refuses them.

    Every task names the same model (and not an empty one), no signature twice, and a method
    of Classify or Regress.
    """
    model, seen, plan = "", set(), []
    for task in tasks:
        name = task.model_spec.name
        if not name:
            raise invalid("Found ModelSpec with an empty model name.")
        if model and name != model:
            raise invalid("All ModelSpecs in a MultiInferenceRequest must access the same "
                          "model name.")
        model = name
        signature = task.model_spec.signature_name or DEFAULT_SIGNATURE
        if signature in seen:
            raise invalid(f"Duplicate evaluation of signature: {clip(signature)}")
        seen.add(signature)
        if task.method_name not in (CLASSIFY_METHOD, REGRESS_METHOD):
            raise ServingStatusError(grpc.StatusCode.UNIMPLEMENTED,
                                     f"Unsupported signature method_name: "
                                     f"{clip(task.method_name)}")
        plan.append((task.method_name, signature))
    return plan


def task_input_key(method: str, sig, sig_name: str, check_method: bool) -> str:
    """The examples' input of one MultiInference task's signature (Classify or Regress)."""
    if method == CLASSIFY_METHOD:
        return classification.classify_input_key(sig, sig_name, check_method=check_method)
    return regress_input_key(sig, check_method)
