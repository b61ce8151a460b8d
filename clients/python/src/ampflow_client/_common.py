"""What the gRPC and REST clients share: results, signature specs, example building."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import numpy as np

from ampflow_client._proto.tensorflow.core.example import example_pb2
from ampflow_client.errors import ConfigError, ServingError
from ampflow_client.tensors import numpy_dtype

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"  # what TF Serving uses when a request names none
CLASSIFY_METHOD = "tensorflow/serving/classify"
# ampflow's model contract (docs/ARTIFACTS.md): the classify signature parses this float_list
# feature (the raw pixels) and answers `classes`, every class name in class-id order
IMAGE_FEATURE = "image"
CLASSES_OUTPUT = "classes"
# ampflow's text contract (docs/ARTIFACTS.md): a text model's predict signature takes raw texts
# as a string tensor of this name, [-1]; its classify signature a bytes_list feature of it
TEXT_INPUT = "text"
PREDICT_METHOD = "tensorflow/serving/predict"
# TF Serving's ModelVersionStatus.State numbers
STATE_NAMES = {0: "UNKNOWN", 10: "START", 20: "LOADING", 30: "AVAILABLE", 40: "UNLOADING",
               50: "END"}


@dataclasses.dataclass(frozen=True)
class PredictResult:
    """Outputs of one Predict call, the version that answered and the signature used."""

    outputs: dict[str, np.ndarray]
    version: int
    signature: str


@dataclasses.dataclass(frozen=True)
class ClassifyResult:
    """Per example, the (label, score) pairs of one Classify call, and the version."""

    classes: list[list[tuple[str, float]]]
    version: int


@dataclasses.dataclass(frozen=True)
class RegressResult:
    """Per example, the value of one Regress call, and the version."""

    values: list[float]
    version: int


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One signature input or output as GetModelMetadata describes it."""

    name: str  # the key in the signature (what a request uses)
    dtype: np.dtype | None  # None: a dtype numpy cannot hold
    shape: tuple[int, ...] | None  # None: unknown rank; -1: any size


def tensor_spec(key: str, info) -> TensorSpec:
    """A SignatureDef TensorInfo as a `TensorSpec`."""
    try:
        dtype = numpy_dtype(info.dtype)
    except TypeError:
        dtype = None
    shape = None if info.tensor_shape.unknown_rank else tuple(
        d.size for d in info.tensor_shape.dim)
    return TensorSpec(key, dtype, shape)


class SignatureLookups:
    """What both clients derive from `metadata()`: one signature and its inputs' specs."""

    def metadata(self, model: str, version: int | None = None) -> dict:
        raise NotImplementedError

    def signature_defs(self, model: str, version: int | None = None) -> dict:
        """GetModelMetadata's signatures as this client decodes them (its own proto classes).

        The same as `metadata()` here. ampflow's subclasses convert `metadata()` to
        TensorFlow's classes, which imports TensorFlow (about 3 CPU-s); the specs a request
        needs are read from these instead, so a query never pays for it.
        """
        return self.metadata(model, version)

    def signature(self, model: str, version: int | None = None,
                  signature: str = DEFAULT_SIGNATURE):
        """One SignatureDef of the model; a clear error naming the ones it has if absent.

        A pinned version's signatures are asked for once: a served version never changes
        (TF Serving loads a new number for a new model), so every later call, a REST predict
        reading its input and output specs included, costs no metadata round trip.
        """
        return self._find(self.metadata, model, version, signature)

    def input_specs(self, model: str, version: int | None = None,
                    signature: str = DEFAULT_SIGNATURE) -> dict[str, TensorSpec]:
        """Input key -> dtype/shape of a signature, from metadata."""
        sig = self._find(self.signature_defs, model, version, signature)
        return {k: tensor_spec(k, info) for k, info in sig.inputs.items()}

    def output_specs(self, model: str, version: int | None = None,
                     signature: str = DEFAULT_SIGNATURE) -> dict[str, TensorSpec]:
        """Output key -> dtype/shape of a signature, from metadata."""
        sig = self._find(self.signature_defs, model, version, signature)
        return {k: tensor_spec(k, info) for k, info in sig.outputs.items()}

    def class_names(self, model: str, version: int | None = None) -> list[str] | None:
        """The class names the model ships, in class-id order; None when it ships none.

        An ampflow export keeps them in `assets/labels.txt`, which no serving API returns, and
        answers them from its classify signature (`classes`: every class, in id order, for
        each example), so one Classify of one blank image reads them, from TF Serving and
        `ampflow serve` alike. A model without that signature (a TFLite variant) has none.
        Asked once per pinned version, as its signatures are.
        """
        cache = self.__dict__.setdefault("_class_names", {})
        if version is not None and (model, version) in cache:
            return cache[(model, version)]
        try:
            names = self._ask_class_names(model, version)
        except Exception as e:  # noqa: BLE001 - any client's error: the answer stands, ids only
            log.warning("class names of model %s not read (%s); printing class ids", model,
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
            names = None
        if version is not None:
            cache[(model, version)] = names
        return names

    def _ask_class_names(self, model: str, version: int | None) -> list[str] | None:
        sigs = self.signature_defs(model, version)
        classify = [name for name, sig in sorted(sigs.items())
                    if sig.method_name == CLASSIFY_METHOD and CLASSES_OUTPUT in sig.outputs]
        if classify and text_signature(sigs) is not None:  # a text model: one empty text
            result = self.classify(model, [{TEXT_INPUT: b""}], version, classify[0])
            return [label for label, _score in result.classes[0]] if result.classes else None
        pixels = sigs.get(DEFAULT_SIGNATURE)
        shapes = [tensor_spec(k, info).shape for k, info in pixels.inputs.items()] \
            if pixels is not None else []
        if not classify or len(shapes) != 1 or shapes[0] is None or len(shapes[0]) != 4 \
                or min(shapes[0][1:]) < 1:
            return None
        blank = {IMAGE_FEATURE: np.zeros(int(np.prod(shapes[0][1:])), np.float32)}
        result = self.classify(model, [blank], version, classify[0])
        return [label for label, _score in result.classes[0]] if result.classes else None

    def _find(self, fetch, model: str, version: int | None, signature: str):
        """`signature` from `fetch(model, version)`, pinned versions' answers kept."""
        cache = self.__dict__.setdefault("_pinned_signatures", {})
        key = (fetch.__name__, model, version)
        if version is not None and key in cache:
            sigs = cache[key]
        else:
            sigs = fetch(model, version)
            if version is not None:
                cache[key] = sigs
        if signature not in sigs:
            raise ServingError("GetModelMetadata", _not_found(),
                               f"signature {signature!r} not found in model {model!r}. "
                               f"Available: {sorted(sigs)}")
        return sigs[signature]


def _not_found():
    import grpc

    return grpc.StatusCode.NOT_FOUND


def check_version(version: int | None, label: str | None) -> None:
    """A version or a label, never both (TF Serving refuses the pair)."""
    if version is not None and label:
        raise ConfigError(f"give a version or a version label, not both. Received: "
                          f"version={version}, version_label={label!r}")


def make_example(features: Mapping[str, object]) -> example_pb2.Example:
    """A tf.Example from a dict: floats -> float_list, ints -> int64_list, bytes -> bytes_list.

    A value is a scalar, a sequence or a numpy array (flattened). Strings are UTF-8 encoded.
    """
    example = example_pb2.Example()
    for name, value in features.items():
        feature = example.features.feature[name]
        if isinstance(value, (bytes, str)):
            value = [value]
        array = np.asarray(value) if not isinstance(value, (list, tuple)) or not value or \
            not isinstance(value[0], (bytes, str)) else None
        if array is None:
            feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v
                                            for v in value)
        elif array.dtype.kind == "f":
            feature.float_list.value.extend(array.ravel().astype(np.float32).tolist())
        elif array.dtype.kind in "iub":
            feature.int64_list.value.extend(array.ravel().astype(np.int64).tolist())
        else:
            raise ConfigError(f"feature {name!r} must be floats, ints or bytes. Received: "
                              f"{array.dtype}")
    return example


