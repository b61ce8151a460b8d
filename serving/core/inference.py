"""The data plane of the server, one for every protocol: `InferenceCore.infer`.

A protocol adapter (TF Serving's gRPC and REST APIs, KServe V2's REST and gRPC, the warm-up
replay) parses its wire format into an `InferRequest`: the model, a version or label, the
signature, the inputs as each was *declared* (name, dtype, shape, decoded size) with a way to
build its array, and the outputs asked for. The core resolves the version, checks every
declared input against the signature and the limits once, before any array is built, builds
the arrays, runs the signature (through server-side batching when it is on) and returns the
outputs as numpy arrays, which the adapter writes in its own format. This is the shape of
KServe's model server: one data plane, thin protocol adapters. Each protocol words its errors
in its own vocabulary (`Dialect`: TF Serving's `DT_FLOAT`, V2's `FP32`); the codes are TF
Serving's everywhere. Nothing here knows a tensor name: they come from the SignatureDefs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from typing import Protocol

import grpc
import numpy as np

from ampflow.serving.core import dtypes, tokens
from ampflow.serving.model_format import DEFAULT_SIGNATURE
from ampflow.serving.models.registry import ModelRegistry
from ampflow.serving.models.servable import Servable
from ampflow.serving.status import ServingStatusError, VersionState, clip, scrub_paths

log = logging.getLogger(__name__)

UNKNOWN_LABEL = "<unknown>"  # the metric label of any name or version the server does not know

Runner = Callable[[Servable, str, dict, "float | None"], dict]
# What each transport reports of every call: model, version, method, code, seconds.
Observer = Callable[[str, str, str, grpc.StatusCode, float], None]


def _direct_run(servable: Servable, signature: str, inputs: dict, _timeout) -> dict:
    return servable.run(signature, inputs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """What one request may cost, checked before anything is decoded or run.

    Built by keyword only: four ints in a row are too easy to pass in the wrong order.

    `max_bytes`: decoded input tensors (all inputs together; a string tensor counts its strings'
    bytes, e.g. the encoded images of `image_bytes`), and Classify examples with their context
    merged in; `max_rows`: the batch (first dimension) of a batched input, and the
    number of Classify examples (0 = no cap). Strings (raw text for a text model's `text`,
    encoded images): `max_string_bytes` bounds each one (0 = no cap), `max_strings` how many
    all string inputs of a request hold together (0 = no cap); both are read from the lengths
    the request declares, before any string is copied into an array. A text model's requests
    (serving/core/tokens.py): `max_tokens` bounds the tokens one may run after padding (0 = no
    cap), and one of more than `slice_tokens` runs in slices of rows that hold at most that
    many (0 = in one run), so one run's memory is bounded whatever the request's size.
    """

    max_bytes: int = 64 * 1024 * 1024
    max_rows: int = 0
    max_string_bytes: int = 0
    max_strings: int = 0
    max_tokens: int = 0
    slice_tokens: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReloadPolicy:
    """Who may use HandleReloadConfigRequest.

    Off unless the operator allows it, and then only for base paths under `roots` (none given:
    only the base paths configured at start).
    """

    allowed: bool = False
    roots: tuple[Path, ...] = ()


@dataclasses.dataclass(frozen=True)
class Declared:
    """An input as its request declares it: TensorFlow dtype enum, shape, decoded bytes.

    `longest`: the bytes of its longest string element (0 for numbers), read from the lengths
    on the wire, so that one oversized string is refused before anything is built; or
    `measure_longest`, which reads them only once the string count has passed the limits
    (V2's raw BYTES, whose lengths are prefixes to walk).
    """

    dtype: int
    shape: tuple[int, ...]
    nbytes: int
    longest: int = 0
    measure_longest: Callable[[], int] | None = None

    def longest_string(self) -> int:
        """Bytes of the longest string element (0 for numbers)."""
        return self.measure_longest() if self.measure_longest is not None else self.longest


class InferInput(Protocol):
    """One input of a request, parsed from the wire but not yet built into an array.

    `declare(expected_dtype)` checks what the wire itself requires (a known dtype, a valid
    shape) and says what the input will be; `build()` makes the array, and is called only once
    every input has passed the signature and the limits.
    """

    name: str

    def declare(self, expected_dtype: int) -> Declared: ...

    def build(self) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class LazyInput:
    """An `InferInput` whose declaration is already known (a JSON body, a V2 tensor)."""

    name: str
    declared: Declared
    make: Callable[[], np.ndarray]

    def declare(self, expected_dtype: int) -> Declared:  # noqa: ARG002 - the protocol's
        """What was declared when the wire was parsed."""
        return self.declared

    def build(self) -> np.ndarray:
        """The array, built now."""
        return self.make()


def tf_serving_inputs_text(sent: set[str], expected: set[str]) -> str:
    """TF Serving's wording of inputs that do not match the signature."""
    return (f"input size does not match signature: {len(sent)}!={len(expected)} "
            f"len({_names(sent)}) vs len({_names(expected)}). "
            f"Sent extra: {_names(sent - expected)}. Missing but required: "
            f"{_names(expected - sent)}.")


@dataclasses.dataclass(frozen=True)
class Dialect:
    """How a protocol words the core's refusals, and whether the graph decides input shapes.

    `type_name`: its dtype names; `inputs_text`: its input-set message. `graph_shapes`: TF
    Serving checks an input's name and dtype, never its shape against the SignatureDef
    (predict_util.cc): the graph runs on what was sent and refuses what it cannot take, so
    `x` sent as `[3]` to a `[-1, 1]` signature runs. KServe V2 (Triton) checks the shape.
    """

    type_name: Callable[[int], str] = dtypes.dtype_name
    inputs_text: Callable[[set[str], set[str]], str] = tf_serving_inputs_text
    graph_shapes: bool = True


TF_SERVING = Dialect()


@dataclasses.dataclass
class InferRequest:
    """A request in no protocol's terms. `servable` set: that version, unresolved (warm-up)."""

    model: str
    version: int | None = None
    label: str | None = None
    signature: str = ""
    inputs: Sequence[InferInput] = ()
    outputs: Sequence[str] = ()
    servable: Servable | None = None


@dataclasses.dataclass(frozen=True)
class InferResponse:
    """The version that ran, its signature's name, and the outputs asked for, in order."""

    servable: Servable
    signature: str
    outputs: dict[str, np.ndarray]


class InferenceCore:
    """Resolves, checks and runs requests of every protocol, with TF Serving's codes."""

    def __init__(self, registry: ModelRegistry, runner: Runner | None = None,
                 limits: RequestLimits | None = None,
                 reload_policy: ReloadPolicy | None = None, *,
                 method_name_check: bool = False) -> None:
        self.registry = registry
        self.runner = runner or _direct_run
        self.limits = limits or RequestLimits()
        self.reload_policy = reload_policy or ReloadPolicy()
        # TF Serving's --enable_signature_method_name_check: Classify/Regress check method names
        self.method_name_check = method_name_check

    # ---- the models' state: what readiness, metadata, status and reloads ask -------------
    # Every protocol door asks the core, never the registry behind it, so what "ready" or
    # "known" means is decided once for TF Serving's and V2's gRPC and REST alike.

    def resolve(self, model: str, version: int | None, label: str | None) -> Servable:
        """The served version a request names (NOT_FOUND / INVALID_ARGUMENT as TF Serving)."""
        return self.registry.resolve(model, version, label)

    def ready(self) -> bool:
        """Whether every configured model has a version loaded (grpc.health's SERVING)."""
        return self.registry.any_available()

    def knows_model(self, model: str) -> bool:
        """Whether `model` is a configured model, loaded or not."""
        return model in self.registry.model_names()

    def version_states(self, model: str, version: int | None = None) -> list:
        """(version, VersionStatus) of each known version of `model` (or one), newest first.

        NOT_FOUND for an unknown model or version, as TF Serving's GetModelStatus.
        """
        return self.registry.status(model, version)

    def available_versions(self, model: str) -> list[int]:
        """The versions of `model` that answer requests now, newest first."""
        return [number for number, status in self.version_states(model)
                if status.state == VersionState.AVAILABLE]

    def configured_base_paths(self) -> set[Path]:
        """The base paths of the models configured now, resolved (reload's default roots)."""
        return {Path(m.base_path).resolve() for m in self.registry.configs()}

    def reload_models(self, models) -> None:
        """Serve `models` (ModelConfigs) instead of the configured ones, without a restart."""
        self.registry.reload_config(models)

    # ---- inference ------------------------------------------------------------------------

    def signature(self, servable: Servable, name: str):
        """The named SignatureDef, FAILED_PRECONDITION when it does not exist (as TF Serving)."""
        name = name or DEFAULT_SIGNATURE
        if name not in servable.signature_defs or not servable.can_run(name):
            raise ServingStatusError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f'Serving signature key "{clip(name)}" not found. Available signatures: '
                f"{sorted(n for n in servable.signature_defs if servable.can_run(n))}",
            )
        return servable.signature_defs[name]

    def infer(self, request: InferRequest, timeout_s: float | None = None,
              dialect: Dialect = TF_SERVING) -> InferResponse:
        """Resolve, check every declared input once, build the arrays, run, return outputs."""
        servable = request.servable or self.resolve(request.model, request.version,
                                                    request.label)
        sig_name = request.signature or DEFAULT_SIGNATURE
        sig = self.signature(servable, sig_name)
        aliases = _output_aliases(request.outputs, sig)
        arrays = self._checked_inputs(request.inputs, sig, dialect)
        outputs = self.run(servable, sig_name, arrays, timeout_s)
        return InferResponse(servable, sig_name, {alias: outputs[alias] for alias in aliases})

    def _checked_inputs(self, inputs: Sequence[InferInput], sig,
                        dialect: Dialect) -> dict[str, np.ndarray]:
        """Names, dtypes, shapes (unless the graph decides), rows and bytes; then build."""
        sent, expected = {i.name for i in inputs}, set(sig.inputs)
        if sent != expected or len(inputs) != len(sent):
            raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                     dialect.inputs_text(sent, expected))
        budget, strings = self.limits.max_bytes, 0
        for item in sorted(inputs, key=lambda i: i.name):
            info = sig.inputs[item.name]
            declared = item.declare(info.dtype)
            dtypes.check_against_signature(item.name, declared.dtype, declared.shape, info,
                                            self.limits.max_rows, dialect.type_name,
                                            shapes=not dialect.graph_shapes)
            if declared.dtype == dtypes.types_pb2.DT_STRING:
                strings += math.prod(declared.shape)
                self._check_strings(item.name, declared, strings)
            budget -= declared.nbytes
            if budget < 0:
                raise ServingStatusError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the inputs of this request would decode to more than "
                    f"{self.limits.max_bytes} bytes (--max-message-bytes)")
        return {item.name: item.build() for item in inputs}

    def _check_strings(self, name: str, declared: Declared, strings_so_far: int) -> None:
        """Bytes per string and strings per request, the operator's limits (INVALID_ARGUMENT).

        INVALID_ARGUMENT, as for too many rows: the request itself is what must change, and
        retrying it as it is cannot succeed.
        """
        limits = self.limits
        if limits.max_strings and strings_so_far > limits.max_strings:
            raise ServingStatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the string inputs of this request hold {strings_so_far} or more strings; "
                f"this server takes at most {limits.max_strings} per request "
                "(--max-strings-per-request)")
        longest = declared.longest_string() if limits.max_string_bytes else 0
        if longest > limits.max_string_bytes:
            raise ServingStatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"input '{clip(name)}' holds a string of {longest} bytes; this server takes at "
                f"most {limits.max_string_bytes} bytes per string (--max-string-bytes)")

    def run(self, servable: Servable, sig_name: str, inputs: dict, timeout_s) -> dict:
        """Run a signature on checked arrays; a failing op is the caller's INVALID_ARGUMENT.

        A text model's request is first held to its tokens (`tokens.py`), then runs by length
        bucket, a large one in slices of rows.
        """
        cost = tokens.request_tokens(servable, inputs)
        if cost is not None:
            tokens.check_tokens(cost, self.limits.max_tokens)
            parts = tokens.row_parts(cost, self.limits.slice_tokens)
            if len(parts) > 1:
                return tokens.run_in_parts(
                    lambda part, left: self._run_once(servable, sig_name, part, left),
                    inputs, parts, timeout_s, servable.signature_defs[sig_name])
        return self._run_once(servable, sig_name, inputs, timeout_s)

    def _run_once(self, servable: Servable, sig_name: str, inputs: dict, timeout_s) -> dict:
        try:
            return self.runner(servable, sig_name, inputs, timeout_s)
        except ServingStatusError:
            raise
        except FuturesTimeout as e:  # the batch did not run within the caller's deadline
            raise ServingStatusError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                     "Deadline exceeded while waiting for a batch") from e
        except Exception as e:  # an op failing on valid-looking data is the caller's input
            import tensorflow as tf

            if isinstance(e, (tf.errors.InvalidArgumentError, ValueError, TypeError)):
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT, op_error_text(e)
                ) from e
            raise

    def metric_labels(self, record: CallRecord) -> tuple[str, str]:
        """(model, version) labels of a call: only configured names and known versions.

        Anything else a client sends collapses to one value, so labels cannot grow without
        bound. `record.answered` is the version that answered, when one did.
        """
        if record.model is None:
            return "", ""
        if not self.knows_model(record.model):
            return (UNKNOWN_LABEL if record.model else ""), ""
        if record.answered:
            return record.model, record.answered
        if record.version is not None and self.registry.knows_version(record.model,
                                                                      record.version):
            return record.model, str(record.version)
        asked = record.version is not None or record.label is not None
        return record.model, UNKNOWN_LABEL if asked else ""


