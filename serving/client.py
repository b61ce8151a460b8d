"""A small gRPC client for TF Serving (real or `ampflow serve`): one channel, deadlines, retries.

Every call has a deadline; only UNAVAILABLE (server starting, reloading, a dropped
connection) is retried, a bounded number of times with exponential backoff and `attempt i/N`
in the log. Input keys, dtypes and shapes come from GetModelMetadata, never from constants.
`RestClient` (rest_client.py) offers the same calls over TF Serving's REST API; `load_images`
and `top_k` turn files into a batch and probabilities into rows for `ampflow predict`, and
`read_encoded_images` reads image files as they are, for a string input such as the
`image_bytes` signature's (the server decodes them as training did).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from ampflow.errors import ConfigError, ServingError
from ampflow.serving.model_format import (
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    ENCODED_IMAGE_MAGIC,
    encoded_image_format,
    image_example,
)

log = logging.getLogger(__name__)

STATE_NAMES = {0: "UNKNOWN", 10: "START", 20: "LOADING", 30: "AVAILABLE", 40: "UNLOADING",
               50: "END"}
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class RpcError(ServingError):
    """A gRPC call failed; `code` is the gRPC status code the server returned."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method} failed with {code.name}: {details}")
        self.code = code
        self.details = details


@dataclasses.dataclass(frozen=True)
class PredictResult:
    """Outputs of one Predict call and the version that answered it."""

    outputs: dict[str, np.ndarray]
    version: int
    signature: str


@dataclasses.dataclass(frozen=True)
class ClassifyResult:
    """Per example, the (label, score) pairs of one Classify call, and the version."""

    classes: list[list[tuple[str, float]]]
    version: int


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One signature input or output as GetModelMetadata describes it."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int, ...] | None


class SignatureLookups:
    """What both clients derive from `metadata()`: one signature, and its input specs."""

    def metadata(self, model: str, version: int | None = None) -> dict:
        raise NotImplementedError

    def signature(self, model: str, version: int | None = None,
                  signature: str = DEFAULT_SIGNATURE):
        """One SignatureDef of the model, from metadata; a clear error when it is absent."""
        sigs = self.metadata(model, version)
        if signature not in sigs:
            raise ServingError(f"signature {signature!r} not found in model {model!r}. "
                               f"Available: {sorted(sigs)}")
        return sigs[signature]

    def input_specs(self, model: str, version: int | None = None,
                    signature: str = DEFAULT_SIGNATURE) -> dict[str, TensorSpec]:
        """Input name -> dtype/shape of a signature, from metadata."""
        sig = self.signature(model, version, signature)
        return {n: tensor_spec(n, i) for n, i in sig.inputs.items()}


