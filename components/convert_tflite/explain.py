"""Turn a TFLite converter failure into one `ConversionError` that names the op, why, and the fix.

The MLIR converter fails with pages of `loc(callsite(fused[...]))` notes. What a user needs is
in a few places: the structured `ConverterError.errors` (op name + error code, TF >= 2.7) and,
in the text, the op's tensor types (`tensor<?x8x8x1xf16>` says the graph computes in float16).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ampflow.errors import ConversionError

_OP_ERROR = re.compile(r"'(tf\.[A-Za-z0-9_]+)' op is neither a custom op nor a flex op")
_CODE = re.compile(r"Error code: (ERROR_[A-Z_]+)")
_HALF_TYPE = re.compile(r"tensor<[^>]*x?(f16|bf16)>")
_MAX_OPS_LISTED = 6

# Reasons and fixes by cause; each is one or two sentences a user can act on.
_MIXED = (
    "the SavedModel's graph computes in {dtype} (it was exported from a model built under a "
    "mixed_{dtype} Keras policy), and TFLite's builtin kernels take float32 or quantized int8 "
    "activations, not {dtype} ones.",
    "export from the float32 twin: rebuild the same architecture under the 'float32' policy "
    "(ampflow.modeling.models.build_model(..., policy='float32')), copy the weights "
    "with set_weights(model.get_weights()) (they are float32 under every policy) and export "
    "that model (`ampflow export` does this). For half-size weights convert the twin to the "
    "'float16' variant.",
)
_FLEX = (
    "the op has no TFLite builtin kernel.",
    "replace the op with one TFLite supports (see the TFLite op compatibility list), or convert "
    "with Select TF ops (tf.lite.OpsSet.SELECT_TF_OPS), which needs the Flex delegate linked "
    "into the app on the device (several MB).",
)
_CUSTOM = (
    "the op is a custom op that TFLite does not know.",
    "register a custom TFLite kernel for it (allow_custom_ops=True at conversion), or build the "
    "model from builtin ops.",
)
_VARIABLES = (
    "the SavedModel's variables were not frozen into constants: the exported tf.Module tracks "
    "the Keras model (or its Keras 3 variable wrappers), so the converter keeps them as "
    "resource variables (VAR_HANDLE/READ_VARIABLE) with no values in the .tflite; the model "
    "returns NaN and calibration fails.",
    "track the tf.Variables behind the Keras variables on the exported module "
    "(`module.model_variables = [v.value for v in model.variables]`, the model itself only "
    "captured by the signature function), or export with keras.export.ExportArchive / "
    "model.export(), which do that.",
)


@dataclass(frozen=True)
class ConversionFailure:
    """What went wrong in one conversion, parsed out of the converter's error."""

    ops: tuple[str, ...]
    error_code: str
    half_dtype: str | None
    first_line: str


def parse_converter_error(exc: BaseException) -> ConversionFailure:
    """Extract op names, the error code and any float16/bfloat16 compute from a converter error."""
    text = str(exc)
    ops: list[str] = []
    codes: list[str] = []
    for data in getattr(exc, "errors", None) or ():
        name = getattr(getattr(data, "operator", None), "name", "")
        if name and name not in ops:
            ops.append(name)
        code = _error_code_name(data)
        if code:
            codes.append(code)
        text += "\n" + getattr(data, "error_message", "")
    for name in _OP_ERROR.findall(text):
        if name not in ops:
            ops.append(name)
    codes += _CODE.findall(text)
    half = _HALF_TYPE.findall(text)
    half_dtype = None
    if half:
        half_dtype = "bfloat16" if "bf16" in half else "float16"
    code = codes[0] if codes else ("READ_VARIABLE" if "read_variable" in text.lower() else "")
    return ConversionFailure(tuple(ops), code, half_dtype, _first_line(text))


def explain_conversion_error(exc: BaseException, *, variant: str, source: str) -> ConversionError:
    """Build the `ConversionError` to raise (`from exc`) for a failed conversion of `source`."""
    failure = parse_converter_error(exc)
    reason, fix = _reason_and_fix(failure)
    ops = ", ".join(op.removeprefix("tf.") for op in failure.ops[:_MAX_OPS_LISTED])
    if len(failure.ops) > _MAX_OPS_LISTED:
        ops += f" (+{len(failure.ops) - _MAX_OPS_LISTED} more)"
    what = f"op(s) {ops}" if ops else "the model"
    code = f" [{failure.error_code}]" if failure.error_code else ""
    return ConversionError(
        f"TFLite conversion of {source} to the {variant!r} variant failed{code}: {what} could not "
        f"be converted because {reason} Fix: {fix}"
    )


def explain_unfrozen_variables(*, variant: str, source: str) -> ConversionError:
    """The error for a converted model that still holds resource variables (see _VARIABLES)."""
    return ConversionError(
        f"TFLite conversion of {source} to the {variant!r} variant produced a model that "
        f"cannot run [READ_VARIABLE]: {_VARIABLES[0]} Fix: {_VARIABLES[1]}"
    )


def _reason_and_fix(failure: ConversionFailure) -> tuple[str, str]:
    if failure.half_dtype:
        dtype = failure.half_dtype
        return _MIXED[0].format(dtype=dtype), _MIXED[1]
    if failure.error_code == "ERROR_NEEDS_FLEX_OPS":
        return _FLEX
    if failure.error_code == "ERROR_NEEDS_CUSTOM_OPS":
        return _CUSTOM
    if failure.error_code == "READ_VARIABLE":
        return _VARIABLES
    return (
        f"the converter reported: {failure.first_line}",
        "check that the SavedModel's signature takes and returns float32 tensors and runs only "
        "TFLite builtin ops; rerun with --log-level DEBUG to see the converter's full output.",
    )


def _error_code_name(data) -> str:
    code = getattr(data, "error_code", 0)
    enum = getattr(data, "ErrorCode", None)
    if not code or enum is None:
        return ""
    try:
        return enum.Name(code)
    except ValueError:
        return ""


def _first_line(text: str, limit: int = 300) -> str:
    """The first line that says something: MLIR location prefixes removed, length bounded."""
    for line in text.splitlines():
        line = _strip_location(re.sub(r"^(<unknown>:0: )?(error: )?", "", line.strip()))
        if line and not line.startswith("note:"):
            return line[:limit]
    return text[:limit].strip()


def _strip_location(line: str) -> str:
    """Drop a leading `loc(...)` (nested parentheses) and the colon after it."""
    if not line.startswith("loc("):
        return line
    depth = 0
    for i, char in enumerate(line):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char == ")":
            return line[i + 1 :].lstrip(": ").strip()
    return ""
