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
from ampflow_client import images as client_images
from ampflow_client._common import (
    STATE_NAMES,
    ClassifyResult,
    PredictResult,
    SignatureLookups,
    TensorSpec,
    takes_text,
    tensor_spec,
    text_label,
    text_signature,
)
from ampflow_client._common import read_texts as _read_texts
from ampflow_client.tensors import as_array

from ampflow.errors import ConfigError, ServingError
from ampflow.serving.model_format import (
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    IMAGE_FEATURE,
)

log = logging.getLogger(__name__)

__all__ = ["STATE_NAMES", "ClassifyResult", "PredictResult", "PredictionClient", "RpcError",
           "SignatureLookups", "TensorSpec", "as_array", "is_image_file", "load_images",
           "read_encoded_images", "read_texts", "takes_text", "tensor_spec", "text_label",
           "text_signature", "top_k"]


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


class AmpflowCalls:
    """What ampflow's gRPC and REST clients add to the client distribution's, once for both.

    (The first base of each.) `status()` rows carry numeric error codes. `metadata()` gives
    TensorFlow's SignatureDef protos, to compare with a SavedModel's; the lookups a request
    needs (`input_specs`, `output_specs`) read `signature_defs()`, the client's own protos, so
    a query (`ampflow predict` included) never imports TensorFlow (about 3 CPU-s) to convert
    them. Every call's errors are ampflow's.
    """

    def status(self, model: str, version: int | None = None) -> list[dict]:
        """GetModelStatus as dicts: version, state (name), error_code (number), error_message."""
        with ampflow_errors():
            rows = super().status(model, version)
        for row in rows:
            row["error_code"] = grpc.StatusCode[row["error_code"]].value[0]
        return rows

    def metadata(self, model: str, version: int | None = None) -> dict:
        """GetModelMetadata: signature name -> TensorFlow's SignatureDef proto."""
        with ampflow_errors():
            return tensorflow_signatures(super().metadata(model, version))

    def signature_defs(self, model: str, version: int | None = None) -> dict:
        """GetModelMetadata's signatures as the client decodes them, without TensorFlow."""
        with ampflow_errors():
            return super().metadata(model, version)

    def input_specs(self, model: str, version: int | None = None,
                    signature: str = DEFAULT_SIGNATURE) -> dict:
        """Input key -> dtype/shape of a signature (a missing one is ampflow's error)."""
        with ampflow_errors():
            return super().input_specs(model, version, signature)

    def output_specs(self, model: str, version: int | None = None,
                     signature: str = DEFAULT_SIGNATURE) -> dict:
        """Output key -> dtype/shape of a signature (a missing one is ampflow's error)."""
        with ampflow_errors():
            return super().output_specs(model, version, signature)


class PredictionClient(AmpflowCalls, ampflow_client.Client):
    """TF Serving client over one channel; use as a context manager or call `close()`."""

    def __init__(self, address: str, **kwargs) -> None:
        self._tf_stub = None
        with ampflow_errors():
            super().__init__(address, **kwargs)

    def wait_until_available(self, model: str, timeout: float = 60.0,
                             version: int | None = None) -> int:
        """Poll GetModelStatus until a version is AVAILABLE; returns the highest such version."""
        try:
            return super().wait_until_available(model, timeout, version)
        except client_errors.ServingError as e:
            raise ServingError(e.message) from e

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
    with ampflow_errors():
        return client_images.read_encoded_images(paths)


def read_texts(texts: Sequence[str] = (), text_file: str | None = None) -> list[str | bytes]:
    """`--text` values and `--text-file` lines (non-UTF-8 lines kept as bytes), ampflow's errors."""
    with ampflow_errors():
        return _read_texts(texts, text_file)


def load_images(paths: Sequence[str | Path], shape: tuple[int, ...] | None) -> np.ndarray:
    """Files -> one float32 batch of raw 0..255 pixels (.npy arrays, or resized pictures)."""
    with ampflow_errors():
        return client_images.load_images(paths, shape)


is_image_file = client_images.is_image_file
top_k = client_images.top_k