class PredictionClient(SignatureLookups):
    """TF Serving client over one channel; use as a context manager or call `close()`."""

    def __init__(self, address: str, *, timeout_s: float = 10.0, retries: int = 3,
                 backoff_s: float = 0.2, tls_ca: str | Path | None = None,
                 tls_cert: str | Path | None = None, tls_key: str | Path | None = None,
                 tls_server_name: str | None = None,
                 max_message_bytes: int = 64 * 1024 * 1024) -> None:
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0. Received: timeout_s={timeout_s}")
        if retries < 0:
            raise ConfigError(f"retries must be >= 0. Received: retries={retries}")
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("tls_cert and tls_key must be given together. Received: "
                              f"tls_cert={tls_cert}, tls_key={tls_key}")
        self.address = address
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls_ca is None and tls_cert is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca), private_key=_read(tls_key),
                certificate_chain=_read(tls_cert))
            self._channel = grpc.secure_channel(address, creds, options=options)
        self._predict = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._model = model_service_pb2_grpc.ModelServiceStub(self._channel)
        self._inputs_cache: dict[tuple, dict[str, TensorSpec]] = {}

    def __enter__(self) -> PredictionClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    # ---- transport ----------------------------------------------------------------------

    def _call(self, method: str, fn, request, timeout_s: float | None = None):
        """One RPC with a deadline; UNAVAILABLE is retried `retries` times with backoff."""
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return fn(request, timeout=timeout_s or self.timeout_s)
            except grpc.RpcError as e:
                code = e.code()
                if code not in _RETRYABLE or attempt == attempts:
                    raise RpcError(method, code, e.details() or "") from e
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning("%s to %s: %s, attempt %d/%d, retrying in %.2fs", method,
                            self.address, code.name, attempt, attempts, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- API ----------------------------------------------------------------------------

    def status(self, model: str, version: int | None = None) -> list[dict]:
        """GetModelStatus as plain dicts: version, state (name), error_code, error_message."""
        request = get_model_status_pb2.GetModelStatusRequest()
        _set_spec(request.model_spec, model, version)
        response = self._call("GetModelStatus", self._model.GetModelStatus, request)
        return [{"version": s.version, "state": STATE_NAMES.get(s.state, str(s.state)),
                 "error_code": s.status.error_code, "error_message": s.status.error_message}
                for s in response.model_version_status]

    def wait_until_available(self, model: str, timeout: float = 60.0,
                             version: int | None = None) -> int:
        """Poll GetModelStatus until a version is AVAILABLE; returns the highest such version."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            request = get_model_status_pb2.GetModelStatusRequest()
            _set_spec(request.model_spec, model, version)
            try:
                response = self._model.GetModelStatus(
                    request, timeout=max(0.1, min(self.timeout_s, deadline - time.monotonic())))
                ready = [s.version for s in response.model_version_status if s.state == 30]
                if ready:
                    return max(ready)
                last = str([(s.version, STATE_NAMES.get(s.state)) for s in
                            response.model_version_status])
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
            time.sleep(0.1)
        raise ServingError(f"model {model!r} at {self.address} was not AVAILABLE within "
                           f"{timeout:.0f}s. Last status: {last}")

    def metadata(self, model: str, version: int | None = None) -> dict:
        """GetModelMetadata: signature name -> SignatureDef proto."""
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        _set_spec(request.model_spec, model, version)
        request.metadata_field.append("signature_def")
        response = self._call("GetModelMetadata", self._predict.GetModelMetadata, request)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(sig_map)
        return dict(sig_map.signature_def)

    def input_specs(self, model: str, version: int | None = None,
                    signature: str = DEFAULT_SIGNATURE) -> dict[str, TensorSpec]:
        """Input name -> dtype/shape of a signature, from metadata (cached per version)."""
        key = (model, version, signature)
        if key not in self._inputs_cache:
            self._inputs_cache[key] = super().input_specs(model, version, signature)
        return self._inputs_cache[key]

    def predict(self, model: str, images, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, *, version_label: str | None = None,
                output_filter: Sequence[str] = (), timeout_s: float | None = None
                ) -> PredictResult:
        """Predict; `images` is one array (single-input signature) or a dict name -> array.

        A string input takes a list of `bytes` (e.g. `read_encoded_images` for `image_bytes`).
        """
        import tensorflow as tf

        request = predict_pb2.PredictRequest()
        _set_spec(request.model_spec, model, version, version_label)
        request.model_spec.signature_name = signature
        inputs = images if isinstance(images, dict) else self._single_input(
            model, version, signature, images)
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(as_array(value)))
        request.output_filter.extend(output_filter)
        response = self._call("Predict", self._predict.Predict, request, timeout_s)
        outputs = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
        return PredictResult(outputs, response.model_spec.version.value, signature)

    def _single_input(self, model, version, signature, array) -> dict[str, np.ndarray]:
        specs = self.input_specs(model, version, signature)
        if len(specs) != 1:
            raise ServingError(f"signature {signature!r} has inputs {sorted(specs)}; pass a dict "
                               "of arrays keyed by input name")
        (spec,) = specs.values()
        array = as_array(array)
        if spec.dtype is not None and array.dtype != spec.dtype:
            if spec.dtype.kind not in "biuf" or array.dtype.kind not in "biuf":
                raise ConfigError(
                    f"signature {signature!r} input {spec.name!r} takes {spec.dtype.name}. "
                    f"Received: an array of {array.dtype.name} (a string input takes a list "
                    "of bytes, e.g. read_encoded_images(files) for image_bytes; a classify "
                    "signature takes serialized tf.Examples: use classify())")
            array = array.astype(spec.dtype)
        return {spec.name: array}

    def classify(self, model: str, examples, version: int | None = None,
                 signature: str = CLASSIFY_SIGNATURE, *, version_label: str | None = None,
                 timeout_s: float | None = None) -> ClassifyResult:
        """Classify `tf.train.Example`s (or images, turned into `image` float_list Examples)."""
        request = classification_pb2.ClassificationRequest()
        _set_spec(request.model_spec, model, version, version_label)
        request.model_spec.signature_name = signature
        if isinstance(examples, np.ndarray):
            examples = [image_example(image) for image in examples]
        request.input.example_list.examples.extend(examples)
        response = self._call("Classify", self._predict.Classify, request, timeout_s)
        classes = [[(c.label, c.score) for c in row.classes]
                   for row in response.result.classifications]
        return ClassifyResult(classes, response.model_spec.version.value)

    def reload_config(self, config_text: str) -> None:
        """HandleReloadConfigRequest with a ModelServerConfig text proto (labels, models)."""
        from google.protobuf import text_format

        request = model_management_pb2.ReloadConfigRequest()
        text_format.Parse(config_text, request.config)
        response = self._call("HandleReloadConfigRequest",
                              self._model.HandleReloadConfigRequest, request)
        if response.status.error_code:
            code = next((c for c in grpc.StatusCode if c.value[0] == response.status.error_code),
                        grpc.StatusCode.UNKNOWN)
            raise RpcError("HandleReloadConfigRequest", code, response.status.error_message)


def as_array(value) -> np.ndarray:
    """`value` as a numpy array; a list of `bytes` as an object array, so no byte is lost.

    (`np.asarray` would make fixed-width `bytes_`, which drops trailing NUL bytes: a BMP's
    padding, say.)
    """
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (bytes, bytearray)) for v in value):
        array = np.empty(len(value), dtype=object)
        array[:] = [bytes(v) for v in value]
        return array
    return np.asarray(value)


def _set_spec(spec, model: str, version: int | None, label: str | None = None) -> None:
    spec.name = model
    if version is not None and label:
        raise ConfigError(f"give a version or a version label, not both. Received: "
                          f"version={version}, version_label={label!r}")
    if version is not None:
        spec.version.value = int(version)
    elif label:
        spec.version_label = label


def tensor_spec(name: str, info) -> TensorSpec:
    """A signature TensorInfo as a `TensorSpec` (dtype None when numpy has no such type)."""
    import tensorflow as tf

    try:
        dtype = np.dtype(tf.dtypes.as_dtype(info.dtype).as_numpy_dtype)
    except TypeError:
        dtype = None
    shape = None if info.tensor_shape.unknown_rank else tuple(
        d.size for d in info.tensor_shape.dim)
    return TensorSpec(name, dtype, shape)


def _read(path: str | Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"TLS file must be readable. Received: {path} ({e.strerror})") from e


def read_encoded_images(paths: Sequence[str | Path]) -> list[bytes]:
    """Image files' bytes as they are (JPEG/PNG/BMP/GIF, told by content, not by name)."""
    files = []
    for path in paths:
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"input file must be readable. Received: {path} "
                              f"({e.strerror})") from e
        if encoded_image_format(data) is None:
            raise ConfigError(f"input must be an image file ({'/'.join(ENCODED_IMAGE_MAGIC)} by "
                              f"content) to send as encoded bytes. Received: {path}")
        files.append(data)
    return files


