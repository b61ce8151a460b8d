"""A signature with its variables frozen into constants: how a bfloat16 model stops re-casting.

Under `--compute-precision bfloat16` a variable weight is cast to bfloat16 on every call;
frozen into a constant (TensorFlow's `convert_variables_to_constants_v2`), the cast is folded
once at instantiation. The frozen function keeps the signature's inputs, then every captured
resource that is not a variable (text models' lookup tables), and packs its outputs back into
the signature's dict. Its memory and load-time cost, measured: docs/explanation/design-notes.md,
"frozen.py".
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
