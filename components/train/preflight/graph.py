"""The AMP check's graph walk: one traced train step, its Casts and risky ops, by layer.

amp_check.py's docstring says what is read and why; this module traces the step (each layer's
`call` wrapped to record the name scope TF gave it), walks the graph and attributes every
floating-point Cast, float16-unsafe op, large reduction and half-precision constant to the layer
that made it. amp_check.py turns what it finds into findings.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ampflow.modeling.user_model import walk_layers

# Ops whose float16 result overflows (exp: above 11.1; a sum of many terms: above 65504) or
# loses what the loss needs (softmax/log of small probabilities) when computed in float16.
UNSAFE_FLOAT16_OPS = ("Softmax", "LogSoftmax", "Log", "Log1p", "Exp", "Expm1")
REDUCTION_OPS = ("Sum", "Mean", "Prod", "EuclideanNorm")
# The largest finite value of each half type: a constant beyond it is ±inf in that type.
HALF_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
# Ops that make attention scores from two computed tensors (a layer's weights on one side is a
# projection, not scores); and the ops between the scores and their softmax (scale, mask).
SCORE_OPS = ("Einsum", "BatchMatMulV2", "BatchMatMulV3", "BatchMatMul")
_SCORE_PATH_OPS = ("Identity", "Cast", "Mul", "AddV2", "Add", "Sub", "SelectV2", "Select",
                   "RealDiv", "Maximum", "Minimum", "Reshape", "Transpose")  # (a multi-axis
# softmax, as MultiHeadAttention's, is a transpose and reshape around the Softmax op)


def is_model(layer) -> bool:
    """Whether `layer` is a whole model (a nested one included), not a layer of one."""
    import keras

    return isinstance(layer, keras.Model)


@dataclass
class Cast:
    """One floating-point Cast op of the traced step, and the layer it is attributed to."""

    name: str
    src: str
    dst: str
    backward: bool
    category: str  # variable, constant, input, boundary, internal
    owner: Any  # the layer (or model) it is attributed to


@dataclass
class Trace:
    """What one traced train step holds: its Casts and risky ops, or the error tracing hit."""

    error: str | None = None
    seconds: float = 0.0
    casts: list[Cast] = field(default_factory=list)
    ops: list[tuple[str, str, str, Any, int]] = field(default_factory=list)  # type,name,dtype,..
    output_dtype: str | None = None
    loss_casts: int = 0
    no_gradient: list[str] = field(default_factory=list)
    variables: int = 0
    # (op name, owner, value as written, dtype, NaN certain: the inf meets a Mul)
    constants: list[tuple[str, Any, float, str, bool]] = field(default_factory=list)
    attention_softmax: set[str] = field(default_factory=set)  # Softmax ops over scores
    float32_attention: set[str] = field(default_factory=set)  # layers softmaxing them in f32


@contextlib.contextmanager
def _recording_scopes(layers) -> Iterator[dict[str, Any]]:
    """While active, each layer's `call` records the TF name scope it runs in."""
    import tensorflow as tf

    scopes: dict[str, Any] = {}
    patched = []
    for layer in layers:
        original = layer.__dict__.get("call")
        call = layer.call

        def recorder(*args, _call=call, _layer=layer, **kwargs):
            scopes.setdefault(tf.get_current_name_scope(), _layer)
            return _call(*args, **kwargs)

        object.__setattr__(layer, "call", recorder)  # (not through Keras's attribute tracker)
        patched.append((layer, original))
    try:
        yield scopes
    finally:
        for layer, original in patched:
            if original is None:
                object.__delattr__(layer, "call")
            else:
                object.__setattr__(layer, "call", original)