def is_image_file(path: str | Path) -> bool:
    """Whether `path` is a file that starts like a JPEG/PNG/BMP/GIF image."""
    try:
        with open(path, "rb") as f:
            return encoded_image_format(f.read(16)) is not None
    except OSError:
        return False


def load_images(paths: Sequence[str | Path], shape: tuple[int, ...] | None) -> np.ndarray:
    """Files -> one float32 batch: PNG/JPEG (resized to H,W; C channels) or .npy arrays.

    `shape` is the signature's input shape ([-1, H, W, C]); pixel values stay raw 0..255,
    as the model contract (docs/ARTIFACTS.md) expects.
    """
    arrays = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"input file must exist. Received: {path}")
        if path.suffix.lower() == ".npy":
            array = _load_npy(path)
            if shape is not None and array.ndim == len(shape) - 1:
                array = array[None]
        else:
            array = _load_picture(path, shape)[None]
        arrays.append(array)
    shapes = {a.shape[1:] for a in arrays}
    if len(shapes) > 1:
        found = ", ".join(f"{p}: {a.shape[1:]}" for p, a in zip(paths, arrays, strict=True))
        raise ConfigError(f"input files must all hold images of one shape. Received: {found}")
    return np.concatenate(arrays)


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False).astype(np.float32)
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"input must be a readable numeric .npy array. Received: {path} "
                          f"({e})") from e


def _load_picture(path: Path, shape) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(path)
    except (UnidentifiedImageError, OSError) as e:
        raise ConfigError(f"input must be a PNG/JPEG image or .npy file. Received: {path}") from e
    if shape is not None and len(shape) == 4:
        _, h, w, c = shape
        image = image.convert("L" if c == 1 else "RGB")
        if h > 0 and w > 0:
            image = image.resize((w, h))
    array = np.asarray(image, dtype=np.float32)
    return array[..., None] if array.ndim == 2 else array


def top_k(probabilities: np.ndarray, k: int, labels: Sequence[str] | None = None
          ) -> list[list[tuple[int, str, float]]]:
    """Per row, the k best (class id, label, probability), best first."""
    rows = []
    for row in np.atleast_2d(probabilities):
        best = np.argsort(-row, kind="stable")[:k]
        rows.append([(int(i), labels[i] if labels and i < len(labels) else str(int(i)),
                      float(row[i])) for i in best])
    return rows
