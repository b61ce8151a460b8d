"""TF Serving's REST API client: `ampflow_client.RestClient` with ampflow's errors.

The calls of `PredictionClient` that `ampflow predict` needs, with the same results; TF
Serving's `{"error": ...}` answers become `RpcError`s whose code is the gRPC code of the HTTP
status. The HTTP side (standard library `http.client`, TLS, kept-alive connection) lives in the
TensorFlow-free `ampflow-client` distribution (clients/python).
"""

from __future__ import annotations

import ampflow_client

from ampflow.serving.client import AmpflowCalls, ampflow_errors, image_examples
from ampflow.serving.model_format import CLASSIFY_SIGNATURE, DEFAULT_SIGNATURE


class RestClient(AmpflowCalls, ampflow_client.RestClient):
    """TF Serving's REST API client (real or `ampflow serve --rest-api-port`), stdlib HTTP only.

    It has the calls of `PredictionClient` that `ampflow predict` needs.

    Errors are `RpcError`s whose code is the gRPC code of TF Serving's HTTP status.
    """

    def __init__(self, address: str, **kwargs) -> None:
        with ampflow_errors():
            super().__init__(address, **kwargs)

    def call(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One HTTP call; JSON in and out; TF Serving's `{"error"}` becomes an RpcError."""
        with ampflow_errors():
            return super().call(method, path, payload)

    def signature(self, model: str, version: int | None = None,
                  signature: str = DEFAULT_SIGNATURE):
        """One SignatureDef of the model, from metadata; a clear error when it is absent.

        The base class's lookup, so a pinned version's metadata is asked for once (one GET
        per predict before, 2.3x a gRPC Predict's time in the serving benchmark).
        """
        with ampflow_errors():
            return super().signature(model, version, signature)

    def predict(self, model: str, images, version: int | None = None,
                signature: str = DEFAULT_SIGNATURE, **kwargs):
        """POST :predict in columnar form (`inputs`); outputs as numpy arrays.

        Bytes (a list of `bytes`, e.g. encoded images) go as TF Serving's `{"b64": ...}`.
        """
        with ampflow_errors():
            return super().predict(model, images, version, signature, **kwargs)

    def classify(self, model: str, images, version: int | None = None,
                 signature: str = CLASSIFY_SIGNATURE, **kwargs):
        """POST :classify with images as `image` float features (or tf.Examples)."""
        with ampflow_errors():
            return super().classify(model, image_examples(images), version, signature,
                                    **kwargs)
