"""TF Serving's REST JSON <-> the core's inputs and outputs, as TF Serving's `util/json_tensor.cc`.

Requests: `instances` (row format) or `inputs` (columnar) become declared inputs of
`InferenceCore.infer` (shape and types read from the JSON, arrays built after the core's
checks), typed by the signature (no silent bool->number or string->number); classify's
`examples` (+ `context`) become tf.Examples; `{"b64": ...}` carries bytes. Responses: float32
as the shortest decimal that reads back to it, bytes as text or `{"b64"}` for outputs whose
name ends in `_bytes`. Every malformed value is an INVALID_ARGUMENT with TF Serving's text.
"""

from __future__ import annotations

import base64
import binascii
import json
import math

import grpc
import numpy as np
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow.core.framework import types_pb2

from ampflow.serving.core import dtypes
from ampflow.serving.core.inference import Declared, LazyInput
from ampflow.serving.model_format import IMAGE_BYTES_SIGNATURE
from ampflow.serving.status import ServingStatusError, clip
from ampflow.serving.status import invalid_argument as invalid

_INT_DTYPES = {types_pb2.DT_INT8, types_pb2.DT_UINT8, types_pb2.DT_INT16, types_pb2.DT_UINT16,
               types_pb2.DT_INT32, types_pb2.DT_INT64, types_pb2.DT_UINT32, types_pb2.DT_UINT64}
_FLOAT_DTYPES = {types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_HALF}


# ---- JSON -> declared inputs ------------------------------------------------------------------

def parse_object(body: bytes) -> dict:
    """The request body as a JSON object; TF Serving's parse errors otherwise."""
    if not body:
        raise invalid("JSON Parse error: The document is empty")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
        raise invalid(f"JSON Parse error: {clip(e, 200)}") from None
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {_debug(doc)} Is not object")
    return doc


def signature_name(doc: dict) -> str:
    """The optional `signature_name` (a string, "" when absent)."""
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid(f"JSON Value: {_debug(doc)} not formatted correctly. 'signature_name' "
                      "key must be a string value.")
    return name


