"""ampflow's gRPC client: `ampflow_client.Client` (clients/python) with ampflow's errors.

The wire, the retries (UNAVAILABLE only, bounded, exponential backoff, `attempt i/N` in the
log), deadlines, TLS and numpy <-> TensorProto all come from the TensorFlow-free
`ampflow-client` distribution, so `ampflow predict`, the demo, the deploy canary and the
benchmarks exercise the client applications use. This module keeps ampflow's names and
contracts on top: `RpcError` (an ampflow `ServingError` with the gRPC `code` and `details`),
`ConfigError` for bad arguments, `status()` rows with numeric error codes, and `classify()` of
image arrays. `RestClient` (rest_client.py) does the same over TF Serving's REST API;
`load_images` and `top_k` turn files into a batch and probabilities into rows for
`ampflow predict`, and `read_encoded_images` reads image files as they are, for a string input
such as the `image_bytes` signature's (the server decodes them as training did).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

import ampflow_client
import grpc
import numpy as np
from ampflow_client import errors as client_errors
from ampflow_client._common import (
    STATE_NAMES,
    ClassifyResult,
    PredictResult,
    SignatureLookups,
    TensorSpec,
    tensor_spec,
)
from ampflow_client.tensors import as_array

from ampflow.errors import ConfigError, ServingError
from ampflow.serving.model_format import (
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    ENCODED_IMAGE_MAGIC,
    IMAGE_FEATURE,
    encoded_image_format,
)

log = logging.getLogger(__name__)

__all__ = ["STATE_NAMES", "ClassifyResult", "PredictResult", "PredictionClient", "RpcError",
           "SignatureLookups", "TensorSpec", "as_array", "is_image_file", "load_images",
           "read_encoded_images", "tensor_spec", "top_k"]


class RpcError(ServingError):
    """A call failed; `code` is the gRPC status code the server returned."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method} failed with {code.name}: {details}")
        self.code = code
        self.details = details


@contextlib.contextmanager
def ampflow_errors():
    """The client distribution's errors as ampflow's (the CLI prints those as one line)."""
    try:
        yield
    except client_errors.ServingError as e:
        raise RpcError(e.method, e.code, e.message) from e
    except client_errors.ConfigError as e:
        raise ConfigError(str(e)) from e


def tensorflow_signatures(signatures: dict) -> dict:
    """The client's SignatureDefs as TensorFlow's `meta_graph_pb2.SignatureDef`s.

    Same wire, other classes: the client's protos live in their own descriptor pool, and
    ampflow compares signatures with the SavedModel's (TensorFlow's protos) and passes them on.
    """
    from tensorflow.core.protobuf import meta_graph_pb2

    return {name: meta_graph_pb2.SignatureDef.FromString(sig.SerializeToString())
            for name, sig in signatures.items()}


def image_examples(examples) -> list:
    """Image arrays as the contract's `image` float_list Examples; anything else unchanged."""
    if isinstance(examples, np.ndarray):
        return [{IMAGE_FEATURE: np.asarray(image, dtype=np.float32).ravel()}
                for image in examples]
    return list(examples)


class PredictionClient(ampflow_client.Client):
    """TF Serving client over one channel; use as a context manager or call `close()`."""

    def __init__(self, address: str, **kwargs) -> None:
        self._tf_stub = None
        with ampflow_errors():
            super().__init__(address, **kwargs)

    def status(self, model: str, version: int | None = None) -> list[dict]:
        """GetModelStatus as dicts: version, state (name), error_code (number), error_message."""
        with ampflow_errors():
            rows = super().status(model, version)
        for row in rows:
            row["error_code"] = grpc.StatusCode[row["error_code"]].value[0]
        return rows

    def wait_until_available(self, model: str, timeout: float = 60.0,
                             version: int | None = None) -> int:
        """Poll GetModelStatus until a version is AVAILABLE; returns the highest such version."""
        try:
            return super().wait_until_available(model, timeout, version)
        except client_errors.ServingError as e:
            raise ServingError(e.message) from e

    def metadata(self, model: str, version: int | None = None) -> dict:
        """GetModelMetadata: signature name -> TensorFlow's SignatureDef proto."""
        with ampflow_errors():
            return tensorflow_signatures(super().metadata(model, version))

    def signature(self, model: str, version: int | None = None,
                  signature: str = DEFAULT_SIGNATURE):
        """One SignatureDef of the model, from metadata; a clear error when it is absent."""
        sigs = self.metadata(model, version)
        if signature not in sigs:
            raise ServingError(f"signature {signature!r} not found in model {model!r}. "
                               f"Available: {sorted(sigs)}")
        return sigs[signature]

    def predict(self, model: str, images, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, **kwargs) -> PredictResult:
        """Predict; `images` is one array (single-input signature) or a dict name -> array.

        A string input takes a list of `bytes` (e.g. `read_encoded_images` for `image_bytes`).
        """
        with ampflow_errors():
            return super().predict(model, images, version, signature, **kwargs)

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

    @property
    def _predict(self):
        """tensorflow-serving-api's PredictionService stub on this channel.

        For hand-built TensorFlow requests (the hostile-input tests).
        """
        if self._tf_stub is None:
            from tensorflow_serving.apis import prediction_service_pb2_grpc

            self._tf_stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        return self._tf_stub

    def classify(self, model: str, examples, version: int | None = None,
                 signature: str = CLASSIFY_SIGNATURE, **kwargs) -> ClassifyResult:
        """Classify `tf.train.Example`s (or images, turned into `image` float_list Examples)."""
        with ampflow_errors():
            return super().classify(model, image_examples(examples), version, signature,
                                    **kwargs)

    def regress(self, model: str, examples, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, **kwargs):
        """Regress `tf.train.Example`s."""
        with ampflow_errors():
            return super().regress(model, examples, version, signature, **kwargs)

    def health(self, service: str = "") -> str:
        """The gRPC health service's answer ("SERVING", ...)."""
        with ampflow_errors():
            return super().health(service)

    def reload_config(self, config_text: str) -> None:
        """HandleReloadConfigRequest with a ModelServerConfig text proto (labels, models)."""
        with ampflow_errors():
            super().reload_config(config_text)


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