def examples_of(examples: Sequence) -> list[example_pb2.Example]:
    """Examples as protos of this client: from dicts, serialized bytes or any Example proto."""
    out = []
    for item in examples:
        if isinstance(item, Mapping):
            out.append(make_example(item))
        elif isinstance(item, (bytes, bytearray)):
            out.append(example_pb2.Example.FromString(bytes(item)))
        elif hasattr(item, "SerializeToString"):  # tf.train.Example or ours: same wire
            out.append(example_pb2.Example.FromString(item.SerializeToString()))
        else:
            raise ConfigError("examples must be dicts of features, serialized tf.Examples or "
                              f"Example protos. Received: {type(item).__name__}")
    return out


def takes_text(sig) -> bool:
    """Whether a SignatureDef is a text predict signature: one string input named `text`."""
    from ampflow_client._proto.tensorflow.core.framework import types_pb2

    return (sig.method_name in (PREDICT_METHOD, "") and list(sig.inputs) == [TEXT_INPUT]
            and sig.inputs[TEXT_INPUT].dtype == types_pb2.DT_STRING)


def text_signature(sigs: Mapping) -> str | None:
    """The signature raw texts go to; None for a model that takes no text (an image model).

    `serving_default` when it takes them, else the first (by name) that does.
    """
    if DEFAULT_SIGNATURE in sigs and takes_text(sigs[DEFAULT_SIGNATURE]):
        return DEFAULT_SIGNATURE
    return next((name for name, sig in sorted(sigs.items()) if takes_text(sig)), None)


def read_texts(texts: Sequence[str] = (), text_file: str | None = None) -> list[str | bytes]:
    """The texts of `--text` (as given) and `--text-file` (one per line; blank lines skipped).

    A line that is not UTF-8 stays bytes: a TensorFlow string is bytes, so it is sent as it
    is (gRPC `string_val`, REST `{"b64": ...}`) and the model's tokenizer decides what it
    reads. An unreadable file, or no text at all, is a ConfigError.
    """
    items: list[str | bytes] = list(texts)
    if text_file is not None:
        try:
            with open(text_file, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConfigError(f"text_file must be a readable file. Received: {text_file} "
                              f"({e.strerror})") from e
        for line in data.splitlines():
            if line.strip():
                try:
                    items.append(line.decode("utf-8"))
                except UnicodeDecodeError:
                    items.append(line)
    if not items:
        raise ConfigError(f"give at least one text. Received: no --text and "
                          f"{'no lines in ' + text_file if text_file else 'no --text-file'}")
    return items


def text_label(text: str | bytes, width: int = 40) -> str:
    """A text as `predict` names its row: quoted, clipped to `width` characters."""
    shown = text if isinstance(text, str) else text.decode("utf-8", "backslashreplace")
    shown = " ".join(shown.split())
    return repr(shown if len(shown) <= width else shown[:width - 3] + "...")