def _debug(value) -> str:
    """A JSON value for an error message: at most 256 characters, as TF Serving."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(type(value))
    return clip(text, 256)


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def json_inputs(doc: dict, infos: dict) -> tuple[list[LazyInput], bool]:
    """The declared inputs of `instances` (row format: True) or of `inputs` (False)."""
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise invalid(f"JSON Value: {_debug(doc)} Not formatted correctly expecting only one "
                      "of 'inputs' or 'instances' keys to exist ")
    if not infos:
        raise invalid("Failed to get input map for signature")
    if has_instances:
        instances = doc["instances"]
        if not isinstance(instances, list):
            raise invalid(f"JSON Value: {_debug(doc)} Expecting 'instances' to be an "
                          "list/array")
        if not instances:
            raise invalid(f"JSON Value: {_debug(doc)} No values in 'instances' array")
        objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
        if not objects:
            return [_only_input(infos, instances, "instances is a plain list, but expecting "
                                "list of objects as multiple input tensors required as per "
                                "tensorinfo_map")], True
        for i, item in enumerate(instances):
            if not isinstance(item, dict) or _is_b64(item):
                raise invalid(f"Expecting object but got list at item {i} of input list")
            if set(item) != set(infos):
                raise invalid(f"Failed to process element: {i} of 'instances' list. JSON "
                              f"object: {_debug(item)} keys must be equal to: "
                              f"{','.join(sorted(infos))}")
        return [_tensor(name, [item[name] for item in instances], info.dtype)
                for name, info in infos.items()], True
    if has_inputs:
        value = doc["inputs"]
        if not isinstance(value, dict) or _is_b64(value):
            return [_only_input(infos, value, "inputs is a plain value/list, but expecting an "
                                "object as multiple input tensors required as per "
                                "tensorinfo_map")], False
        for name in infos:
            if name not in value:
                raise invalid(f"Missing named input: {clip(name)} in 'inputs' object.")
        return [_tensor(name, value[name], info.dtype) for name, info in infos.items()], False
    raise invalid("Missing 'inputs' or 'instances' key")


def _only_input(infos: dict, value, refusal: str) -> LazyInput:
    """`value` as the one input of a single-input signature; `refusal` if it has several."""
    if len(infos) > 1:
        raise invalid(refusal)
    (name, info), = infos.items()
    return _tensor(name, value, info.dtype)


def _tensor(name: str, value, dtype: int) -> LazyInput:
    """A dense JSON value (nested lists) as a declared input of the signature's dtype.

    The shape comes from the first element at each level; every list must match it, and
    every leaf must be of the dtype's JSON type (no silent bool->number or string->number).
    The array is built only once the core has checked the declared shape and size.
    """
    dims, probe = [], value
    while isinstance(probe, list):
        dims.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    leaves = [value]
    for level, size in enumerate(dims):
        flat = []
        for item in leaves:
            if not isinstance(item, list):
                raise invalid(f"JSON Value: {_debug(item)} found at incorrect level: "
                              f"{level + 1} in the JSON DOM. Expected at level: {len(dims)}")
            if len(item) != size:
                raise invalid(f"Encountered list at unexpected size: {len(item)} at level: "
                              f"{level} expected size: {size}")
            flat.extend(item)
        leaves = flat
    shape = tuple(dims)
    if dtype == types_pb2.DT_STRING:
        sizes = [_string_size(leaf) for leaf in leaves]
        nbytes = len(sizes) * dtypes.OBJECT_ITEM_BYTES + sum(sizes)
        return LazyInput(name, Declared(dtype, shape, nbytes, max(sizes, default=0)),
                         lambda: _object_array([_string_leaf(leaf) for leaf in leaves], shape))
    kinds = set(map(type, leaves))
    if list in kinds:
        raise invalid(f"Encountered list at unexpected level: {len(dims)} expected < "
                      f"{len(dims)} (tensor {clip(name)})")
    expected = ({int, float} if dtype in _FLOAT_DTYPES else {int} if dtype in _INT_DTYPES
                else {bool} if dtype == types_pb2.DT_BOOL else None)
    if expected is None:
        raise ServingStatusError(grpc.StatusCode.UNIMPLEMENTED,
                                 f"Conversion of JSON to type {dtypes.dtype_name(dtype)} of "
                                 f"input {clip(name)} is not supported")
    if not kinds <= expected:
        bad = next(leaf for leaf in leaves if type(leaf) not in expected)
        raise invalid(f"JSON Value: {_debug(bad)} Type: {_json_type(bad)} is not of expected "
                      f"type: {dtypes.dtype_name(dtype)[3:].lower()}{_b64_hint(bad, name)}")
    np_dtype = dtypes.numpy_dtype(dtype)
    return LazyInput(name, Declared(dtype, shape, len(leaves) * np_dtype.itemsize),
                     lambda: _numeric_array(name, leaves, dtype, shape))


def _numeric_array(name: str, leaves: list, dtype: int, shape: tuple) -> np.ndarray:
    np_dtype = dtypes.numpy_dtype(dtype)
    try:
        array = np.asarray(leaves, dtype=np_dtype) if leaves else np.zeros(0, np_dtype)
    except OverflowError:
        raise invalid(f"a value of input {clip(name)} does not fit "
                      f"{dtypes.dtype_name(dtype)}") from None
    return array.reshape(shape)


def _object_array(items: list[bytes], shape: tuple) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def _b64_hint(leaf, name: str) -> str:
    """What to do with encoded bytes sent to a numeric input: the encoded-image signature."""
    if not _is_b64(leaf):
        return ""
    return (f" (input {clip(name)} takes numbers; {{\"b64\": ...}} carries encoded bytes, "
            f"which a string input takes: an encoded image goes to the "
            f"\"{IMAGE_BYTES_SIGNATURE}\" signature, \"signature_name\": "
            f"\"{IMAGE_BYTES_SIGNATURE}\")")


def _string_size(leaf) -> int:
    """The bytes a string leaf will hold, known before it is encoded or decoded.

    A JSON string is its UTF-8 (an ASCII one: its length, read without encoding); `{"b64"}`
    the decoded length its base64 text implies (checked when it is decoded). Anything else
    is refused here with TF Serving's text, before the core looks at sizes.
    """
    if isinstance(leaf, str):
        return len(leaf) if leaf.isascii() else len(_utf8(leaf))
    if _is_b64(leaf):
        text = leaf["b64"]
        return len(text) * 3 // 4 - text[-2:].count("=")
    return len(_string_leaf(leaf))  # raises: not a string


def _utf8(text: str) -> bytes:
    """A JSON string as UTF-8; a lone surrogate is the caller's INVALID_ARGUMENT.

    JSON allows an escape of half a surrogate pair, which UTF-8 cannot hold: refused in words,
    never a server error.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid("JSON string is not valid Unicode (a lone surrogate escape); send bytes "
                      'that are not UTF-8 text as {"b64": ...}') from None