def _output_aliases(asked: Sequence[str], sig) -> list[str]:
    """The outputs to answer, in order: the ones asked (each once, each real), else all."""
    if not asked:
        return sorted(sig.outputs)
    seen: set[str] = set()
    for alias in asked:
        if alias not in sig.outputs:
            raise ServingStatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"output tensor alias not found in signature: {clip(alias)} Outputs "
                f"expected to be in the set {{{','.join(sorted(sig.outputs))}}}.",
            )
        if alias in seen:
            raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"duplicate output tensor alias: {clip(alias)}")
        seen.add(alias)
    return list(asked)


@dataclasses.dataclass
class CallRecord:
    """What a transport learns of one call for the metrics, filled in as the call goes.

    `method`: the label ("Predict", "ModelInfer"; "" = not counted); `model`, `version`,
    `label`: what the request named (None: no model named at all); `answered`: the version
    that answered, when one did.
    """

    method: str = ""
    model: str | None = None
    version: int | None = None
    label: str | None = None
    answered: str = ""
    code: grpc.StatusCode = grpc.StatusCode.OK

    def names(self, model: str, version: int | None = None, label: str | None = None) -> None:
        """Record what the request named."""
        self.model, self.version, self.label = model, version, label


class CallObserver:
    """The one call wrapper of every transport (gRPC, REST, V2): code, labels, seconds.

    Every transport labels a call by the version that *answered* it (a request for the latest
    version counts under the number that ran), so REST and gRPC report the same series.
    """

    def __init__(self, core: InferenceCore, observe: Observer | None) -> None:
        self.core = core
        self.observe = observe

    @contextlib.contextmanager
    def call(self, method: str = "") -> Iterator[CallRecord]:
        """Time the block; a ServingStatusError's code (INTERNAL for others) is recorded."""
        record, started = CallRecord(method), time.perf_counter()
        try:
            yield record
        except ServingStatusError as e:
            record.code = e.code
            raise
        except Exception:
            record.code = grpc.StatusCode.INTERNAL
            raise
        finally:
            if self.observe is not None and record.method:
                model, version = self.core.metric_labels(record)
                self.observe(model, version, record.method, record.code,
                             time.perf_counter() - started)


def _names(names) -> str:
    """A set of client-sent names for an error message: at most 10, each clipped."""
    ordered = sorted(names)
    shown = ",".join(clip(n, 64) for n in ordered[:10])
    more = f",...({len(ordered) - 10} more)" if len(ordered) > 10 else ""
    return f"{{{shown}{more}}}"


# "Detected at node N defined at (most recent call last):" then the Python stack and a blank
# line, or, for a loaded SavedModel, "<stack traces unavailable>" and one newline.
_TF_TRACE = re.compile(r"Detected at node .*? defined at \(most recent call last\):\n"
                       r"(?:<stack traces unavailable>\n|.*?\n\n)", re.DOTALL)


def op_error_text(error: Exception) -> str:
    """A TensorFlow/Python error as a client may see it.

    The error itself, without the Python stack TensorFlow appends and without any file-system
    path of the server.
    """
    text = getattr(error, "message", None) or str(error)
    text = _TF_TRACE.sub("", text).replace("Graph execution error:\n\n", "")
    return clip(f"{type(error).__name__}: {scrub_paths(text.strip())}", 900)