def trace_step(model, input_shape: tuple[int, ...], batch_size: int, policy: str) -> Trace:
    """Trace one train step as components/train/run/loop.py runs it (loss scaled under float16)."""
    import keras
    import tensorflow as tf

    result = Trace()
    scale = 2.0 ** 15 if policy == "mixed_float16" else None  # LossScaleOptimizer's start
    variables = model.trainable_variables
    outputs: dict[str, Any] = {}

    def step(images, labels):
        with tf.GradientTape() as tape:
            probabilities = model(images, training=True)
            outputs["dtype"] = keras.backend.standardize_dtype(probabilities.dtype)
            with tf.name_scope("amp_check_loss"):
                per_example = keras.losses.sparse_categorical_crossentropy(labels, probabilities)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch_size)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
                scaled = loss * scale if scale else loss
        return tape.gradient(scaled, variables)

    start = time.perf_counter()
    layers = [model] + [layer for layer, _ in walk_layers(model)]
    try:
        with _recording_scopes(layers) as scopes:
            concrete = tf.function(step, autograph=False).get_concrete_function(
                tf.TensorSpec([batch_size, *input_shape], model.inputs[0].dtype),
                tf.TensorSpec([batch_size], tf.int64))
    except Exception as e:  # anything a user's layer raises while tracing
        result.error = error_line(e)
        result.seconds = time.perf_counter() - start
        return result
    result.output_dtype = outputs.get("dtype")
    result.variables = len(variables)
    grads = concrete.structured_outputs
    result.no_gradient = [v.path for v, g in zip(variables, grads, strict=True) if g is None]
    _read_graph(concrete.graph, scopes, result)
    result.seconds = time.perf_counter() - start
    return result


def _owner(name: str, scopes: dict[str, Any]):
    parts = name.split("/")
    for end in range(len(parts), 0, -1):
        owner = scopes.get("/".join(parts[:end]))
        if owner is not None:
            return owner
    return None


def _source_kind(op) -> str:
    """What a forward Cast reads: a variable, a constant, or a computed tensor."""
    for _ in range(8):
        if op.type in ("ReadVariableOp", "VarHandleOp", "ResourceGather"):
            return "variable"
        if op.type == "Const":
            return "constant"
        if op.type != "Identity" or not op.inputs:
            return "computed"
        op = op.inputs[0].op
    return "computed"


def _read_graph(graph, scopes: dict[str, Any], result: Trace) -> None:
    import tensorflow as tf

    grad = "gradient_tape/"
    forward: dict[str, Cast] = {}
    backward = []
    for op in graph.get_operations():
        is_backward = op.name.startswith(grad)
        name = op.name[len(grad):] if is_backward else op.name
        if op.type == "Cast":
            src, dst = op.get_attr("SrcT"), op.get_attr("DstT")
            if not (src.is_floating and dst.is_floating):
                continue
            if is_backward:
                backward.append((name, src.name, dst.name))
                continue
            if name.startswith("amp_check_loss/"):
                result.loss_casts += 1
                continue
            owner = _owner(name, scopes)
            category = _source_kind(op.inputs[0].op)
            if category == "computed":
                category = "internal"
                if owner is not None and is_model(owner) and scopes.get(
                        name.rsplit("/", 1)[0]) is owner:
                    owner, category = _boundary_owner(op, scopes, owner)
            cast = Cast(name, src.name, dst.name, False, category, owner)
            if category == "constant" and dst.name in HALF_MAX:
                _record_overflow(op, name, _constant_value(op.inputs[0].op), dst.name, owner,
                                 result)
            forward[name] = cast
            result.casts.append(cast)
        elif not is_backward and op.type == "Const" and op.outputs[0].dtype.name in HALF_MAX:
            _record_overflow(op, name, _constant_value(op), op.outputs[0].dtype.name,
                             _owner(name, scopes), result)
        elif not is_backward and op.outputs and op.type in UNSAFE_FLOAT16_OPS + REDUCTION_OPS:
            dtype = op.outputs[0].dtype
            if op.type == "Softmax" and _over_scores(op):
                result.attention_softmax.add(name)
                if dtype == tf.float32 and _owner(name, scopes) is not None:
                    result.float32_attention.add(_owner(name, scopes).name)
            if dtype in (tf.float16, tf.bfloat16):
                result.ops.append((op.type, name, dtype.name, _owner(name, scopes),
                                   _reduced_elements(op)))
    for name, src, dst in backward:
        parts = name.split("/")
        match = None
        for end in range(len(parts) - 1, 0, -1):
            match = forward.get("/".join(parts[:end]))
            if match is not None:
                break
        if name.startswith("amp_check_loss/"):
            result.loss_casts += 1
        elif match is not None:
            result.casts.append(Cast(name, src, dst, True, match.category, match.owner))
        else:
            result.casts.append(Cast(name, src, dst, True, "internal", _owner(name, scopes)))