def _string_leaf(leaf) -> bytes:
    if isinstance(leaf, str):
        return _utf8(leaf)
    if _is_b64(leaf):
        try:
            return base64.b64decode(leaf["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise invalid("Unable to base64 decode") from None
    if isinstance(leaf, dict):
        raise invalid(f"JSON Value: {_debug(leaf)} not formatted correctly for base64 data")
    raise invalid(f"JSON Value: {_debug(leaf)} Type: {_json_type(leaf)} is not of expected "
                  "type: string")


def _json_type(value) -> str:
    return {bool: "True" if value else "False", int: "Number", float: "Number", str: "String",
            list: "Array", dict: "Object", type(None): "Null"}.get(type(value), "Unknown")


def fill_examples(doc: dict, request, max_rows: int) -> None:
    """`examples` (+ `context`) as tf.Examples, as FillClassifyRegressRequestFromJson."""
    if "context" in doc:
        _example(doc["context"], request.input.example_list_with_context.context)
        target = request.input.example_list_with_context.examples
    else:
        target = request.input.example_list.examples
    examples = doc.get("examples")
    if examples is None:
        raise invalid(f"JSON Value: {_debug(doc)} When method is classify, key 'examples' is "
                      "expected and was not found")
    if not isinstance(examples, list):
        raise invalid(f"JSON Value: {_debug(doc)} Expecting 'examples' value to be an "
                      "list/array")
    if not examples:
        raise invalid(f"JSON Value: {_debug(doc)} 'examples' value is an empty array")
    if max_rows and len(examples) > max_rows:  # checked again by the core; refuse before work
        raise invalid(f"Input has {len(examples)} examples; this server takes at most "
                      f"{max_rows} per request (--max-request-batch-size)")
    for item in examples:
        _example(item, target.add())


def _example(value, example: example_pb2.Example) -> None:
    if not isinstance(value, dict):
        raise invalid(f"Example must be JSON object but got JSON {_json_type(value)}")
    for name, content in value.items():
        feature = feature_pb2.Feature()
        for item in content if isinstance(content, list) else [content]:
            _add_feature_value(name, item, feature)
        example.features.feature[name].CopyFrom(feature)


def _add_feature_value(name: str, value, feature: feature_pb2.Feature) -> None:
    kind = feature.WhichOneof("kind")

    def need(wanted: str) -> None:
        if kind not in (None, wanted):
            raise invalid(f"Unexpected element type in feature: {clip(name)} "
                          f"expecting type: {kind.split('_')[0]}")

    if isinstance(value, bool):
        need("int64_list")
        feature.int64_list.value.append(int(value))
    elif isinstance(value, int):
        need("int64_list")
        if not -2 ** 63 <= value < 2 ** 63:
            raise invalid(f"Feature: {clip(name)} has uint64_t element. Only int64_t "
                          "is supported.")
        feature.int64_list.value.append(value)
    elif isinstance(value, float):
        need("float_list")
        feature.float_list.value.append(value)
    elif isinstance(value, str) or _is_b64(value):
        need("bytes_list")
        feature.bytes_list.value.append(_string_leaf(value))
    else:
        raise invalid(f"Feature: {clip(name)} has element with unexpected JSON type: "
                      f"{_json_type(value)}")


# ---- response tensors -> JSON ---------------------------------------------------------------

def float32_json(value: float) -> float:
    """A float32 as the shortest decimal that reads back to it (TF Serving's WriteDecimal)."""
    return float(np.float32(value).astype(str)) if math.isfinite(value) else value


_JSON_KINDS = "fiubO"  # float, signed, unsigned, bool, bytes: what JSON can carry


def _json_values(name: str, array: np.ndarray):
    """Nested lists of JSON values: float32 shortest, bytes as text or `{"b64"}` (`_bytes`).

    An output of a dtype JSON has no value for (complex64, bfloat16) is the caller's
    INVALID_ARGUMENT, with TF Serving's words (json_tensor.cc): the model ran, but this
    request asked for it over REST; gRPC carries it.
    """
    if array.dtype.kind not in _JSON_KINDS:
        raise invalid(f"Failed to write JSON value for tensor type: {array.dtype.name} "
                      f"(output {clip(name)}; gRPC's Predict carries it)")
    if array.dtype == np.object_:
        as_b64 = name.endswith("_bytes")
        flat = [({"b64": base64.b64encode(v).decode()} if as_b64 else
                 v.decode("utf-8", "replace")) for v in array.ravel()]
        return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim \
            else flat[0]
    if array.dtype == np.float32 or array.dtype == np.float16:
        return array.astype(str).astype(np.float64).tolist()
    return array.tolist()


def row_json(outputs: dict[str, np.ndarray]) -> dict:
    """`predictions`: one entry per row (an object per row when there are several outputs)."""
    batch = {a.shape[0] if a.ndim else None for a in outputs.values()}
    if None in batch or len(batch) != 1:
        raise invalid(f"outputs have inconsistent or no batch sizes: "
                      f"{ {k: list(v.shape) for k, v in outputs.items()} }")
    values = {name: _json_values(name, array) for name, array in sorted(outputs.items())}
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    rows = batch.pop()
    return {"predictions": [{name: v[i] for name, v in values.items()} for i in range(rows)]}


def columnar_json(outputs: dict[str, np.ndarray]) -> dict:
    """`outputs`: one value (a single output) or an object keyed by output name."""
    values = {name: _json_values(name, array) for name, array in sorted(outputs.items())}
    return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
