"""A signature with its variables frozen into constants: how a bfloat16 model stops re-casting.

Under `--compute-precision bfloat16` grappler's oneDNN rewrite puts a Cast to bfloat16 after
every weight a MatMul or Conv2D reads. When the weight is a variable (a SavedModel's are), that
Cast runs on every call: ResNet-50 casts its 108 weight tensors (~25 M values) for each request,
which made one image slower in bfloat16 than in float32 (benchmarks/results/serving_bf16*.md).
When the weight is a constant, grappler's constant folding computes Cast(Const) once, when the
function is instantiated, and the call reads a bfloat16 constant: the per-call cost is gone, and
oneDNN also sees constant filters. So a bfloat16 version's signatures are frozen at load with
TensorFlow's own `convert_variables_to_constants_v2` (what TF-TRT and the TFLite converter use),
not cast by hand: the weights are the version's, bit for bit, and the graph is TF's.

What the frozen function keeps:
- inputs: the signature's own, in their flat order, then every captured resource that is not a
  variable (a TextVectorization's lookup table, a StringLookup's), passed as the live handles
  of the loaded model, which therefore stays loaded: text models keep working;
- outputs: TF's wrapped function returns a flat list, packed back into the signature's dict.

Cost, measured on ResNet-50 96² (94 MB of float32 weights; benchmarks/serving_bf16.py, a
2-core Xeon under load): the weights live several times over while the version is loaded (the
variables, the frozen graph's constants in Python and in the runtime's function library, the
instantiated graph's float32 and folded bfloat16 constants, oneDNN's reordered filters):
715-854 MB live once warm, against 70-86 MB in float32 (results/serving_bf16_run2.md), and the
raw RSS rises about 1.7 GB while it loads; after an unload the process is back at the same
level every time (a swap does not grow it). Loading takes a freeze pass (16-28 s against 7 s
there) and the first call grappler's folding (8-12 s against 3 s): the version's warm-up
requests pay it before it is served.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

VARIABLE_OPS = frozenset({"ReadVariableOp", "ResourceGather", "VarHandleOp",
                          "VariableShape", "ResourceGatherNd"})


class FrozenSignature:
    """A signature's concrete function, its variables as constants; called with flat tensors."""

    def __init__(self, fn) -> None:
        from tensorflow.python.framework import convert_to_constants

        self._function_type = fn.function_type
        self._structure = fn.structured_outputs
        own = len(fn.inputs) - len(fn.captured_inputs)
        live = {t.name: handle for t, handle in zip(fn.graph.internal_captures,
                                                    fn.captured_inputs, strict=True)}
        self.fn = convert_to_constants.convert_variables_to_constants_v2(fn)
        names = [t.name for t in self.fn.inputs]
        if names[:own] != [t.name for t in fn.inputs[:own]]:
            raise ValueError(f"the frozen function's inputs {names} do not start with the "
                             "signature's own")
        self._kept = [live[name] for name in names[own:]]  # lookup tables: the live handles
        self.variable_ops = sorted({op.type for op in self.fn.graph.get_operations()
                                    if op.type in VARIABLE_OPS})

    def bind(self, inputs: dict) -> list:
        """The inputs as the signature's flat tensors, by TF's own binding (its errors)."""
        from tensorflow.python.eager.polymorphic_function import function_type_utils

        bound = function_type_utils.canonicalize_function_inputs((), inputs, self._function_type)
        return list(self._function_type.unpack_inputs(bound))

    def __call__(self, flat: list) -> dict:
        """Run the frozen graph on the signature's flat input tensors; the signature's dict."""
        from tensorflow.python.util import nest

        outputs = self.fn._call_flat([*flat, *self._kept], self.fn.captured_inputs)
        return nest.pack_sequence_as(self._structure, outputs, expand_composites=True)
