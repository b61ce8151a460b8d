"""TF Serving's Classify API: tf.Examples in, (label, score) rows out.

As TF Serving's classifier: the signature must have one DT_STRING input and a `classes` or
`scores` output (and method `tensorflow/serving/classify` with the method-name check on); a
request's context is merged into each example, with the cost of that merge checked before it
is made.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from tensorflow.core.framework import types_pb2

from ampflow.serving.model_format import CLASSIFY_METHOD
from ampflow.serving.status import ServingStatusError


def classify_input_key(sig, sig_name: str, signature_defs: Mapping | None = None, *,
                       check_method: bool = False) -> str:
    """The one input of a classify signature; INVALID_ARGUMENT, as TF Serving, when it is not.

    `check_method` (TF Serving's --enable_signature_method_name_check, off by default):
    the method name must be `tensorflow/serving/classify`. Off, a TF2 export's signature
    (every one is `tensorflow/serving/predict`) classifies when its inputs and outputs fit.
    A Classify without a signature name runs `serving_default`, which in a Keras export (and
    in ampflow's) is a Predict signature: refused, and the line also names the model's
    signatures that classify (of `signature_defs`) and how to ask for one.
    """
    problem = _classification_problem(sig, check_method)
    if problem:
        hint = _classify_signature_hint(signature_defs or {}, check_method)
        raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{problem} (signature {sig_name!r}){hint}")
    return next(iter(sig.inputs))


def _classification_problem(sig, check_method: bool) -> str:
    """Why `sig` cannot classify ("" when it can)."""
    if check_method and sig.method_name != CLASSIFY_METHOD:
        return (f"Expected classification signature method_name to be {CLASSIFY_METHOD}. "
                f"Was: {sig.method_name}")
    one_string = (len(sig.inputs) == 1
                  and next(iter(sig.inputs.values())).dtype == types_pb2.DT_STRING)
    if not one_string or not ({"classes", "scores"} & set(sig.outputs)):
        return (f"Not a classification signature ({CLASSIFY_METHOD}: one DT_STRING input of "
                f"serialized tf.Examples, a 'classes' or 'scores' output). Received: inputs "
                f"{sorted(sig.inputs)}, outputs {sorted(sig.outputs)}")
    return ""


def _classify_signature_hint(signature_defs: Mapping, check_method: bool) -> str:
    """'; this model classifies through signature ...', or "" when it has no such signature."""
    names = sorted(name for name, sig in signature_defs.items()
                   if not _classification_problem(sig, check_method))
    if not names:
        return ""
    return (f"; this model classifies through signature {' or '.join(map(repr, names))}: "
            f'name it in the request (REST: "signature_name": "{names[0]}"; gRPC: '
            "model_spec.signature_name)")


def serialized_examples(input_proto, max_rows: int, max_bytes: int, max_string_bytes: int = 0,
                        max_strings: int = 0) -> list[bytes]:
    """tf.Examples of a request Input, with any context merged into each (as TF Serving).

    The count is capped like a batch, and the merged size is computed before merging: a big
    context copied into every example must not multiply the request's memory. Each serialized
    example is one string of the signature's input, so the string limits apply to it too
    (a text model's Classify carries its text in the example): the count against
    `max_strings`, each merged example's size against `max_string_bytes` (0 = no cap).
    """
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        examples, context = input_proto.example_list.examples, None
    elif kind == "example_list_with_context":
        examples = input_proto.example_list_with_context.examples
        context = input_proto.example_list_with_context.context
    else:
        examples, context = [], None
    if not examples:
        raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, "Input is empty.")
    if max_rows and len(examples) > max_rows:
        raise ServingStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Input has {len(examples)} examples; this server takes at most {max_rows} "
            "per request (--max-request-batch-size)",
        )
    if max_strings and len(examples) > max_strings:
        raise ServingStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Input has {len(examples)} examples; this server takes at most {max_strings} "
            "strings per request (--max-strings-per-request)")
    context_bytes = context.ByteSize() if context is not None else 0
    sizes = [e.ByteSize() + context_bytes for e in examples]
    if max_string_bytes and max(sizes) > max_string_bytes:
        raise ServingStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"an example of this request (context merged in) is {max(sizes)} bytes; this server "
            f"takes at most {max_string_bytes} bytes per string (--max-string-bytes)")
    merged = sum(sizes)
    if max_bytes and merged > max_bytes:
        raise ServingStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"merging the context ({context_bytes} bytes) into each of {len(examples)} examples "
            f"makes {merged} bytes; the limit is {max_bytes} bytes (--max-message-bytes)",
        )
    if context is None:
        return [e.SerializeToString() for e in examples]
    serialized = []
    for example in examples:
        combined = type(context)()
        combined.CopyFrom(context)
        combined.MergeFrom(example)
        serialized.append(combined.SerializeToString())
    return serialized


def fill_classifications(result, outputs: dict, n: int) -> None:
    """Per example, one (label, score) pair per class column of the signature's outputs."""
    classes = outputs.get("classes")
    scores = outputs.get("scores")
    for i in range(n):
        row = result.classifications.add()
        width = (scores if scores is not None else classes).shape[1]
        for j in range(width):
            klass = row.classes.add()
            if classes is not None:
                label = classes[i][j]
                klass.label = label.decode() if isinstance(label, bytes) else str(label)
            if scores is not None:
                klass.score = float(scores[i][j])
