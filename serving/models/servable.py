"""One loaded model version: the `Servable` interface, and the SavedModel that implements it.

`Servable` is what the registry, the core, the batcher and the warm-up need of a version,
whatever its format; `SavedModelServable` (here), `TFLiteServable` (tflite.py) and, for a TF1
graph whose SignatureDefs disagree with it, `SessionServable` (session.py) implement it, and
`load_servable` picks one by what the version dir holds.

TF Serving's `SavedModelBundle`: the SignatureDefs come from `saved_model.pb` itself (what
GetModelMetadata returns), the functions from `tf.saved_model.load` (what a request runs).
Each signature is one concrete function, traced when the model was saved: any batch size runs
the same graph, nothing is ever retraced. `SignatureCall` calls it without TensorFlow's
per-call argument binding, which costs more than the tiny model itself (see
docs/explanation/serving-path.md). With `compute_precision="bfloat16"` every call runs inside
a `PrecisionScope` (compute_precision.py): the same signatures, instantiated with TF's oneDNN
bfloat16 rewrite on, each frozen at load (frozen.py: its weights as constants, which grappler
casts to bfloat16 once, not on every call); float32 (the default) calls them as before, with
nothing around them.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Protocol

import numpy as np

from ampflow.errors import ConfigError, ModelLoadError
from ampflow.serving.compute_precision import PrecisionScope, check_supported
from ampflow.serving.model_format import (
    INIT_OP_SIGNATURE,
    SERVE_TAG,
    serving_signature_defs,
)
from ampflow.serving.models.frozen import FrozenSignature
from ampflow.serving.models.token_cost import TokenCost, read_token_cost

log = logging.getLogger(__name__)

class Servable(Protocol):
    """One loaded model version, whatever its format.

    `signature_defs`: name -> SignatureDef proto, what requests are checked against (a
    quantized TFLite tensor is described as float32; a Session's graph gives its dtypes and
    shapes); `metadata_signature_defs`: what GetModelMetadata returns (the same, but a TF1
    graph's SignatureDefs as written); `run` takes and returns numpy arrays keyed by the
    signature's input and output names; `platform`: V2 metadata's name of the format;
    `model_format`: one of model_format.MODEL_FORMATS but `auto`; `token_cost`: a text
    model's rule for what a request costs in tokens (token_cost.py), None for any other.
    """

    model: str
    version: int
    path: Path
    platform: str
    model_format: str
    signature_defs: dict
    metadata_signature_defs: dict
    token_cost: TokenCost | None

    def can_run(self, signature: str) -> bool:
        """Whether `signature` can be run (a SavedModel's init-op SignatureDef cannot)."""
        ...

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run `signature` on `inputs`; numpy arrays out."""
        ...


def load_servable(model: str, version: int, path: Path, model_format: str = "auto",
                  compute_precision: str = "float32") -> Servable:
    """Load one version dir as a SavedModel or a TFLite flatbuffer (tflite.py).

    A TFLite version computes in the precision it was converted to (its variant), so a
    `compute_precision` other than float32 is refused for it (ModelLoadError: never served).
    A TF1 SavedModel that `tf.saved_model.load` refuses because its SignatureDefs disagree
    with its graph runs in a Session (session.py); any other failure raises as it was. Ops a
    SavedModel needs that TensorFlow has not registered (TF Text's) are imported first, or
    refuse the version with one line (op_libraries.py).
    """
    from ampflow.serving.models.op_libraries import ensure_ops_registered
    from ampflow.serving.models.session import session_servable
    from ampflow.serving.models.tflite import TFLiteServable, detect_format

    chosen = detect_format(path, prefer_tflite=model_format == "prefer_tflite") \
        if model_format in ("auto", "prefer_tflite") else model_format
    if chosen == "tflite":
        if compute_precision != "float32":
            raise ModelLoadError(
                f"compute_precision {compute_precision} rewrites a SavedModel's graph; this "
                "version is a TFLite flatbuffer, whose precision is its converter variant "
                "(serve it with the default float32)")
        return TFLiteServable(model, version, path)
    ensure_ops_registered(path)
    try:
        return SavedModelServable(model, version, path, compute_precision)
    except Exception as error:
        servable = session_servable(model, version, path, compute_precision, error)
        if servable is None:
            raise
        return servable


class SavedModelServable:
    """One loaded SavedModel version: its signature defs (protos) and callable signatures."""

    platform = "tensorflow_savedmodel"  # what V2 model metadata calls this format
    model_format = "saved_model"

    def __init__(self, model: str, version: int, path: Path,
                 compute_precision: str = "float32") -> None:
        import tensorflow as tf  # heavy: imported where a model is actually loaded

        try:  # checked again here for library callers; the CLI refuses before loading
            check_supported(compute_precision)
        except ConfigError as e:
            raise ModelLoadError(str(e)) from e
        self.compute_precision = compute_precision
        self._scope = (PrecisionScope(compute_precision).scope
                       if compute_precision != "float32" else None)
        self.model = model
        self.version = version
        self.path = path
        self.signature_defs = serving_signature_defs(path)
        self.metadata_signature_defs = self.signature_defs
        self.token_cost = read_token_cost(path)
        self._loaded = tf.saved_model.load(str(path), tags=[SERVE_TAG])
        freeze = compute_precision != "float32"  # frozen.py: weights cast once, not per call
        try:
            self._functions = {name: SignatureCall(fn, freeze=freeze)
                               for name, fn in self._loaded.signatures.items()}
        except Exception as e:
            if not freeze:
                raise
            raise ModelLoadError(  # as the deploy gate would: never served half-converted
                f"compute_precision {compute_precision} freezes each signature's weights into "
                f"constants at load, and TensorFlow could not freeze this model's "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); serve it "
                "in float32") from e
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
        if self._scope is None:
            return self._functions[signature](inputs)
        with self._scope():
            return self._functions[signature](inputs)


class SignatureCall:
    """One signature's concrete function, its argument order worked out once, at load time.

    `ConcreteFunction.__call__` binds keyword arguments to the function's type and casts each
    one to its TensorSpec on every call (~90 µs on a 2-core host, more than the tiny contract
    model's whole run). The binding's result only depends on the signature, so it is computed
    here once: a request whose arrays match the specs (same names and dtypes) goes straight to
    the function's flat call; anything else takes the public call, which raises TensorFlow's
    own error for it. Both run the same graph; no retracing either way.

    Shapes are not compared with the specs: as in TF Serving's session, which feeds the
    placeholders whatever was sent, the graph decides (`x` of shape `[3]` runs a `[-1, 1]`
    signature elementwise; a conv net refuses a missing batch dimension with its own error).
    Protocols that require the declared shapes (KServe V2) check them before this.
    """

    def __init__(self, fn, *, freeze: bool = False) -> None:
        import tensorflow as tf

        self.fn = fn
        self._constant = tf.constant
        self.fast = False
        self.runtime_call: RuntimeCall | None = None
        self.frozen = FrozenSignature(fn) if freeze else None
        try:
            self._order, self._specs = _flat_input_order(fn)
            self.fast = _has_flat_call(fn)
        except Exception as e:  # an unusual signature keeps the public call, nothing else
            log.info("signature %s: no fast call (%s)", getattr(fn, "name", "?"), e)
        if self.fast and self.frozen is None:
            try:
                self.runtime_call = RuntimeCall(fn)
            except Exception as e:  # the flat call stays: same graph, TF's Python around it
                log.info("signature %s: no runtime call (%s)", getattr(fn, "name", "?"), e)

    def __call__(self, inputs: dict) -> dict:
        flat = self._flat_tensors(inputs) if self.fast else None
        if self.frozen is not None:
            outputs = self.frozen(self.frozen.bind(inputs) if flat is None else flat)
        elif flat is None:
            outputs = self.fn(**inputs)
        else:
            outputs = self._call_flat(flat)
        return {key: value.numpy() for key, value in outputs.items()}

    def _call_flat(self, flat: list) -> dict:
        captured = self.fn.captured_inputs
        runtime_call = self.runtime_call
        if runtime_call is not None and runtime_call.applies(len(flat) + len(captured)):
            return runtime_call(flat, captured)  # runs the graph once, failing or not
        return self.fn._call_flat(flat, captured)

    def _flat_tensors(self, inputs: dict) -> list | None:
        """The inputs as the flat tensor list, or None when they do not match the specs."""
        if len(inputs) != len(self._order):
            return None
        flat = []
        for name, dtype in zip(self._order, self._specs, strict=True):
            value = inputs.get(name)
            if not isinstance(value, np.ndarray) or (
                    value.dtype != dtype if dtype is not None else value.dtype.kind not in "OS"):
                return None
            flat.append(self._constant(value))
        return flat


class RuntimeCall:
    """A signature's graph run by TensorFlow's runtime call, as `_call_flat` ends up doing.

    With no gradient tape and eager execution (every request in the server), a concrete
    function's `_call_flat` comes down to `context.call_function(name, inputs, n)` and packing
    the outputs into the signature's dict; the Python on the way (tape and distribution checks,
    a control-dependency scope) costs about 35 µs a call, a sixth of the tiny contract model's
    whole run (benchmarks/serving/signature_call.py, docs/explanation/serving-path.md). This
    makes that same runtime call, inside the same error-rewriting scope (so a failure inside
    the graph raises TensorFlow's own message, and the graph runs once either way), and the
    same packing. Anything else (a tape that could record, graph mode) takes `_call_flat`.
    """

    def __init__(self, fn) -> None:
        import tensorflow as tf
        from tensorflow.python.eager import record
        from tensorflow.python.eager.polymorphic_function.atomic_function import (
            InterpolateRuntimeError,
        )

        atomic = fn._inference_function
        function_type = atomic.function_type
        outputs = function_type.flat_outputs
        if any(o.dtype in (tf.resource, tf.variant) for o in outputs):
            raise ValueError("an output holds a resource or variant (handle data to set)")
        self._context = atomic._bound_context
        self._name = atomic.name
        self._count = len(outputs)
        self._arity = len(atomic.cached_definition.signature.input_arg)
        self._pack = function_type.pack_output
        self._could_record = record.could_possibly_record
        self._errors = InterpolateRuntimeError(atomic)
        if not callable(getattr(self._context, "call_function", None)):
            raise ValueError("no context.call_function in this TensorFlow")

    def applies(self, arity: int) -> bool:
        """Whether a call of `arity` tensors may skip `_call_flat` now: eager, no tape."""
        return (arity == self._arity and self._context.executing_eagerly()
                and not self._could_record())

    def __call__(self, flat: list, captured) -> dict:
        with self._errors:
            outputs = self._context.call_function(self._name, [*flat, *captured], self._count)
        return self._pack(outputs)


def _has_flat_call(fn) -> bool:
    """Whether `fn._call_flat(tensors, captured_inputs)` is there, as in TF 2.x up to 2.21.

    A private entry point: a TensorFlow that changes it leaves the public call in charge.
    """
    try:
        params = list(inspect.signature(fn._call_flat).parameters)
    except (AttributeError, TypeError, ValueError):
        return False
    return len(params) == 2 and params[1] == "captured_inputs"


def _flat_input_order(fn) -> tuple[list[str], list]:
    """The names of a signature's inputs in its flat order, and the numpy dtype of each.

    None: a string input (an object or bytes array).

    Found by binding one probe tensor per input exactly as `__call__` does and seeing where
    each lands, so the order is TensorFlow's own, not a guess about how it sorts.
    """
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function import function_type_utils

    args, specs = fn.structured_input_signature
    if args or not isinstance(specs, dict) or not all(
            isinstance(s, tf.TensorSpec) for s in specs.values()):
        raise ValueError("not a keyword-only signature of plain tensors")
    probes = {name: tf.zeros([d or 1 for d in _dims(spec) or ()], spec.dtype)
              for name, spec in specs.items()}
    bound = function_type_utils.canonicalize_function_inputs((), probes, fn.function_type)
    flat = fn.function_type.unpack_inputs(bound)
    by_id = {id(t): name for name, t in probes.items()}
    order = [by_id[id(t)] for t in flat]
    if sorted(order) != sorted(specs):
        raise ValueError("the flat inputs are not the signature's inputs")
    return order, [None if specs[name].dtype == tf.string else
                   np.dtype(specs[name].dtype.as_numpy_dtype) for name in order]


def _dims(spec) -> tuple | None:
    return tuple(spec.shape.as_list()) if spec.shape.rank is not None else None