def _constant_value(op) -> float | None:
    """The value of a small constant (through Identity ops) with the largest magnitude."""
    import numpy as np
    import tensorflow as tf

    for _ in range(8):
        if op.type == "Const":
            size = op.outputs[0].shape.num_elements()
            if size is None or not 0 < size <= 64 or not op.outputs[0].dtype.is_floating:
                return None  # a mask constant is a scalar; a table of weights is not one
            value = tf.make_ndarray(op.get_attr("value"))
            flat = value.astype(np.float64).reshape(-1)
            return float(flat[np.argmax(np.abs(np.nan_to_num(flat, nan=0.0, posinf=np.inf,
                                                              neginf=np.inf)))])
        if op.type != "Identity" or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def _record_overflow(op, name: str, value: float | None, dtype: str, owner,
                     result: Trace) -> None:
    """Note a constant that `dtype` cannot hold (±inf there), and whether a Mul reads it."""
    import math

    if value is None or not (math.isinf(value) or abs(value) > HALF_MAX[dtype]):
        return
    multiplied = any(c.type in ("Mul", "MulNoNan") for c in op.outputs[0].consumers())
    result.constants.append((name, owner, value, dtype, multiplied))


def _over_scores(softmax) -> bool:
    """Whether a Softmax reads attention scores: a product of two computed tensors."""
    frontier, seen = [softmax.inputs[0].op], set()
    for _ in range(12):
        following = []
        for op in frontier:
            if op.name in seen:
                continue
            seen.add(op.name)
            if op.type in SCORE_OPS:
                return all(_source_kind(t.op) == "computed" for t in op.inputs[:2])
            if op.type in _SCORE_PATH_OPS:
                following += [t.op for t in op.inputs]
        frontier = following
        if not frontier:
            return False
    return False


def _boundary_owner(op, scopes, model):
    """A Cast in a model's own scope: the input cast of the layer that reads it, if any.

    A Cast read by another Cast of the same scope is a nested model's float32 Input round trip
    (compute dtype → float32 → compute dtype): that pair stays with the model.
    """
    source = op.inputs[0].op
    if source.type == "Cast" and _owner(source.name, scopes) is model:
        return model, "boundary"
    for consumer in op.outputs[0].consumers():
        owner = _owner(consumer.name, scopes)
        if owner is not None and owner is not model and not is_model(owner):
            return owner, "input"
    return model, "boundary"


def _reduced_elements(op) -> int:
    """Elements summed into each output of a reduction (the batch axis left out), else 0."""
    import numpy as np
    import tensorflow as tf

    if op.type not in REDUCTION_OPS or len(op.inputs) < 2:
        return 0
    shape = op.inputs[0].shape
    axes = tf.get_static_value(op.inputs[1])
    if axes is None or shape.rank is None:
        return 0
    count = 1
    for axis in {int(a) % shape.rank for a in np.reshape(axes, -1)}:
        if axis != 0 and shape[axis] is not None:
            count *= int(shape[axis])
    return count


def error_line(error: BaseException) -> str:
    """One line from a tracing error: its first message line, and the layer Keras names."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Keras bolds its messages for terminals
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    where = next((line for line in lines if line.startswith("Exception encountered when")), "")
    message = next((line for line in lines if not line.startswith("Exception encountered when")
                    and not line.startswith(("Arguments received", "•"))), "")
    text = f"{type(error).__name__}: {message}"
    return f"{text} ({where.rstrip('.')})" if where else text
