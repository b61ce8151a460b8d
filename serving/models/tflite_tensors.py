"""A TFLite model's signatures when its flatbuffer carries none, built as TF Serving builds them.

A model converted from a TF1 session (`TFLiteConverter.from_session`, as TF Serving's own
half_plus_two export does) has no SignatureDefs of its own, and LiteRT has no signature runner
for it. TF Serving's TFLite session serves it anyway (tflite_session.cc): it takes the
SignatureDefs stored in the model's `signature_defs_metadata` entry (a FlexBuffer map of key
-> serialized SignatureDef, as TFLite's `signature_def_util` writes it), each tensor name
resolved to one of the model's inputs or outputs (a TF name `x:0` is the legacy TFLite name
`x`); when there is no such entry it builds `serving_default` (method Predict) from the input
and output tensors, each keyed by its name without a `:N` suffix. A `TensorRunner` then runs a
signature on the interpreter's tensors by index, each input resized to the shape sent: the
graph decides shapes, as for a SavedModel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ampflow.errors import ModelLoadError
from ampflow.serving.model_format import DEFAULT_SIGNATURE

SIGNATURE_DEFS_METADATA = "signature_defs_metadata"  # TFLite's kSignatureDefsMetadataName


def legacy_name(tensor_name: str) -> str:
    """A TF tensor name as early TFLite converters wrote it: `x:0` -> `x`."""
    return tensor_name.split(":", 1)[0]


def tensor_signatures(interpreter, file: Path) -> dict[str, tuple[dict, dict, object]]:
    """Each signature: key -> (input details, output details by key, SignatureDef or None).

    The SignatureDefs of `signature_defs_metadata` when the model has that entry, else one
    `serving_default` from the tensor names (None: the caller writes its SignatureDef from the
    details, as for a converter signature). ModelLoadError when a stored SignatureDef names a
    tensor the model does not have, or two tensors share a key.
    """
    inputs = _by_name(interpreter.get_input_details(), "input")
    outputs = _by_name(interpreter.get_output_details(), "output")
    stored = read_signature_defs_metadata(file.read_bytes(), file.name)
    if not stored:
        return {DEFAULT_SIGNATURE: (_by_key(inputs, "input"), _by_key(outputs, "output"),
                                    None)}
    found = {}
    for key, sig in stored.items():
        found[key] = (_resolve(sig.inputs, inputs, key, "input"),
                      _resolve(sig.outputs, outputs, key, "output"), sig)
    return found


def _by_name(details: list[dict], what: str) -> dict[str, dict]:
    named = {}
    for detail in details:
        if not detail["name"] or detail["name"] in named:
            raise ModelLoadError(f"every {what} tensor of a TFLite model without signatures must "
                                 f"have its own name. Received: {detail['name']!r} at tensor "
                                 f"index {detail['index']}")
        named[detail["name"]] = detail
    return named


def _by_key(named: dict[str, dict], what: str) -> dict[str, dict]:
    keyed = {}
    for name, detail in named.items():
        key = legacy_name(name)
        if key in keyed:
            raise ModelLoadError(f"two {what} tensors of this TFLite model have the key {key!r} "
                                 f"once ':N' is dropped, as TF Serving keys them. Received: "
                                 f"{keyed[key]['name']!r} and {name!r}")
        keyed[key] = detail
    return keyed


def _resolve(infos, named: dict[str, dict], signature: str, what: str) -> dict[str, dict]:
    """Each TensorInfo's tensor (by its name, else its legacy name); its name fixed in place."""
    resolved = {}
    for key, info in infos.items():
        name = info.name if info.name in named else legacy_name(info.name)
        if name not in named:
            raise ModelLoadError(
                f"signature {signature!r} {what} {key!r} must name one of the model's {what} "
                f"tensors {sorted(named)}. Received: {info.name!r}")
        info.name = name
        resolved[key] = named[name]
    return resolved


def read_signature_defs_metadata(model: bytes, where: str = "model") -> dict:
    """The SignatureDefs of a flatbuffer's `signature_defs_metadata` entry ({} if none)."""
    from flatbuffers import flexbuffers
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow.lite.python import schema_py_generated as schema

    try:
        root = schema.Model.GetRootAs(model, 0)
        entry = next((root.Metadata(i) for i in range(root.MetadataLength())
                      if root.Metadata(i).Name() == SIGNATURE_DEFS_METADATA.encode()), None)
        if entry is None:
            return {}
        data = root.Buffers(entry.Buffer()).DataAsNumpy()
        stored = flexbuffers.GetRoot(bytes(data)).AsMap
        return {key.AsKey: meta_graph_pb2.SignatureDef.FromString(_bytes(value))
                for key, value in zip(stored.Keys, stored.Values, strict=True)}
    except Exception as e:  # flatbuffers/flexbuffers/protobuf raise their own internal types
        raise ModelLoadError(f"{where}: invalid SignatureDefs in its {SIGNATURE_DEFS_METADATA} "
                             f"(TF Serving refuses them too): {type(e).__name__}: {e}") from e


def _bytes(value) -> bytes:
    return bytes(value.AsStringBytes if value.IsString else value.AsBlob)


class TensorRunner:
    """Runs one signature on an interpreter's tensors by index (no signature runner needed).

    Called like LiteRT's signature runner (`runner(**feed)` -> outputs by key); the caller holds
    the interpreter's lock. An input of another shape than the tensor's resizes it (TF
    Serving's session does the same); a shape the graph cannot take is a ValueError, which the
    core answers as INVALID_ARGUMENT, and the tensors are put back as they were.
    """

    def __init__(self, interpreter, inputs: dict[str, dict], outputs: dict[str, dict]) -> None:
        self._interpreter = interpreter
        self._inputs = {key: detail["index"] for key, detail in inputs.items()}
        self._outputs = {key: detail["index"] for key, detail in outputs.items()}
        self._shapes = {d["index"]: tuple(int(s) for s in d["shape"]) for d in inputs.values()}

    def __call__(self, **feed: np.ndarray) -> dict[str, np.ndarray]:
        """Set each input (resized when its shape differs), invoke, copy the outputs out."""
        interpreter = self._interpreter
        try:
            self._resize({self._inputs[key]: value.shape for key, value in feed.items()})
            for key, value in feed.items():
                interpreter.set_tensor(self._inputs[key], value)
            interpreter.invoke()
        except (RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()
            raise ValueError(f"the TFLite model cannot run on these inputs: "
                             f"{first[0] if first else type(e).__name__}") from e
        return {key: np.array(interpreter.get_tensor(index))
                for key, index in self._outputs.items()}

    def _resize(self, shapes: dict[int, tuple]) -> None:
        changed = {index: shape for index, shape in shapes.items()
                   if tuple(shape) != self._shapes[index]}
        if not changed:
            return
        previous = dict(self._shapes)
        try:
            for index, shape in changed.items():
                self._interpreter.resize_tensor_input(index, list(shape), strict=False)
                self._shapes[index] = tuple(shape)
            self._interpreter.allocate_tensors()
        except (RuntimeError, ValueError):
            for index, shape in previous.items():  # a usable interpreter for the next call
                self._interpreter.resize_tensor_input(index, list(shape), strict=False)
            self._shapes = previous
            self._interpreter.allocate_tensors()
            raise
